"""What each collective means to the sweep: buffer sizes, how to call it, and its exact result.

Every collective is described by one :class:`Bench`: how a requested size in bytes becomes
element counts (as nccl-tests counts them), how to run it out of place and in place on any
communicator with collectx's method names, and the reference output of each rank computed in
float64 from the known inputs of :func:`input_values`.

>>> b = BENCHES["allgather"]
>>> b.layout(1024, itemsize=4, nranks=4)
Layout(count=256, in_elems=64, out_elems=256, nbytes=1024)
>>> inputs = lambda q, start, n: input_values("allgather", "sum", q, n, start)
>>> b.expected(inputs, rank=0, nranks=2, op="sum", root=0, n_in=2).tolist()
[1.0, 2.0, 18.0, 19.0]
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

REDUCING = ("allreduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce")
# Ranks over which a split collective's buffers are cut into one slot per rank.
_SPLIT = ("allgather", "reduce_scatter", "alltoall")


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """Element counts of one size: ``count`` as nccl-tests prints it, ``nbytes`` for algbw."""

    count: int
    in_elems: int
    out_elems: int
    nbytes: int


# Every input pattern repeats with this period (lcm of 4, 7 and 60 below), so inputs and
# references are computed on one period and tiled: a 64 MiB check costs a memcpy, not a loop.
PERIOD = 420


@functools.lru_cache(maxsize=256)
def _pattern(collective: str, op: str, rank: int) -> np.ndarray:
    i = np.arange(PERIOD, dtype=np.int64)
    if collective in REDUCING and op == "prod":
        values = np.where((i + rank) % 4 == 0, 2.0, 1.0)
    elif collective in REDUCING:
        values = ((i * 3 + rank * 5) % 7 + 1).astype(np.float64)
    else:
        values = ((rank * 17 + i) % 60 + 1).astype(np.float64)
    values.flags.writeable = False
    return values


def tile(pattern: np.ndarray, start: int, n: int, dtype=np.float64, out=None) -> np.ndarray:
    """Elements ``start .. start+n`` of the endless repetition of a one-period ``pattern``.

    Writes into ``out`` when given (its dtype wins), by doubling copies: one pass over memory,
    no temporaries, which matters when a check fills 64 MiB buffers on a busy machine.

    >>> tile(np.array([1.0, 2.0, 3.0]), 1, 7).tolist()
    [2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0]
    """
    out = np.empty(n, dtype) if out is None else out
    period = len(pattern)
    k = min(n, period)
    out[:k] = np.roll(pattern, -(start % period))[:k]
    while k < n:  # out[:k] holds whole periods, so copying it on keeps the phase
        m = min(k, n - k)
        out[k:k + m] = out[:m]
        k += m
    return out


def input_values(collective: str, op: str, rank: int, n: int, start: int = 0,
                 dtype=np.float64) -> np.ndarray:
    """Known inputs of ``rank`` (float64), elements ``start .. start+n``: small integers.

    Reductions get values 1..7 (1 or 2 for ``prod``, at most one 2 in four ranks per element) so
    that sums and products stay exactly representable even in bfloat16 and int8 for the rank
    counts a machine runs. Data movement gets values 1..60 that differ between ranks at every
    index (17 is coprime to 60), so a block landing in the wrong slot is counted as wrong.
    """
    return tile(_pattern(collective, op, rank), start, n, dtype)


def input_pattern(collective: str, op: str, rank: int) -> np.ndarray:
    """One period of ``rank``'s inputs (read-only float64), for filling buffers in place."""
    return _pattern(collective, op, rank)


def reduce_all(arrays: list[np.ndarray], op: str) -> np.ndarray:
    """Elementwise reduction of float64 arrays with a collective's op (``avg`` = sum / n)."""
    stack = np.stack(arrays)
    if op == "prod":
        return stack.prod(axis=0)
    if op == "min":
        return stack.min(axis=0)
    if op == "max":
        return stack.max(axis=0)
    total = stack.sum(axis=0)
    return total / len(arrays) if op == "avg" else total


Inputs = Callable[..., np.ndarray]  # inputs(rank, start, n) -> float64 elements


