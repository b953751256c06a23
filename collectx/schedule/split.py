"""Running two schedules of one collective side by side, each on its own share of every unit.

Why: a plan over NVLink and a plan relayed through host memory over PCIe use different links,
so together they move a unit faster than either alone; :func:`join_shares` builds the schedule
that runs ``a`` on the first ``a.nchunks`` chunks of every unit and ``b`` on the last
``b.nchunks`` (shares in proportion to the chunk counts; :func:`refine` scales a schedule's
chunk count without changing what it does).

How it works: chunk ``i`` of unit ``u`` of any buffer of ``a`` becomes chunk ``i`` of unit
``u`` of the joined schedule, and chunk ``i`` of ``b`` becomes chunk ``a.nchunks + i``.
Scratch and host buffers are sized to the larger of the two, unit for unit. An instruction
whose chunk run crosses a unit boundary is cut into one instruction per piece, on the same
lane, and what waited for it waits for its last piece. ``b``'s lanes follow ``a``'s on every
rank, so the two never wait for each other.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ScheduleError
from .ir import Dep, Instr, Lane, Ref, Schedule, alias


def refine(s: Schedule, k: int) -> Schedule:
    """``s`` with every chunk cut into ``k`` (``nchunks * k`` chunks, same element spans).

    Chunk ``i`` of ``c`` covers ``[i*n//c, (i+1)*n//c)``, which are exactly chunks
    ``k*i .. k*i+k-1`` of ``k*c``, so scaling every ref by ``k`` is the same schedule.

    >>> from collectx.schedule import ScheduleBuilder
    >>> b = ScheduleBuilder("allgather", 2, nchunks=1)
    >>> _ = b.copy(0, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    >>> refine(b.build(), 3).lanes[0][0].instrs[0].dst
    Ref(rank=1, buf='output', chunk=0, count=3)
    """
    if k == 1:
        return s

    def scale(ref: Ref) -> Ref:
        return Ref(ref.rank, ref.buf, ref.chunk * k, ref.count * k)

    # Plain constructors: dataclasses.replace per instruction was most of the cost.
    lanes = tuple(tuple(Lane(tuple(Instr(ins.op, scale(ins.dst), tuple(map(scale, ins.srcs)),
                                         ins.deps, ins.engine_op, ins.group)
                                   for ins in lane.instrs))
                        for lane in rl) for rl in s.lanes)
    return dataclasses.replace(s, nchunks=s.nchunks * k, lanes=lanes)


def pipeline(s: Schedule, k: int) -> Schedule:
    """``s`` with every instruction cut into ``k`` in a row on its lane (``nchunks * k``
    chunks): piece ``j`` moves the ``j``-th ``k``-th of each run of chunks it names and waits
    for piece ``j`` of what it waited for, so each piece flows on as soon as it lands, as if
    ``s`` had been planned with ``k`` times the chunks.

    Why: a tree plan fills and drains its pipeline in a few chunk times, during which its
    busiest links idle; more chunks shorten that. Planning them costs a few microseconds per
    instruction, cutting a fraction of that.

    A run of chunks an instruction writes must not overlap another run the schedule names in
    part (in place, as :func:`~.ir.alias` places them): piece ``j`` of one then only ever meets
    piece ``j`` of the other. Runs that are only read may overlap. No instruction may be an
    engine call.

    Raises
    ------
    ScheduleError
        ``k < 1``, a written run overlapping another in part, or an engine call.

    Examples
    --------
    >>> from collectx.schedule import ScheduleBuilder, verify
    >>> b = ScheduleBuilder("broadcast", 2, nchunks=1)
    >>> d = b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    >>> _ = b.copy(1, 0, Ref(1, "output", 0), Ref(0, "output", 0), deps=[d])
    >>> p = pipeline(b.build(), 2)
    >>> p.nchunks, [(i.dst.chunk, i.deps) for i in p.lanes[1][0].instrs]
    (2, [(0, (Dep(rank=0, lane=0, index=0),)), (1, (Dep(rank=0, lane=0, index=1),))])
    >>> verify(p).instructions
    4
    """
    if k < 1:
        raise ScheduleError(f"pipeline factor {k}: expected >= 1")
    if k == 1:
        return s
    cut = _native_cutter()
    done = cut(s.lanes, k, Instr, Ref, Dep, Lane) if cut is not None else None
    if done is None:   # engine calls, malformed refs, or no compiled module: cut here
        lanes = _pipeline_lanes(s, k)
    else:
        lanes, single, apart = done
        if not single and not (apart and not s.inplace):
            _check_pipelinable(s)   # runs of several chunks must line up (raises if not)
    return dataclasses.replace(s, nchunks=s.nchunks * k, lanes=lanes)


def _pipeline_lanes(s: Schedule, k: int) -> tuple:
    """:func:`pipeline`'s lanes, in Python (after checking ``s``)."""
    _check_pipelinable(s)
    new = tuple.__new__   # named tuples without their __new__: a plan cuts 10^4-10^5 of them

    def pieces(instrs) -> tuple:
        out = []
        add = out.append
        for op, (rank, buf, chunk, count), srcs, deps, engine_op, group in instrs:
            first = chunk * k
            srcs = [(r[0], r[1], r[2] * k, r[3]) for r in srcs]
            deps = [(d[0], d[1], d[2] * k) for d in deps]
            for j in range(k):
                add(new(Instr, (op, new(Ref, (rank, buf, first + j * count, count)),
                                tuple([new(Ref, (r, b, c + j * m, m)) for r, b, c, m in srcs]),
                                tuple([new(Dep, (r, n, i + j)) for r, n, i in deps]),
                                engine_op, group)))
        return tuple(out)

    return tuple(tuple(Lane(pieces(lane.instrs)) for lane in rl) for rl in s.lanes)


def _native_cutter():
    """``collectx._fastpath.pipeline_lanes`` (:func:`pipeline`'s cutting, in C), or None."""
    from .._native import compiled_helper
    return compiled_helper("pipeline_lanes")


def _check_pipelinable(s: Schedule) -> None:
    """Raise ScheduleError unless :func:`pipeline` may cut ``s`` (see there). Planners cut one
    schedule two, three and five ways: the last few that passed are remembered."""
    if _PASSED.get(id(s)) is s:
        return
    _check_runs(s)
    while len(_PASSED) >= 4:
        _PASSED.pop(next(iter(_PASSED), None), None)   # the oldest (none if cleared meanwhile)
    _PASSED[id(s)] = s   # kept alive, so ids stay unique


_PASSED: dict = {}   # id -> schedule that passed _check_pipelinable


def forget_passed() -> None:
    """Drop the schedules :func:`_check_pipelinable` remembers (see :func:`simulate.forget`)."""
    _PASSED.clear()


def _check_runs(s: Schedule) -> None:
    """:func:`_check_pipelinable`'s walk over every instruction."""
    written: set = set()
    runs: set = set()
    for rl in s.lanes:
        for lane in rl:
            for ins in lane.instrs:
                if ins.op == "engine":
                    raise ScheduleError(f"cannot pipeline {ins}: an engine call moves its "
                                        f"data itself")
                written.add(ins.dst)
                runs.update(ins.srcs)
    if all(r.count == 1 for r in runs) and all(r.count == 1 for r in written):
        return   # single chunks are the same chunk or disjoint, aliased or not (most trees)
    if s.inplace:
        written = {alias(s, r) for r in written}
        runs = {alias(s, r) for r in runs}
    _check_runs_apart(written, runs | written)


def _check_runs_apart(written: set, every: set) -> None:
    """Raise ScheduleError where a run of ``written`` overlaps another run of ``every`` in
    part. Runs sorted by buffer and start that overlap form a cluster; a cluster of two or
    more runs with a written one in it is such an overlap. Runs only read may overlap (a
    broadcast root's whole input copy and its chunks). Vectorized: a staggered tree plan
    names 10^5 runs."""
    every = sorted(every)   # Refs sort by rank, buffer, first chunk
    buf_id: dict = {}
    rows = np.array([(r[0], buf_id.setdefault(r[1], len(buf_id)), r[2], r[3]) for r in every],
                    dtype=np.int64).reshape(-1, 4)
    rank, buf, chunk, count = rows.T
    new_buffer = np.ones(len(rows), dtype=bool)
    new_buffer[1:] = (rank[1:] != rank[:-1]) | (buf[1:] != buf[:-1])
    span = int((chunk + count).max(initial=0)) + 1
    start = chunk + (np.cumsum(new_buffer) - 1) * span   # buffers laid out one after another
    reach = np.maximum.accumulate(start + count)
    fresh = np.ones(len(rows), dtype=bool)
    fresh[1:] = start[1:] >= reach[:-1]
    cluster = np.cumsum(fresh) - 1
    size = np.bincount(cluster)
    hit = np.bincount(cluster, weights=[r in written for r in every]) > 0
    bad = np.flatnonzero(hit & (size > 1))
    if len(bad):
        members = np.flatnonzero(cluster == bad[0])
        raise ScheduleError(f"cannot pipeline: {every[members[0]]} and {every[members[-1]]} "
                            f"overlap in part and one is written, so the pieces of one would "
                            f"not match those of the other")


def join_shares(a: Schedule, b: Schedule) -> Schedule:
    """One schedule running ``a`` and ``b`` on disjoint chunks of every unit (see module doc).

    Raises
    ------
    ScheduleError
        The two are not the same collective on the same ranks (root, in-place flag).

    Examples
    --------
    >>> from collectx.schedule import ScheduleBuilder, verify
    >>> def bcast():
    ...     b = ScheduleBuilder("broadcast", 2, nchunks=1, root=0)
    ...     d = b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    ...     _ = b.copy(1, 0, Ref(1, "output", 0), Ref(0, "output", 0), deps=[d])
    ...     return b.build()
    >>> j = join_shares(bcast(), refine(bcast(), 2))
    >>> j.nchunks, [len(rl) for rl in j.lanes], verify(j).instructions
    (3, [2, 2], 4)
    """
    rooted = a.collective in ("broadcast", "reduce", "sendrecv")
    for field in ("collective", "nranks", "inplace") + (("root",) if rooted else ()):
        if getattr(a, field) != getattr(b, field):
            raise ScheduleError(f"join_shares: {field} {getattr(a, field)!r} vs "
                                f"{getattr(b, field)!r}; expected two schedules of one request")
    total = a.nchunks + b.nchunks
    first = _Remap(a, total, 0, 0)
    lanes = [list(rl) for rl in first.lanes()]
    for r, rl in enumerate(_Remap(b, total, a.nchunks, [len(x) for x in a.lanes]).lanes()):
        lanes[r] += rl
    return dataclasses.replace(
        a, nchunks=total, lanes=tuple(tuple(rl) for rl in lanes),
        scratch_units=tuple(map(max, a.scratch_units, b.scratch_units)),
        host_units=tuple(map(max, a.host_units, b.host_units)),
        algorithm=f"{a.algorithm}+{b.algorithm}" if b.algorithm else a.algorithm,
        meta=a.meta + (("shares", ((a.algorithm, a.nchunks), (b.algorithm, b.nchunks))),))


class _Remap:
    """One part's instructions moved to chunks ``[offset, offset + s.nchunks)`` of each unit."""

    def __init__(self, s: Schedule, total: int, offset: int, lane_offset):
        self.s, self.total, self.offset = s, total, offset
        self.lane_offset = lane_offset if isinstance(lane_offset, list) else [lane_offset] * s.nranks
        self.last: dict[Dep, int] = {}   # old Dep -> index of its last piece in the new lane

    def lanes(self) -> list[list[Lane]]:
        # Two passes: piece boundaries first (so every Dep's last piece is known, wherever it
        # points), then each instruction is built once with its new refs and deps.
        cuts = [[[self._cuts(ins) for ins in lane.instrs] for lane in rl] for rl in self.s.lanes]
        for r, rl in enumerate(cuts):
            for li, lane in enumerate(rl):
                end = -1
                for i, edges in enumerate(lane):
                    end += len(edges) - 1
                    self.last[Dep(r, li, i)] = end
        return [[Lane(tuple(p for ins, edges in zip(lane.instrs, lc)
                            for p in self._pieces(ins, edges)))
                 for lane, lc in zip(rl, rc)] for rl, rc in zip(self.s.lanes, cuts)]

    def _dep(self, d: Dep) -> Dep:
        return Dep(d.rank, d.lane + self.lane_offset[d.rank], self.last[d])

    def _cuts(self, ins: Instr) -> tuple[int, ...]:
        """Piece boundaries of ``ins`` (relative chunk offsets, 0 and its count included)."""
        n = self.s.nchunks
        refs = (ins.dst, *ins.srcs)
        if all(x.chunk % n + x.count <= n for x in refs):
            return (0, ins.dst.count)          # the common case: inside one unit
        if ins.op == "engine":                 # engine spans differ by design
            raise ScheduleError("join_shares: an engine step spans several units; "
                                "expected schedules of copy/reduce only")
        return tuple(sorted({0, ins.dst.count} | {t for x in refs
                                                  for t in range(n - x.chunk % n, x.count, n)}))

    def _pieces(self, ins: Instr, edges: tuple[int, ...]) -> list[Instr]:
        deps = tuple(map(self._dep, ins.deps))
        return [Instr(ins.op, self._ref(ins.dst, lo, hi),
                      tuple(self._ref(x, lo, hi) for x in ins.srcs), deps, ins.engine_op,
                      ins.group) for lo, hi in zip(edges, edges[1:])]

    def _ref(self, x: Ref, lo: int, hi: int) -> Ref:
        unit, i = divmod(x.chunk + lo, self.s.nchunks)
        return Ref(x.rank, x.buf, unit * self.total + self.offset + i, hi - lo)
