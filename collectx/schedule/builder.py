"""An explicit builder for schedules, so planners never hand-assemble nested tuples.

>>> from collectx.schedule import Ref, verify
>>> b = ScheduleBuilder("allgather", nranks=2, nchunks=1, algorithm="direct")
>>> for r in range(2):
...     own = b.copy(r, 0, dst=Ref(r, "output", r), src=Ref(r, "input", 0))
...     _ = b.copy(r, 0, dst=Ref(1 - r, "output", r), src=Ref(r, "input", 0))
>>> s = b.build()
>>> s.n_instructions, verify(s).instructions
(4, 4)
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from ..errors import ArgumentError
from .ir import Dep, Instr, Lane, PackedSchedule, Ref, Schedule, _freeze, alias


class ScheduleBuilder:
    """Accumulates instructions rank by rank, lane by lane, and freezes them into a Schedule.

    Parameters
    ----------
    collective, nranks, nchunks, root, inplace, algorithm
        As in :class:`~collectx.schedule.Schedule`.

    Notes
    -----
    Each add method appends to ``lanes[rank][lane]`` (creating lanes up to ``lane`` on demand)
    and returns the new instruction's :class:`Dep`, to be passed in later ``deps``. ``None``
    entries in ``deps`` are dropped, so "no producer yet" needs no special case in a planner.
    """

    def __init__(self, collective: str, nranks: int, nchunks: int, root: int = 0,
                 inplace: bool = False, algorithm: str = ""):
        if nranks < 1 or nchunks < 1:
            raise ArgumentError(f"nranks={nranks}, nchunks={nchunks}: both must be >= 1")
        self.collective, self.nranks, self.nchunks = collective, nranks, nchunks
        self.root, self.inplace, self.algorithm = root, inplace, algorithm
        self._lanes: list[list[list[Instr]]] = [[] for _ in range(nranks)]
        self._scratch = [0] * nranks
        self._host = [0] * nranks
        self._fresh_units: dict = {}   # (buf, rank) -> first chunks of units fresh() reserved
        self._fresh_next: dict = {}    # (buf, rank) -> per chunk index, next of those units to use
        self._meta: dict[str, Any] = {}

    # -- instructions ---------------------------------------------------------------------------
    def copy(self, rank: int, lane: int, dst: Ref, src: Ref,
             deps: Iterable[Dep | None] = ()) -> Dep:
        """Append ``dst = src`` to ``rank``'s lane ``lane``; returns its id."""
        return self._add(rank, lane, Instr("copy", dst, (src,), _clean(deps)))

    def reduce(self, rank: int, lane: int, dst: Ref, srcs: Iterable[Ref],
               deps: Iterable[Dep | None] = ()) -> Dep:
        """Append ``dst = srcs[0] op srcs[1] op ...``; returns its id."""
        return self._add(rank, lane, Instr("reduce", dst, tuple(srcs), _clean(deps)))

    def engine(self, rank: int, lane: int, dst: Ref, srcs: Iterable[Ref], engine_op: str,
               group: Iterable[int], deps: Iterable[Dep | None] = ()) -> Dep:
        """Append a step that hands ``srcs`` to an inter-node engine running ``engine_op``."""
        ins = Instr("engine", dst, tuple(srcs), _clean(deps), engine_op=engine_op,
                    group=tuple(group))
        return self._add(rank, lane, ins)

    # -- buffers and facts ------------------------------------------------------------------------
    def scratch(self, rank: int, units: int) -> int:
        """Reserve ``units`` more payload units of ``rank``'s scratch; returns their first chunk.

        >>> b = ScheduleBuilder("allreduce", 2, nchunks=4)
        >>> b.scratch(1, 1), b.scratch(1, 2), b.build().scratch_units
        (0, 4, (0, 3))
        """
        return self._reserve(self._scratch, "scratch", rank, units)

    def host(self, rank: int, units: int) -> int:
        """Reserve ``units`` more payload units of ``rank``'s host-memory buffer (``host``);
        returns their first chunk. Like :meth:`scratch`, for chunks relayed over PCIe.

        >>> b = ScheduleBuilder("broadcast", 2, nchunks=2)
        >>> b.host(0, 1), b.host(0, 1), b.build().host_units
        (0, 2, (2, 0))
        """
        return self._reserve(self._host, "host", rank, units)

    def fresh(self, buf: str, rank: int, like: Ref) -> Ref:
        """A run of ``rank``'s ``buf`` (``scratch`` or ``host``) that no earlier call handed
        out, as long as ``like`` and at the same chunk index of its unit: executors cut units
        into tiles, and chunk ``i`` of a tile has the same length in every buffer only at the
        same index ``i``. Units are reserved as needed.

        >>> b = ScheduleBuilder("allreduce", 2, nchunks=4)
        >>> b.fresh("scratch", 0, Ref(1, "input", 6)), b.fresh("scratch", 0, Ref(1, "input", 2))
        (Ref(rank=0, buf='scratch', chunk=2, count=1), Ref(rank=0, buf='scratch', chunk=6, count=1))

        A run of several chunks holds every index it covers:

        >>> b = ScheduleBuilder("broadcast", 2, nchunks=4)
        >>> b.fresh("host", 0, Ref(0, "input", 1, 2)), b.fresh("host", 0, Ref(0, "input", 2))
        (Ref(rank=0, buf='host', chunk=1, count=2), Ref(rank=0, buf='host', chunk=6, count=1))
        """
        # Called for every chunk a reduction combines (10^4-10^5 times a plan): fields by
        # index, and the Ref without the named tuple's Python __new__.
        count = like[3]
        i = like[2] % self.nchunks
        nexts = self._fresh_next.get((buf, rank))
        if nexts is None:
            nexts = self._fresh_next[buf, rank] = [0] * self.nchunks
        if count == 1:   # most calls: one index
            k = nexts[i]
            nexts[i] = k + 1
        else:   # a run holds each index it covers
            end = min(i + count, self.nchunks)
            k = max(nexts[i:end])
            nexts[i:end] = [k + 1] * (end - i)
        units = self._fresh_units.get((buf, rank))
        if units is None:
            units = self._fresh_units[buf, rank] = []
        while len(units) <= k:
            units.append(self.host(rank, 1) if buf == "host" else self.scratch(rank, 1))
        return _new_ref(Ref, (rank, buf, units[k] + i, count))

    def _reserve(self, table: list, what: str, rank: int, units: int) -> int:
        self._check_rank(rank)
        if units < 0:
            raise ArgumentError(f"{what} units={units}: expected >= 0")
        first = table[rank] * self.nchunks
        table[rank] += units
        return first

    def meta(self, key: str, value: Any) -> None:
        """Record a planner fact (rings, trees, shares) carried in ``Schedule.meta``."""
        self._meta[key] = value

    def lane_length(self, rank: int, lane: int) -> int:
        """Instructions appended so far to ``rank``'s lane ``lane`` (0 if it does not exist)."""
        lanes = self._lanes[rank]
        return len(lanes[lane]) if lane < len(lanes) else 0

    def build(self) -> Schedule:
        """Freeze what was added into a :class:`Schedule` (empty lane for a rank without work)."""
        lanes = tuple(tuple(Lane(tuple(lane)) for lane in rank_lanes) or (Lane(),)
                      for rank_lanes in self._lanes)
        meta = tuple(sorted((k, _deep_tuple(v)) for k, v in self._meta.items()))
        return Schedule(collective=self.collective, nranks=self.nranks, nchunks=self.nchunks,
                        lanes=lanes, root=self.root, inplace=self.inplace,
                        scratch_units=tuple(self._scratch), algorithm=self.algorithm, meta=meta,
                        host_units=tuple(self._host))

    def build_packed(self, code: bytes) -> PackedSchedule:
        """:meth:`build` for instructions a native emitter wrote as words
        (``collectx._fastpath.lower_words``) instead of adding them here: the builder's buffers
        and facts, and ``code``'s instructions, unpacked only on demand."""
        if any(self._lanes):
            raise ArgumentError("build_packed: this builder holds instructions of its own, "
                                "which the words would drop; pack them all, or call build()")
        return PackedSchedule(self.build(), code)

    def appender(self):
        """``append(rank, lane, op, dst, srcs, deps) -> Dep``: :meth:`copy` / :meth:`reduce`
        for emitters that add tens of thousands of instructions and have checked their ranks
        and lanes once: ``srcs`` and ``deps`` must be tuples, ``deps`` without None or repeats.

        >>> b = ScheduleBuilder("broadcast", 2, nchunks=1)
        >>> append = b.appender()
        >>> d = append(1, 0, "copy", Ref(1, "output", 0), (Ref(0, "input", 0),), ())
        >>> d, b.build().lanes[1][0].instrs[0].srcs
        (Dep(rank=1, lane=0, index=0), (Ref(rank=0, buf='input', chunk=0, count=1),))
        """
        all_lanes = self._lanes
        new_instr, new_dep = tuple.__new__, tuple.__new__   # named tuples without their __new__

        def append(rank: int, lane: int, op: str, dst: Ref, srcs: tuple, deps: tuple) -> Dep:
            lanes = all_lanes[rank]
            while len(lanes) <= lane:
                lanes.append([])
            seq = lanes[lane]
            seq.append(new_instr(Instr, (op, dst, srcs, deps, None, ())))
            return new_dep(Dep, (rank, lane, len(seq) - 1))
        return append

    def unit_tables(self) -> tuple[list, list]:
        """The scratch and host units reserved per rank, the lists themselves, for a native
        emitter (``collectx._fastpath.lower_words``) that hands out chunks as :meth:`fresh`
        does, on a builder whose :meth:`fresh` was never called, and reserves units in them."""
        if self._fresh_next:
            raise ArgumentError("unit_tables: fresh() already handed out chunks here, which a "
                                "native emitter would hand out again; use a new builder")
        return self._scratch, self._host

    # -- internals --------------------------------------------------------------------------------
    def _add(self, rank: int, lane: int, ins: Instr) -> Dep:
        self._check_rank(rank)
        if lane < 0:
            raise ArgumentError(f"lane={lane}: expected a lane index >= 0")
        lanes = self._lanes[rank]
        while len(lanes) <= lane:
            lanes.append([])
        lanes[lane].append(ins)
        return Dep(rank, lane, len(lanes[lane]) - 1)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.nranks:
            raise ArgumentError(f"rank={rank}: expected 0 <= rank < {self.nranks}")


