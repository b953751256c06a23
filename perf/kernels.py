"""CPU reduce kernels of libcollectx against numpy, one table.

Rows: dtype x k x size. ``size`` is the bytes of ONE input array; ``GB/s`` is payload bandwidth,
``k * size / time`` (the bytes of the k inputs, as in a reduction's algorithm bandwidth).
numpy baseline: ``np.add(a, b, out=c)`` for k=2 and the chain ``np.add(c, s, out=c)`` for more
inputs; bfloat16 (which numpy lacks) is compared with float32 numpy on the same element count.
``ratio`` = numpy time / collectx time for the same elements (> 1: collectx is faster).
``cx`` is the public ``collectx._native.reduce``, argument checks included (through the compiled
collectx._fastpath module when it is built: the header's ``fast_path``); ``raw`` is a bare cffi
``cx_reduce`` call with prepared pointers: the kernel plus cffi's call cost (about 0.5-2 us on a
slow core), so at small sizes ``cx`` can beat ``raw``.
Each timing is the median of repeats, numpy and collectx interleaved in the same process.

    python perf/kernels.py                      # the full table, 4 KiB .. 256 MiB
    python perf/kernels.py --max-bytes 16M --dtypes float32
    python perf/kernels.py --clock cpu          # thread CPU time: steadier on a shared machine
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import statistics
import time

import numpy as np

from collectx import _native as nat

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20,
         256 << 20]
NUMPY_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def make_inputs(dtype: str, k: int, nelem: int, rng):
    """(inputs for collectx, inputs for numpy); shared where the dtype is the same."""
    if dtype == "bfloat16":
        theirs = [rng.standard_normal(nelem, dtype=np.float32) for _ in range(k)]
        return [(v.view(np.uint32) >> 16).astype(np.uint16) for v in theirs], theirs
    ours = [rng.standard_normal(nelem, dtype=np.float32).astype(dtype) for _ in range(k)]
    return ours, ours


def row_bytes(dtype: str, k: int, nbytes: int) -> int:
    """Memory one row allocates: inputs (shared unless bfloat16) and both outputs."""
    return 3 * (k + 1) * nbytes if dtype == "bfloat16" else (k + 2) * nbytes


def numpy_chain(out, srcs):
    np.add(srcs[0], srcs[1], out=out)
    for s in srcs[2:]:
        np.add(out, s, out=out)


def reps_for(nbytes_moved: int) -> int:
    # About 50 ms of work per measurement on a ~10 GB/s machine, between 3 and 300 repeats.
    return max(3, min(300, int(0.05 * 10e9 / max(nbytes_moved, 1))))


# "wall" is what a caller waits; "cpu" (this thread's CPU time) leaves out the time the thread
# sat descheduled, which is most of the noise on a machine shared with other jobs.
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def time_interleaved(fns, reps: int, clock=time.perf_counter) -> list[float]:
    """Median seconds of each function, running them in turn so load hits all alike."""
    samples = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = clock()
            fn()
            samples[i].append(clock() - t0)
    return [statistics.median(s) for s in samples]


def bench_row(dtype: str, k: int, nbytes: int, rng, clock=time.perf_counter) -> dict:
    itemsize = 2 if dtype in ("float16", "bfloat16") else 4
    nelem = nbytes // itemsize
    ours, theirs = make_inputs(dtype, k, nelem, rng)
    out, ref_out = np.empty_like(ours[0]), np.empty_like(theirs[0])
    override = "bfloat16" if dtype == "bfloat16" else None
    ffi, lib, _ = nat.load()
    out_buf, src_bufs = ffi.from_buffer(out), [ffi.from_buffer(s) for s in ours]
    code = nat.dtype_code(dtype)
    fns = [lambda: numpy_chain(ref_out, theirs),
           lambda: nat.reduce(out, ours, "sum", dtype=override),
           lambda: lib.cx_reduce(out_buf, src_bufs, k, nelem, code, nat.OPS["sum"])]
    for fn in fns:  # warm up: page faults and caches
        fn()
    t_np, t_cx, t_raw = time_interleaved(fns, reps_for(k * nbytes), clock)
    payload = k * nbytes
    return {"dtype": dtype, "k": k, "bytes": nbytes, "numpy": payload / t_np / 1e9,
            "cx": payload / t_cx / 1e9, "raw": payload / t_raw / 1e9, "ratio": t_np / t_cx,
            "ratio_raw": t_np / t_raw}


def human(nbytes: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--ks", default="2,8")
    ap.add_argument("--min-bytes", default="4K")
    ap.add_argument("--max-bytes", default="256M")
    ap.add_argument("--max-row-gib", type=float, default=4.0,
                    help="skip rows that would allocate more than this (inputs + outputs)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: elapsed time; cpu: this thread's CPU time (steadier under load)")
    args = ap.parse_args(argv)
    lo, hi = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
    info = nat.build_info()
    print(f"collectx {info['version']} kernels, isa={info['isa']}, compiler={info['compiler']}, "
          f"fast_path={info['fast_path']}")
    print(f"GB/s = k * (bytes of one input) / time ({args.clock} clock); "
          f"ratio = numpy time / collectx time")
    print(f"{'dtype':9} {'k':>2} {'size':>8} {'numpy GB/s':>11} {'cx GB/s':>8} {'ratio':>6} "
          f"{'raw GB/s':>9} {'raw ratio':>9}")
    rng = np.random.default_rng(0)
    for dtype in args.dtypes.split(","):
        for k in map(int, args.ks.split(",")):
            for nbytes in (s for s in SIZES if lo <= s <= hi):
                if row_bytes(dtype, k, nbytes) > args.max_row_gib * (1 << 30):
                    print(f"{dtype:9} {k:>2} {human(nbytes):>8}   skipped: over --max-row-gib")
                    continue
                r = bench_row(dtype, k, nbytes, rng, CLOCKS[args.clock])
                print(f"{dtype:9} {k:>2} {human(nbytes):>8} {r['numpy']:>11.2f} {r['cx']:>8.2f} "
                      f"{r['ratio']:>6.2f} {r['raw']:>9.2f} {r['ratio_raw']:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