@dataclasses.dataclass(frozen=True, slots=True)
class Bench:
    """One collective as the sweep runs it (see the module docstring)."""

    name: str
    run_oop: Callable | None      # (comm, x, y, op, root) -> None
    run_ip: Callable | None       # (comm, y, op, root) -> None, result in ip_view(y)
    reference: Callable           # (inputs, rank, nranks, op, root) -> float64 array or None

    def layout(self, size: int, itemsize: int, nranks: int) -> Layout:
        """Counts for a requested size; at least one element per rank so every row moves data."""
        if self.name in _SPLIT:
            per = max(size // itemsize // nranks, 1)
            total = per * nranks
            ins = total if self.name != "allgather" else per
            outs = total if self.name != "reduce_scatter" else per
            return Layout(total, ins, outs, total * itemsize)
        n = max(size // itemsize, 1)
        return Layout(n, n, n, n * itemsize)

    def expected(self, inputs: Inputs, rank: int, nranks: int, op: str, root: int, n_in: int,
                 dtype=np.float64):
        """Reference output of ``rank`` in ``dtype``, or None where the output is unspecified.

        ``inputs(q, start, n)`` gives rank ``q``'s input elements ``start .. start+n`` in
        ``dtype``; each rank's input has ``n_in`` elements. Reductions are computed in float64
        on one period and cast once, so exact results stay exact.
        """
        return self.reference(inputs, rank, nranks, op, root, n_in, dtype)

    def ip_views(self, y, rank: int, nranks: int) -> tuple:
        """(where the input goes, where the result is read) in the in-place buffer ``y``.

        ``y`` holds ``max(in_elems, out_elems)`` elements; as in NCCL, allgather's input is the
        rank's own slot of the output, and reduce_scatter's output is its slot of the input.
        """
        if self.name == "allgather":
            return _slot(y, rank, nranks), y
        if self.name == "reduce_scatter":
            return y, _slot(y, rank, nranks)
        return y, y


def _len(buf) -> int:
    return int(buf.shape[0])


def _slot(buf, rank: int, nranks: int):
    per = _len(buf) // nranks
    return buf[rank * per:(rank + 1) * per]


def _reduced(inputs, nranks, op):
    # Inputs share the period, so the reduction of one period is the reduction's pattern.
    return reduce_all([inputs(q, 0, PERIOD).astype(np.float64) for q in range(nranks)], op)


def _ref_allreduce(inputs, rank, nranks, op, root, n_in, dtype):
    return tile(_reduced(inputs, nranks, op), 0, n_in, dtype)


def _ref_reduce_scatter(inputs, rank, nranks, op, root, n_in, dtype):
    per = n_in // nranks
    return tile(_reduced(inputs, nranks, op), rank * per, per, dtype)


def _ref_allgather(inputs, rank, nranks, op, root, n_in, dtype):
    return np.concatenate([inputs(q, 0, n_in) for q in range(nranks)])


def _ref_broadcast(inputs, rank, nranks, op, root, n_in, dtype):
    return inputs(root, 0, n_in)


def _ref_reduce(inputs, rank, nranks, op, root, n_in, dtype):
    return _ref_allreduce(inputs, rank, nranks, op, root, n_in, dtype) if rank == root else None


def _ref_alltoall(inputs, rank, nranks, op, root, n_in, dtype):
    per = n_in // nranks
    return np.concatenate([inputs(q, rank * per, per) for q in range(nranks)])


def _ref_sendrecv(inputs, rank, nranks, op, root, n_in, dtype):
    return inputs((rank - 1) % nranks, 0, n_in)


def _sendrecv(comm, x, y, op, root):
    # Blocking sends around a ring deadlock if everyone sends first; alternating by parity breaks
    # the cycle (for odd counts the last even rank waits on an odd one, which receives first).
    nxt, prv = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    if comm.size == 1:
        y[...] = x
    elif comm.rank % 2 == 0:
        comm.send(x, nxt)
        comm.recv(y, prv)
    else:
        comm.recv(y, prv)
        comm.send(x, nxt)


BENCHES = {b.name: b for b in (
    Bench("allreduce", lambda c, x, y, op, root: c.allreduce(x, out=y, op=op),
          lambda c, y, op, root: c.allreduce(y, op=op), _ref_allreduce),
    Bench("allgather", lambda c, x, y, op, root: c.allgather(x, out=y),
          lambda c, y, op, root: c.allgather(_slot(y, c.rank, c.size), out=y), _ref_allgather),
    Bench("reduce_scatter", lambda c, x, y, op, root: c.reduce_scatter(x, out=y, op=op),
          lambda c, y, op, root: c.reduce_scatter(y, out=_slot(y, c.rank, c.size), op=op),
          _ref_reduce_scatter),
    Bench("broadcast", None, lambda c, y, op, root: c.broadcast(y, root=root), _ref_broadcast),
    Bench("reduce", lambda c, x, y, op, root: c.reduce(x, root=root, out=y, op=op),
          lambda c, y, op, root: c.reduce(y, root=root, op=op), _ref_reduce),
    Bench("alltoall", lambda c, x, y, op, root: c.alltoall(x, out=y), None, _ref_alltoall),
    Bench("sendrecv", _sendrecv, None, _ref_sendrecv),
)}
