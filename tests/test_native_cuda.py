"""CUDA copy/reduce kernels against the CPU kernels (same functors, so results must be equal).

Needs a CUDA device and torch built with CUDA (device memory and streams); skipped otherwise.
"""

import numpy as np
import pytest

import _needs as needs

from collectx import _native as nat

pytestmark = pytest.mark.gpu


def _torch_cuda():
    torch = needs.module("torch")
    if not torch.cuda.is_available() or not nat.cuda_available():
        pytest.skip("no CUDA device visible to torch and libcollectx")
    return torch


def _to_device(torch, a: np.ndarray, shift: int):
    """Copy a's bytes to the GPU, `shift` elements past a fresh allocation (16-byte aligned),
    so shift > 0 exercises the unaligned scalar path. Returns (allocation, view)."""
    skip = shift * a.itemsize
    base = torch.empty(a.nbytes + skip, dtype=torch.uint8, device="cuda")
    view = base[skip:]
    view.copy_(torch.from_numpy(a.reshape(-1).view(np.uint8)))
    return base, view


def _values(rng, n: int, dtype: str) -> np.ndarray:
    """n finite values of dtype; bfloat16 as its bit patterns (uint16), truncated from float32."""
    f = (rng.standard_normal(n) * 20).astype(np.float32)
    if dtype == "bfloat16":
        return (f.view(np.uint32) >> 16).astype(np.uint16)
    return f.astype(dtype)


@pytest.mark.parametrize("shift", (0, 1))
@pytest.mark.parametrize("dtype", ("int8", "uint8", "int32", "int64", "float16", "bfloat16",
                                   "float32", "float64"))
def test_cuda_reduce_equals_cpu(dtype, shift):
    torch = _torch_cuda()
    ffi, lib = nat.ffi, nat.lib
    rng = np.random.default_rng(5)
    for k in (1, 2, 3, 8):
        for n in (1, 7, 4099, (1 << 20) + 1):
            srcs = [_values(rng, n, dtype) for _ in range(k)]
            for op in ("sum", "prod", "min", "max"):
                expected = np.empty_like(srcs[0])
                nat.reduce(expected, srcs, op, dtype="bfloat16" if dtype == "bfloat16" else None)
                dev = [_to_device(torch, s, shift) for s in srcs]
                out_base, out = _to_device(torch, np.zeros_like(srcs[0]), shift)
                ptrs = ffi.new("void *[]", [ffi.cast("void *", v.data_ptr()) for _, v in dev])
                stream = ffi.cast("void *", torch.cuda.current_stream().cuda_stream)
                rc = lib.cx_cuda_reduce(ffi.cast("void *", out.data_ptr()), ptrs, k, n,
                                        nat.DTYPES[dtype], nat.OPS[op], stream)
                nat.check_rc(rc, "cx_cuda_reduce")
                torch.cuda.synchronize()
                got = out.cpu().numpy().view(expected.dtype)  # bytes back to elements
                np.testing.assert_array_equal(got, expected, err_msg=f"k={k} n={n} op={op}")


def test_cuda_copy_odd_sizes_and_offsets():
    torch = _torch_cuda()
    ffi, lib = nat.ffi, nat.lib
    for nbytes in (1, 15, 16, 17, 4099, (1 << 22) + 3):
        src = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
        for shift in (0, 3):
            _, s = _to_device(torch, src, shift)
            _, d = _to_device(torch, np.zeros_like(src), shift)
            stream = ffi.cast("void *", torch.cuda.current_stream().cuda_stream)
            nat.check_rc(lib.cx_cuda_copy(ffi.cast("void *", d.data_ptr()),
                                          ffi.cast("void *", s.data_ptr()), nbytes, stream))
            torch.cuda.synchronize()
            np.testing.assert_array_equal(d.cpu().numpy(), src)


def test_cuda_reduce_rejects_too_many_sources():
    _torch_cuda()
    ffi, lib = nat.ffi, nat.lib
    srcs = ffi.new("void *[]", lib.CX_MAX_CUDA_SRCS + 1)
    rc = lib.cx_cuda_reduce(ffi.NULL, srcs, lib.CX_MAX_CUDA_SRCS + 1, 4, lib.CX_FLOAT32,
                            lib.CX_SUM, ffi.NULL)
    assert rc == lib.CX_ERR_ARG