class LaneBuilder:
    """Collects instructions per (rank, lane) and returns each one's :class:`Dep` id: the
    planners' direct, ring and tree schedules, and the runtime's small-message ones.

    Copies that are no-ops once buffers alias (in place) are dropped, and ``add`` returns
    ``None`` for them; ``None`` deps are ignored, so callers can chain without special cases.
    It knows nothing about collectives, so each algorithm stays a readable list of copies and
    reduces (:class:`ScheduleBuilder` also sizes scratch and host buffers, for emitters).

    >>> b = LaneBuilder("broadcast", 2, 1)
    >>> first = b.add(1, 0, "copy", Ref(1, "output", 0), [Ref(0, "input", 0)])
    >>> b.add(0, 0, "copy", Ref(0, "input", 0), [Ref(0, "input", 0)]) is None   # a no-op
    True
    >>> b.schedule("direct").n_instructions, first
    (1, Dep(rank=1, lane=0, index=0))
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


_new_ref = _new = tuple.__new__


def _clean(deps: Iterable[Dep | None]) -> tuple[Dep, ...]:
    # Drop "no producer" placeholders and repeats, keeping the order planners gave. Most
    # instructions wait for one producer or none: those skip the dict (planning builds tens
    # of thousands of instructions).
    out = tuple(d for d in deps if d is not None)
    return out if len(out) < 2 else tuple(dict.fromkeys(out))


def _deep_tuple(v: Any) -> Any:
    # Schedule.meta must be hashable frozen data, like Schedule.from_dict produces.
    if isinstance(v, (list, tuple)):
        return tuple(_deep_tuple(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _deep_tuple(x)) for k, x in v.items()))
    return v
