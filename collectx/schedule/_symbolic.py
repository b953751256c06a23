"""Symbolic memory for :mod:`.verify`: what each chunk holds, who wrote it, who read it since.

Every buffer chunk of every rank is one slot of flat lists (fast for schedules of tens of
thousands of instructions). A chunk's contents are a sorted tuple of contribution ids (a
multiset: a contribution added twice appears twice); contribution ``(origin rank, input chunk
j)`` is the int ``origin * max_in + j``. ``None`` means nothing was written yet.
"""

from __future__ import annotations

import bisect
from collections import Counter
from itertools import chain

from ..errors import DataRace, ReadBeforeWrite
from ._graph import Graph
from .ir import BUFFERS, Ref, Schedule, alias

INITIAL = -1  # "last writer" of an input chunk that nobody overwrote yet


class Memory:
    """Chunk contents plus the happens-before bookkeeping that finds races.

    ``vc`` are the vector clocks of :func:`._graph.vector_clocks`: ``u`` happens before ``v``
    iff ``vc[v, lane_of[u]] >= index(u)``.
    """

    def __init__(self, s: Schedule, g: Graph, vc):
        self.s, self.g, self.vc = s, g, vc
        self.base: dict[tuple[int, str], int] = {}
        self._starts: list[tuple[int, int, str]] = []
        total = 0
        for r in range(s.nranks):
            for b in BUFFERS:
                self.base[(r, b)] = total
                self._starts.append((total, r, b))
                total += s.units(r, b) * s.nchunks
        self.max_in = max(s.units(r, "input") for r in range(s.nranks)) * s.nchunks
        self.contents: list[tuple | None] = [None] * total
        self.writer = [INITIAL] * total
        self.readers: list[list[int] | None] = [None] * total
        self._index = [d.index for d in g.ids]
        self._row_of, self._row = -1, None
        for r in range(s.nranks):
            size = s.units(r, "input") * s.nchunks
            if size:
                first = self.locs(Ref(r, "input", 0, size))
                for j, i in enumerate(first):
                    self.contents[i] = (r * self.max_in + j,)

    # -- addressing -----------------------------------------------------------------------------
    def locs(self, ref: Ref) -> range:
        """Slots of the chunks ``ref`` names, after in-place aliasing."""
        a = alias(self.s, ref)
        start = self.base[(a.rank, a.buf)] + a.chunk
        return range(start, start + a.count)

    def name(self, i: int) -> str:
        k = bisect.bisect_right(self._starts, (i, float("inf"), "")) - 1
        start, r, b = self._starts[k]
        return f"{r}:{b}[{i - start}]"

    def decode(self, contents: tuple | None) -> Counter:
        return Counter(divmod(x, self.max_in) for x in contents or ())

    # -- ordering -------------------------------------------------------------------------------
    def before(self, u: int, v: int) -> bool:
        if u == v or u == INITIAL:
            return True
        if self._row_of != v:  # instructions touch many chunks: look v's clock row up once
            self._row_of, self._row = v, self.vc[v]
        return self._row.item(self.g.lane_of[u]) >= self._index[u]

    # -- access ---------------------------------------------------------------------------------
    def read(self, v: int, i: int) -> tuple:
        got = self.contents[i]
        if got is None:
            raise ReadBeforeWrite(f"{self.g.name(v)} reads {self.name(i)}, which nothing has "
                                  "written; expected a dependency on the instruction filling it")
        w = self.writer[i]
        if not self.before(w, v):
            raise ReadBeforeWrite(f"{self.g.name(v)} reads {self.name(i)} written by "
                                  f"{self.g.name(w)} without waiting for it; expected a "
                                  "dependency on that write")
        if self.readers[i] is None:
            self.readers[i] = [v]
        elif self.readers[i][-1] != v:
            self.readers[i].append(v)
        return got

    def write(self, v: int, i: int, contents: tuple) -> None:
        w = self.writer[i]
        if self.contents[i] is not None and not self.before(w, v):
            raise DataRace(f"{self.g.name(v)} writes {self.name(i)} concurrently with "
                           f"{self.g.name(w)} (write-after-write race); expected one to "
                           "depend on the other")
        for u in self.readers[i] or ():
            if not self.before(u, v):
                raise DataRace(f"{self.g.name(v)} overwrites {self.name(i)} while "
                               f"{self.g.name(u)} may still read it (write-after-read race); "
                               "expected a dependency on that read")
        self.contents[i], self.writer[i], self.readers[i] = contents, v, None


def combine(parts: list[tuple]) -> tuple:
    """Multiset sum of chunk contents (a copy shares its source's tuple)."""
    if len(parts) == 1:
        return parts[0]
    return tuple(sorted(chain.from_iterable(parts)))
