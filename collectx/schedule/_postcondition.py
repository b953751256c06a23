"""What each collective must leave in the output buffers, as multisets of contributions.

A contribution is ``(origin rank, chunk index in the origin's input)``; ``C`` = nchunks, ``n`` =
nranks. Sum-family collectives must hold each contribution exactly once.

=============== ======================================= ===================================
collective      output chunk                             must hold
=============== ======================================= ===================================
allreduce       every rank q, chunk c                    {(r, c) for every r}
reduce_scatter  rank q, chunk c                          {(r, q*C + c) for every r}
allgather       rank q, chunk r*C + c                    {(r, c)}
broadcast       every rank, chunk c                      {(root, c)}
reduce          root, chunk c (other ranks: anything)    {(r, c) for every r}
alltoall        rank q, chunk r*C + c                    {(r, q*C + c)}
sendrecv        rank (root+1) % n, chunk c (others: any) {(root, c)}
=============== ======================================= ===================================
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

from ..errors import WrongResult
from ._graph import Graph
from .ir import Ref, Schedule


def expected_outputs(s: Schedule) -> Iterator[tuple[int, int, list[tuple[int, int]]]]:
    """Yield ``(rank, output chunk, expected contributions)`` for every constrained chunk."""
    n, C, coll, root = s.nranks, s.nchunks, s.collective, s.root
    everyone = range(n)
    if coll == "allreduce":
        for q in everyone:
            for c in range(C):
                yield q, c, [(r, c) for r in everyone]
    elif coll == "reduce_scatter":
        for q in everyone:
            for c in range(C):
                yield q, c, [(r, q * C + c) for r in everyone]
    elif coll in ("allgather", "alltoall"):
        for q in everyone:
            for r in everyone:
                for c in range(C):
                    yield q, r * C + c, [(r, c if coll == "allgather" else q * C + c)]
    elif coll == "broadcast":
        for q in everyone:
            for c in range(C):
                yield q, c, [(root, c)]
    elif coll == "reduce":
        for c in range(C):
            yield root, c, [(r, c) for r in everyone]
    elif coll == "sendrecv":
        for c in range(C):
            yield (root + 1) % n, c, [(root, c)]


def check_postcondition(s: Schedule, g: Graph, mem) -> None:
    """Raise :class:`WrongResult` for the first output chunk that differs from its expectation.

    ``mem`` is the :class:`._symbolic.Memory` after the run.
    """
    size = s.units(0, "output") * s.nchunks
    slots = {q: mem.locs(Ref(q, "output", 0, size)) for q in range(s.nranks)}
    width = mem.max_in
    for q, k, want in expected_outputs(s):
        i = slots[q][k]
        have = mem.contents[i]
        if have == tuple(sorted(r * width + j for r, j in want)):
            continue
        writer = mem.writer[i]
        who = ("nothing wrote it" if have is None else
               "last written by input" if writer < 0 else f"last written by {g.name(writer)}")
        raise WrongResult(f"{s.collective}: rank {q} output chunk {k} ({who}) "
                          f"{_diff(mem.decode(have), Counter(want))}")


def _diff(have: Counter, want: Counter) -> str:
    missing = want - have
    extra = have - want
    parts = []
    if missing:
        parts.append("misses " + _fmt(missing))
    doubled = Counter({k: v for k, v in extra.items() if k in want})
    foreign = Counter({k: v for k, v in extra.items() if k not in want})
    if doubled:
        parts.append("holds more than once " + _fmt(doubled))
    if foreign:
        parts.append("holds foreign " + _fmt(foreign))
    return "; ".join(parts) + "; expected each contribution exactly once"


def _fmt(c: Counter, limit: int = 4) -> str:
    items = sorted(c.items())
    text = ", ".join(f"rank {r} input chunk {j}" + (f" (x{m})" if m > 1 else "")
                     for (r, j), m in items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")
