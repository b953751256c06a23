"""Kernel roofline on one GPU: collectx's CUDA copy and reduce against the device-to-device copy of
the same run (``cudaMemcpyAsync`` through CuPy; ``cupy.copyto`` shown too), sizes up to 256 MiB.

Bandwidth counts the bytes a kernel moves through memory: a copy reads n and writes n bytes
(2n), a k-ary reduce reads k*n and writes n ((k+1)n). ``frac`` is each kernel's figure over the
memcpy figure at the same size, so 1.0 means "as fast as the copy engine path".

    python perf/gpu_roofline.py --max-bytes 256M --json roofline.json

Prints one JSON line per (kernel, size); needs CuPy and a libcollectx with CUDA objects.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import json
import sys


def parse_bytes(text: str) -> int:
    """``"256M"`` -> 268435456 (K, M, G are powers of two).

    >>> parse_bytes("4K"), parse_bytes("1G")
    (4096, 1073741824)
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def time_us(cp, fn, iters: int) -> float:
    """Mean microseconds of ``fn`` over ``iters`` calls, timed with CUDA events."""
    fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / iters


def kernels(cp, lib, ffi, n_elems: int, k: int):
    """(name, bytes moved, callable) of each kernel measured at one size."""
    nbytes = n_elems * 4
    srcs = [cp.full(n_elems, i + 1, dtype=cp.float32) for i in range(k)]
    dst = cp.empty(n_elems, dtype=cp.float32)
    stream = ffi.cast("void*", cp.cuda.get_current_stream().ptr)
    ptrs = ffi.new("void*[]", [ffi.cast("void*", s.data.ptr) for s in srcs])
    d = ffi.cast("void*", dst.data.ptr)

    def cx_copy():
        assert lib.cx_cuda_copy(d, ptrs[0], nbytes, stream) == 0

    def cx_reduce():
        assert lib.cx_cuda_reduce(d, ptrs, k, n_elems, 6, 0, stream) == 0

    rt, src0 = cp.cuda.runtime, srcs[0].data.ptr

    def memcpy():
        rt.memcpyAsync(dst.data.ptr, src0, nbytes, rt.memcpyDeviceToDevice,
                       cp.cuda.get_current_stream().ptr)

    return [("memcpy", 2 * nbytes, memcpy),
            ("cupy_copyto", 2 * nbytes, lambda: cp.copyto(dst, srcs[0])),
            ("cx_copy", 2 * nbytes, cx_copy),
            (f"cx_reduce_sum_k{k}", (k + 1) * nbytes, cx_reduce)]


def sweep(min_bytes: int, max_bytes: int, k: int, iters: int):
    import cupy as cp
    from collectx import _native
    ffi, lib, _ = _native.load()
    if not _native.build_info()["cuda_objects"]:
        raise SystemExit("libcollectx has no CUDA objects: rebuild with nvcc on PATH")
    size = min_bytes
    while size <= max_bytes:
        base = None
        for name, moved, fn in kernels(cp, lib, ffi, max(1, size // 4), k):
            us = time_us(cp, fn, iters if size < (64 << 20) else max(3, iters // 4))
            gbps = moved / us / 1e3
            base = gbps if name == "memcpy" else base
            yield {"kernel": name, "bytes": size, "us": round(us, 2), "GBps": round(gbps, 1),
                   "frac": round(gbps / base, 3)}
        cp.get_default_memory_pool().free_all_blocks()
        size *= 4


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-bytes", default="1M")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--sources", type=int, default=2, help="k of the k-ary reduce (default 2)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", default=None, help="also write all rows to this file")
    a = p.parse_args(argv)
    rows = []
    for row in sweep(parse_bytes(a.min_bytes), parse_bytes(a.max_bytes), a.sources, a.iters):
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
