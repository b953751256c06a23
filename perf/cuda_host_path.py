"""The Python side of one CUDA collective call, on any machine: what a rank's thread spends per
call before the launch, with the launch itself stubbed out (no GPU, no driver).

Ranks as threads of one process take turns at the GIL, so this cost, times the ranks, bounds how
fast a GPU's collectives can be issued eagerly (docs/cuda.md, "Speed on one H200"). It times
``CudaCommunicator.allreduce`` of a CUDA Array Interface object through the real communicator,
buffer parsing and engine, with the window, plan upload and launch replaced by stubs.

    python perf/cuda_host_path.py --calls 20000

Needs a libcollectx built with CUDA objects (for its C declarations).
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import os
import statistics
import time
from types import SimpleNamespace

import numpy as np


class _Event:
    handle = 1

    def __init__(self, *args, **kwargs):
        pass

    def query(self) -> bool:
        return False

    def synchronize(self) -> None:
        pass

    def destroy(self) -> None:
        pass


class _Array:
    __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (1 << 20, False),
                                "version": 3, "strides": None, "stream": 7}


def stub_communicator():
    """A CudaCommunicator of rank 0 of 2 (one process) whose GPU calls are stubs."""
    from collectx.config import get_config
    from collectx.runtime.cuda import _rt, communicator as C, engine as E
    records = np.zeros((E.RING + 1) * E.STATUS_BYTES, np.uint8)
    _rt.host_alloc, _rt.set_device, _rt.Event = lambda n: records.ctypes.data, None, _Event
    _rt.set_device = lambda d: None
    win = SimpleNamespace(rank=0, size=2, device=0, set_bytes=1 << 20, self_base=4096,
                          d_windows=8192, shared_gpu=True,
                          peers=[{"pid": os.getpid(), "bus": "0", "sms": 132}] * 2,
                          read_words=lambda r, off, n: [0] * n)
    eng = E.CudaEngine(win, get_config(), None, timeout=5.0)
    eng._keep = records
    eng._lib = SimpleNamespace(cx_cuda_exec_launch=lambda a, s: 0)
    eng._state = lambda event, stream: 1          # the oldest call still runs
    eng._shared.get = lambda coll, nbytes, root, topo, make, watch: SimpleNamespace(
        schedule=make(topo), describe=lambda: "")
    E.GpuPlan = lambda flat, direct=False: SimpleNamespace(
        flat=flat, native=eng._ffi.NULL, stride=1, in_place=True, free=lambda: 0)
    comm = C.CudaCommunicator.__new__(C.CudaCommunicator)
    comm._engine, comm.rank, comm.size, comm.device, comm._stream = eng, 0, 2, 0, 0
    return comm, eng


def per_call_us(comm, eng, calls: int) -> float:
    x = _Array()
    comm.allreduce(x)
    start = time.perf_counter()
    for _ in range(calls):
        comm.allreduce(x)
        if len(eng._pending) > 200:
            eng._pending.clear()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    comm, eng = stub_communicator()
    times = [per_call_us(comm, eng, args.calls) for _ in range(args.repeat)]
    print(f"allreduce, Python side per call: median {statistics.median(times):.2f} us "
          f"(runs: {', '.join(f'{t:.2f}' for t in times)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
