"""A probe of the machine itself, run beside benchmark rounds: how long two processes on the
first two allowed CPUs take to exchange 1 MiB through shared memory, with numpy only.

Why: on some VMs the time to move data between two cores swings by about 3x for seconds at a
time (the hypervisor moving virtual CPUs, not any library's code). A ratio between two backends
measured in different rounds is only fair when both rounds saw the same machine, so benchmark
scripts print this probe next to each round.

    >>> t = exchange_us(iters=20)
    >>> t != t or t > 0      # nan when fewer than two CPUs are allowed
    True
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory

import numpy as np

NBYTES = 1 << 20
_FLAGS = 64          # the two int64 flags after the halves, on a cache line of their own


def exchange_us(iters: int = 300, nbytes: int = NBYTES, timeout_s: float = 30.0) -> float:
    """Mean microseconds per exchange: each process copies ``nbytes`` into its half of a shared
    segment, waits for the peer's copy, and adds the peer's half into a private array (a 2-rank
    allreduce's data movement, without any collective library). NaN with fewer than two CPUs."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return float("nan")
    n = nbytes // 4
    shm = shared_memory.SharedMemory(create=True, size=2 * nbytes + _FLAGS)
    try:
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        procs = [ctx.Process(target=_side, args=(i, cpus[i], shm.name, n, iters, out))
                 for i in (0, 1)]
        for p in procs:
            p.start()
        try:
            return out.get(timeout=timeout_s)
        except Exception:   # a side that never finished: report nothing rather than hang
            return float("nan")
        finally:
            for p in procs:
                p.join(timeout=1.0)
                if p.is_alive():
                    p.kill()
                    p.join()
    finally:
        shm.close()
        shm.unlink()


def _side(me: int, cpu: int, name: str, n: int, iters: int, out) -> None:
    os.sched_setaffinity(0, {cpu})
    shm = shared_memory.SharedMemory(name=name)
    try:
        halves = np.ndarray((2, n), np.float32, buffer=shm.buf)
        flags = np.ndarray((2,), np.int64, buffer=shm.buf, offset=2 * n * 4)
        mine, acc = np.ones(n, np.float32), np.empty(n, np.float32)
        t0 = 0.0
        for it in range(-10, iters):          # ten warm-up rounds
            if it == 0:
                t0 = time.perf_counter()
            written, read = 2 * it + 22, 2 * it + 23   # counters only grow: no lost wake-up
            np.copyto(halves[me], mine)
            flags[me] = written
            while flags[1 - me] < written:
                pass
            np.add(mine, halves[1 - me], out=acc)
            flags[me] = read                  # done reading: the peer may overwrite its half
            while flags[1 - me] < read:
                pass
        if me == 0:
            out.put((time.perf_counter() - t0) / iters * 1e6)
    finally:
        del halves, flags
        shm.close()
