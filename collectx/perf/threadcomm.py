"""A reference communicator of threads in one process, in plain numpy.

It has collectx's Communicator method names and semantics, computed the obvious way (every rank
deposits its input, all read all). It is the yardstick the sweep's own tests run against, and a way
to exercise :func:`collectx.perf.sweep.run_sweep` without the native library.

>>> import numpy as np
>>> def body(comm):
...     x = np.full(2, comm.rank + 1.0)
...     comm.allreduce(x)
...     return x.tolist()
>>> run_threads(body, 3)
[[6.0, 6.0], [6.0, 6.0], [6.0, 6.0]]
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from .collectives import reduce_all


class _Shared:
    def __init__(self, size: int):
        self.barrier = threading.Barrier(size)
        self.slots = [None] * size
        self.mail = {(s, d): queue.Queue() for s in range(size) for d in range(size)}


class ThreadComm:
    """One rank of a :func:`run_threads` group (numpy buffers; bfloat16 is not supported)."""

    def __init__(self, shared: _Shared, rank: int, size: int):
        self._shared, self.rank, self.size = shared, rank, size

    def _exchange(self, x) -> list[np.ndarray]:
        sh = self._shared
        sh.slots[self.rank] = np.array(x, copy=True)
        sh.barrier.wait()
        everyone = list(sh.slots)
        sh.barrier.wait()  # nobody overwrites a slot before all have read it
        return everyone

    def barrier(self) -> None:
        self._shared.barrier.wait()

    def empty(self, shape, dtype):
        return np.empty(shape, dtype=dtype)

    def allreduce(self, x, out=None, op="sum", async_op=False):
        out = x if out is None else out
        out[...] = reduce_all([a.astype(np.float64) for a in self._exchange(x)], op)
        return out

    def reduce(self, x, root=0, out=None, op="sum"):
        out = x if out is None else out
        result = reduce_all([a.astype(np.float64) for a in self._exchange(x)], op)
        if self.rank == root:
            out[...] = result
        return out

    def reduce_scatter(self, x, out=None, op="sum"):
        full = reduce_all([a.astype(np.float64) for a in self._exchange(x)], op)
        per = full.shape[0] // self.size
        out = np.empty(per, x.dtype) if out is None else out
        out[...] = full[self.rank * per:(self.rank + 1) * per]
        return out

    def allgather(self, x, out=None):
        parts = self._exchange(x)
        out = np.empty(sum(p.shape[0] for p in parts), x.dtype) if out is None else out
        out[...] = np.concatenate(parts)
        return out

    def broadcast(self, x, root=0):
        x[...] = self._exchange(x)[root]
        return x

    def alltoall(self, x, out=None):
        parts = self._exchange(x)
        per = x.shape[0] // self.size
        out = np.empty_like(x) if out is None else out
        out[...] = np.concatenate([p[self.rank * per:(self.rank + 1) * per] for p in parts])
        return out

    def send(self, x, dst):
        self._shared.mail[(self.rank, dst)].put(np.array(x, copy=True))

    def recv(self, x, src):
        x[...] = self._shared.mail[(src, self.rank)].get(timeout=60)
        return x

    def close(self):
        pass


def run_threads(fn, nprocs: int, args=()) -> list:
    """Run ``fn(comm, *args)`` on ``nprocs`` thread ranks; return their results, re-raise errors."""
    shared = _Shared(nprocs)
    results, errors = [None] * nprocs, []

    def body(rank):
        try:
            results[rank] = fn(ThreadComm(shared, rank, nprocs), *args)
        except BaseException as exc:  # surfaced below; abort the barrier so peers stop waiting
            errors.append(exc)
            shared.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(nprocs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return results
