"""Embedding a node's sub-schedule into a hierarchical schedule (chunk remapping, extra waits).

How it works. A hierarchical plan reuses the planner's schedule for one node (``g`` ranks) as a
phase of the whole plan. Every sub-instruction is re-emitted on the node's global ranks, on
fresh lanes, with its buffers renamed through a *chunk map*: ``(sub buffer, sub chunk)`` to
``(global buffer, global chunk)`` for one global rank. A map may be affine (the intra-node
reduce-scatter of an allreduce reads the global input chunk for chunk) or piecewise (an
allgather scatters gathered blocks to rank-major slots); where a sub-reference is not contiguous
after mapping, the instruction is split into contiguous pieces, in lane order, so a dependency
on the sub-instruction becomes a dependency on its last piece (lane order covers the others).

Phases meet through a :class:`Writers` table: each emitted instruction records the global
chunks it writes, and a later phase waits for every writer of the chunks it reads."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

from ..schedule.builder import ScheduleBuilder
from ..schedule.ir import Dep, Ref, Schedule

# (sub buffer, sub chunk, global rank) -> (global buffer, global chunk)
ChunkMap = Callable[[str, int, int], tuple[str, int]]


class Writers:
    """Which global instructions write each ``(rank, buffer, chunk)``."""

    def __init__(self) -> None:
        self._by_chunk: dict[tuple[int, str, int], list[Dep]] = defaultdict(list)

    def record(self, ref: Ref, dep: Dep) -> None:
        for c in ref.chunks():
            self._by_chunk[(ref.rank, ref.buf, c)].append(dep)

    def of(self, ref: Ref) -> list[Dep]:
        """Every recorded writer of any chunk of ``ref`` (deduplicated, in record order)."""
        found = (d for c in ref.chunks() for d in self._by_chunk.get((ref.rank, ref.buf, c), ()))
        return list(dict.fromkeys(found))


def embed(b: ScheduleBuilder, sub: Schedule, members: Sequence[int], lane0: int,
          chunk_map: ChunkMap, earlier: Writers, written: Writers) -> None:
    """Append ``sub`` to the lanes ``lane0 + l`` of global ranks ``members``.

    Reads of chunks that ``earlier`` phases wrote wait for those writers; every emitted
    instruction is recorded in ``written`` (not in ``earlier``: inside one phase the
    sub-schedule's own dependencies already order writes and reads, and extra waits on later
    writers of a reused chunk could close a cycle). Sub-rank ``i`` runs on ``members[i]``."""
    pieces = {d: _split(ins, d.rank, members, chunk_map) for d, ins in sub.instructions()}
    where: dict[Dep, Dep] = {}
    count: dict[tuple[int, int], int] = {}
    for d in pieces:   # global id of each sub-instruction's last piece (appended to the lane)
        lane = (members[d.rank], lane0 + d.lane)
        if lane not in count:
            count[lane] = b.lane_length(*lane)
        count[lane] += len(pieces[d])
        where[d] = Dep(*lane, count[lane] - 1)
    for d, ins in sub.instructions():
        rank, lane = members[d.rank], lane0 + d.lane
        deps = [where[x] for x in ins.deps]
        for dst, srcs in pieces[d]:
            waits = deps + [w for s in srcs for w in earlier.of(s)]
            if ins.op == "copy":
                new = b.copy(rank, lane, dst, srcs[0], deps=waits)
            else:
                new = b.reduce(rank, lane, dst, srcs, deps=waits)
            written.record(dst, new)


def _split(ins, sub_rank: int, members: Sequence[int], chunk_map: ChunkMap
           ) -> list[tuple[Ref, tuple[Ref, ...]]]:
    """The instruction's (dst, srcs) as global refs, cut where any mapped ref jumps."""
    refs = (ins.dst, *ins.srcs)
    mapped = [[(members[r.rank], *chunk_map(r.buf, c, members[r.rank])) for c in r.chunks()]
              for r in refs]
    cuts = [0] + [t for t in range(1, ins.dst.count)
                  if any(m[t] != (m[t - 1][0], m[t - 1][1], m[t - 1][2] + 1) for m in mapped)]
    cuts.append(ins.dst.count)
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        gref = [Ref(m[lo][0], m[lo][1], m[lo][2], hi - lo) for m in mapped]
        out.append((gref[0], tuple(gref[1:])))
    return out

