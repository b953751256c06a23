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
from .ir import Ref, Schedule, alias


def expected_outputs(s: Schedule) -> Iterator[tuple[int, int, Counter]]:
    """Yield ``(rank, output chunk, expected contributions)`` for every constrained chunk."""
    n, C, coll, root = s.nranks, s.nchunks, s.collective, s.root
    everyone = range(n)
    if coll == "allreduce":
        for q in everyone:
            for c in range(C):
                yield q, c, Counter({(r, c): 1 for r in everyone})
    elif coll == "reduce_scatter":
        for q in everyone:
            for c in range(C):
                yield q, c, Counter({(r, q * C + c): 1 for r in everyone})
    elif coll in ("allgather", "alltoall"):
        for q in everyone:
            for r in everyone:
                for c in range(C):
                    j = c if coll == "allgather" else q * C + c
                    yield q, r * C + c, Counter({(r, j): 1})
    elif coll == "broadcast":
        for q in everyone:
            for c in range(C):
                yield q, c, Counter({(root, c): 1})
    elif coll == "reduce":
        for c in range(C):
            yield root, c, Counter({(r, c): 1 for r in everyone})
    elif coll == "sendrecv":
        for c in range(C):
            yield (root + 1) % n, c, Counter({(root, c): 1})


def check_postcondition(s: Schedule, g: Graph, state: dict) -> None:
    """Raise :class:`WrongResult` for the first output chunk that differs from its expectation."""
    for q, k, want in expected_outputs(s):
        a = alias(s, Ref(q, "output", k))
        ch = state.get((a.rank, a.buf, a.chunk))
        have = ch.contents if ch is not None and ch.contents is not None else Counter()
        if have == want:
            continue
        who = ("nothing wrote it" if ch is None or ch.contents is None else
               "last written by input" if ch.writer < 0 else
               f"last written by {g.name(ch.writer)}")
        raise WrongResult(f"{s.collective}: rank {q} output chunk {k} ({who}) {_diff(have, want)}")


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
