"""What each collective means to the sweep: buffer sizes, how to call it, and its exact result.

Every collective is described by one :class:`Bench`: how a requested size in bytes becomes
element counts (as nccl-tests counts them), how to run it out of place and in place on any
communicator with collectx's method names, and the reference output of each rank computed in
float64 from the known inputs of :func:`input_values`.

>>> b = BENCHES["allgather"]
>>> b.layout(1024, itemsize=4, nranks=4)
Layout(count=256, in_elems=64, out_elems=256, nbytes=1024)
>>> expected = b.expected(lambda q: input_values("allgather", "sum", q, 2), 0, 2, "sum", 0)
>>> expected.tolist()
[1.0, 2.0, 18.0, 19.0]
"""

from __future__ import annotations

import dataclasses
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


def input_values(collective: str, op: str, rank: int, n: int) -> np.ndarray:
    """Known inputs of ``rank`` (float64): small integers, so every result is exact.

    Reductions get values 1..7 (1 or 2 for ``prod``, at most one 2 in four ranks per element) so
    that sums and products stay exactly representable even in bfloat16 and int8 for the rank
    counts a machine runs. Data movement gets values that differ between ranks at every index, so
    a block landing in the wrong slot is counted as wrong.
    """
    i = np.arange(n, dtype=np.int64)
    if collective in REDUCING and op == "prod":
        return np.where((i + rank) % 4 == 0, 2.0, 1.0)
    if collective in REDUCING:
        return ((i * 3 + rank * 5) % 7 + 1).astype(np.float64)
    return ((rank * 17 + i) % 61 + 1).astype(np.float64)


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


Inputs = Callable[[int], np.ndarray]


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

    def expected(self, inputs: Inputs, rank: int, nranks: int, op: str, root: int):
        """Reference output of ``rank`` (float64), or None where the output is unspecified."""
        return self.reference(inputs, rank, nranks, op, root)

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


def _ref_allreduce(inputs, rank, nranks, op, root):
    return reduce_all([inputs(q) for q in range(nranks)], op)


def _ref_reduce_scatter(inputs, rank, nranks, op, root):
    full = reduce_all([inputs(q) for q in range(nranks)], op)
    return _slot(full, rank, nranks)


def _ref_allgather(inputs, rank, nranks, op, root):
    return np.concatenate([inputs(q) for q in range(nranks)])


def _ref_broadcast(inputs, rank, nranks, op, root):
    return inputs(root)


def _ref_reduce(inputs, rank, nranks, op, root):
    return reduce_all([inputs(q) for q in range(nranks)], op) if rank == root else None


def _ref_alltoall(inputs, rank, nranks, op, root):
    return np.concatenate([_slot(inputs(q), rank, nranks) for q in range(nranks)])


def _ref_sendrecv(inputs, rank, nranks, op, root):
    return inputs((rank - 1) % nranks)


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
