"""Device buffers the CUDA communicator accepts, zero-copy: torch CUDA tensors and any object with
``__cuda_array_interface__`` (CuPy, Numba, ...), each seen as (pointer, count, dtype code, stream).

The stream is where the caller's work on the buffer is ordered: for torch the current stream of
the tensor's device, for CUDA Array Interface v3 the exporter's ``stream`` entry (1 and 2 are the
legacy and per-thread default streams, whose handles have those very values; absent means the
legacy default stream).

>>> class Fake:  # a minimal CUDA Array Interface v3 exporter
...     __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (1 << 20, False),
...                                 "version": 3, "strides": None, "stream": 7}
>>> b = as_device_buffer(Fake(), "x")
>>> b.ptr, b.count, b.code, b.itemsize, b.stream
(1048576, 4, 6, 4, 7)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ArgumentError, DTypeError
from ..arrays import DTYPE_CODES

_TORCH_NAMES = {"torch.int8": "int8", "torch.uint8": "uint8", "torch.int32": "int32",
                "torch.int64": "int64", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
                "torch.float32": "float32", "torch.float64": "float64"}
LEGACY_STREAM = 0


@dataclass(frozen=True, slots=True)
class DeviceBuffer:
    """A contiguous device buffer: address, element count, cx_dtype code, item size, the
    stream its producer orders work on, its device (-1 if unknown) and its kind."""
    ptr: int
    count: int
    code: int
    itemsize: int
    stream: int
    device: int
    kind: str          # "torch" or "cai"

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize


def as_device_buffer(x, what: str, writable: bool = False) -> DeviceBuffer:
    """``x`` as a :class:`DeviceBuffer` (no copy).

    Raises
    ------
    ArgumentError
        Host memory, non-contiguous or read-only (``writable``) buffers, unknown objects.
    DTypeError
        A dtype outside int8, uint8, int32, int64, float16, bfloat16, float32, float64.
    """
    if type(x).__module__.startswith("torch"):
        return _from_torch(x, what)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise ArgumentError(f"{what}: got {type(x).__name__}; expected a CUDA device array (a "
                            f"torch CUDA tensor or an object with __cuda_array_interface__ such "
                            f"as a CuPy array); host arrays go to the CPU communicator")
    return _from_cai(cai, what, writable)


_TORCH_CODES: dict = {}   # torch dtype -> cx_dtype code, filled as dtypes are seen


def _from_torch(t, what: str) -> DeviceBuffer:
    # Every call parses its tensors, so this takes the cheapest accessors: a Python-level
    # microsecond here is one per rank and call, and thread ranks take turns at the GIL.
    if not t.is_cuda:
        raise ArgumentError(f"{what}: tensor on {t.device}; the CUDA communicator takes CUDA "
                            f"tensors (use collectx.init() for CPU tensors)")
    if not t.is_contiguous():
        raise ArgumentError(f"{what}: got a non-contiguous tensor (strides {t.stride()}); "
                            f"expected a contiguous one; pass x.contiguous()")
    code = _TORCH_CODES.get(t.dtype)
    if code is None:
        name = _TORCH_NAMES.get(str(t.dtype))
        if name is None:
            raise DTypeError(f"{what}: torch dtype {t.dtype} is not supported; expected one of "
                             f"{', '.join(DTYPE_CODES)}")
        code = _TORCH_CODES[t.dtype] = DTYPE_CODES[name]
    device = t.get_device()
    return DeviceBuffer(t.data_ptr(), t.numel(), code, t.element_size(), _torch_stream(device),
                        device, "torch")


def _torch_stream(device: int) -> int:
    """torch's current stream on ``device``, as a raw handle (without making a Stream object
    where this torch has the raw accessor)."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


_CAI_TYPES: dict = {}   # typestr -> (cx_dtype code, item size), filled as typestrs are seen


def _from_cai(cai: dict, what: str, writable: bool) -> DeviceBuffer:
    shape = tuple(int(s) for s in cai["shape"])
    typestr = cai["typestr"]
    known = _CAI_TYPES.get(typestr)
    if known is None:
        known = _CAI_TYPES[typestr] = _cai_type(typestr, what)
    code, itemsize = known
    count = 1
    for n in shape:
        count *= n
    strides = cai.get("strides")
    if strides is not None and count > 1 and tuple(strides) != _c_strides(shape, itemsize):
        raise ArgumentError(f"{what}: got strides {tuple(strides)} for shape {shape}; expected a "
                            f"C-contiguous array; pass cupy.ascontiguousarray(x)")
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise ArgumentError(f"{what}: got a read-only CUDA array; expected a writable one for the "
                            f"result; pass a copy")
    stream = cai.get("stream")
    return DeviceBuffer(int(ptr or 0), count, code, itemsize,
                        LEGACY_STREAM if stream is None else int(stream), -1, "cai")


def _cai_type(typestr, what: str) -> tuple[int, int]:
    """(cx_dtype code, item size) of a CUDA Array Interface typestr, or the error of one."""
    try:
        dtype = np.dtype(typestr)
    except TypeError:
        raise DTypeError(f"{what}: CUDA array typestr {typestr!r} is not a numpy dtype; "
                         f"expected one of {', '.join(DTYPE_CODES)}") from None
    if dtype.name not in DTYPE_CODES:
        raise DTypeError(f"{what}: dtype {dtype.name} is not supported; expected one of "
                         f"{', '.join(DTYPE_CODES)}")
    return DTYPE_CODES[dtype.name], dtype.itemsize


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def empty_like(x, n: int):
    """A fresh device array of ``n`` elements of ``x``'s dtype, framework and device."""
    if type(x).__module__.startswith("torch"):
        import torch
        return torch.empty(n, dtype=x.dtype, device=x.device)
    if type(x).__module__.startswith("cupy"):
        import cupy
        with cupy.cuda.Device(x.device.id):
            return cupy.empty(n, dtype=x.dtype)
    raise ArgumentError(f"cannot allocate a result like a {type(x).__name__}; expected a torch "
                        f"tensor or a CuPy array, or pass out=")
