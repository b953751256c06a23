"""Small helpers shared by the planner algorithms: shard arithmetic and a lane builder.

The builder only collects instructions and hands out their :class:`Dep` ids; it knows nothing
about collectives, so each algorithm module stays a readable list of copies and reduces.
"""

from __future__ import annotations

import json
from typing import Iterable

from ..errors import PlanError
from ..schedule.ir import COLLECTIVES, Dep, Instr, Lane, Ref, Schedule, _freeze, alias


def shard(r: int, nparts: int, nchunks: int) -> tuple[int, int]:
    """Chunk range ``(start, count)`` of part ``r`` when ``nchunks`` chunks are cut in ``nparts``.

    Parts differ by at most one chunk; a part is empty (count 0) when ``nchunks < nparts``.

    >>> [shard(r, 3, 4) for r in range(3)]
    [(0, 1), (1, 1), (2, 2)]
    """
    lo, hi = r * nchunks // nparts, (r + 1) * nchunks // nparts
    return lo, hi - lo


def staggered(lo: int, k: int) -> list[tuple[int, int]]:
    """Chunks ``lo .. lo+k`` as pieces of two chunks, but the second piece of one: ``(first
    chunk, chunks)`` in order, for two lanes to take in turn (double buffering).

    A transfer waits out its route's latency before its first byte moves. Pieces of equal
    size sharing a link finish together and then all wait together, idling the link once a
    piece; the short piece puts the second lane half a piece out of phase, so one lane
    moves while the other waits.

    >>> staggered(0, 8)
    [(0, 2), (2, 1), (3, 2), (5, 2), (7, 1)]
    """
    cuts = [lo + c for c in (0, 2, *range(3, k, 2)) if c < k] + [lo + k]
    return [(a, b - a) for a, b in zip(cuts, cuts[1:])]


def weighted_shares(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` chunks in proportion to ``weights`` (largest remainder, integral).

    >>> weighted_shares(10, [2.0, 1.0, 1.0])
    [5, 3, 2]
    """
    s = float(sum(weights))
    if s <= 0:
        weights, s = [1.0] * len(weights), float(len(weights))
    exact = [total * w / s for w in weights]
    shares = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (shares[i] - exact[i], i))
    for i in order[:total - sum(shares)]:
        shares[i] += 1
    return shares


_new = tuple.__new__


def check_args(collective: str, nranks: int, root: int, nchunks: int | None) -> None:
    """Validate the arguments every planner shares; raises :class:`PlanError`."""
    if collective not in COLLECTIVES:
        raise PlanError(f"unknown collective {collective!r}; expected one of "
                        f"{', '.join(COLLECTIVES)}")
    if nranks < 1:
        raise PlanError(f"{nranks} ranks: a collective needs at least one rank")
    if not 0 <= root < nranks:
        raise PlanError(f"root={root} with {nranks} ranks: the root must be in 0..{nranks - 1}")
    if nchunks is not None and nchunks < 1:
        raise PlanError(f"nchunks={nchunks}: expected a positive chunk count (or None)")


class Builder:
    """Collects instructions per (rank, lane) and returns each one's :class:`Dep` id.

    Copies that are no-ops once buffers alias (in place) are dropped, and ``add`` returns
    ``None`` for them; ``None`` deps are ignored, so callers can chain without special cases.
    """

    def __init__(self, collective: str, nranks: int, nchunks: int, *, root: int = 0,
                 inplace: bool = False):
        self.collective, self.nranks, self.nchunks = collective, nranks, nchunks
        self.root, self.inplace = root, inplace
        self._lanes: list[list[list[Instr]]] = [[] for _ in range(nranks)]
        self._probe = Schedule(collective, nranks, nchunks, ((),) * nranks, inplace=inplace)

    def add(self, rank: int, lane: int, op: str, dst: Ref, srcs: Iterable[Ref],
            deps: Iterable[Dep | None] = ()) -> Dep | None:
        # Called for every instruction of a direct or ring candidate (10^4 a plan): the named
        # tuples are made without their Python __new__.
        srcs = tuple(srcs)
        if op == "reduce" and len(srcs) == 1:
            op = "copy"  # a reduction of one input is a copy; executors do less work
        if op == "copy" and (alias(self._probe, dst) == alias(self._probe, srcs[0])
                             if self.inplace else dst == srcs[0]):
            return None
        lanes = self._lanes[rank]
        while len(lanes) <= lane:
            lanes.append([])
        # The previous instruction of the same lane is implicit; listing it would be noise.
        # Deps sort as (rank, lane, index) tuples.
        wait = tuple(sorted({d for d in deps if d is not None
                             and (d[0] != rank or d[1] != lane)})) if deps else ()
        seq = lanes[lane]
        seq.append(_new(Instr, (op, dst, srcs, wait, None, ())))
        return _new(Dep, (rank, lane, len(seq) - 1))

    def schedule(self, algorithm: str, *, scratch_units: tuple[int, ...] = (),
                 meta: dict | None = None) -> Schedule:
        lanes = tuple(tuple(Lane(tuple(instrs)) for instrs in rank_lanes)
                      for rank_lanes in self._lanes)
        # meta as JSON gives it back, so that from_dict(to_dict(s)) == s
        return Schedule(self.collective, self.nranks, self.nchunks, lanes, root=self.root,
                        inplace=self.inplace, scratch_units=scratch_units, algorithm=algorithm,
                        meta=_freeze(json.loads(json.dumps(meta or {}))))


def simulated(s: Schedule, topo, nbytes: int, ranks):
    """The simulator's result for ``s`` on ``topo`` (``ranks``: its nodes): how planners weigh
    candidates that no closed form ranks."""
    from ..schedule.simulate import simulate
    return simulate(s, topo, nbytes, ranks=list(ranks))


def unpacked(s):
    """``s`` as a :class:`~collectx.schedule.Schedule`: a candidate simulated as words
    (:class:`~collectx.schedule.ir.PackedSchedule`) is unpacked, and what the simulator
    worked out of it carries over (the planner prices the one it keeps)."""
    from ..schedule.ir import PackedSchedule
    from ..schedule.simulate import carry
    if not isinstance(s, PackedSchedule):
        return s
    full = s.unpacked()
    carry(s, full)
    return full
