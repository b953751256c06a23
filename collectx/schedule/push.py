"""Pushing copies: a copy of a peer's freshly computed output chunk, run by the rank that
computed it instead of the rank that receives it.

A schedule says who moves each chunk. Planners write the last step of an allreduce as a pull:
rank ``r`` copies rank ``q``'s reduced chunk into its own output once ``q`` has computed it.
Where ranks write each other's buffers directly (CPU ranks with cross-memory attach, GPUs with
peer access), the producer can write the chunk into ``r``'s output itself, right after
computing it: the data is still in the producer's caches, and on a CPU the lines it writes
are those it has just read ``r``'s input chunk from, where the pull reads lines another core
has just written (a 2-rank allreduce of 1 MiB in ``perf/cma_push_model.c``, each rank
rewriting its buffer before every call: 104 µs pulled, 72 µs pushed). :func:`push_copies`
rewrites a schedule that way wherever it is safe. :func:`share_copies` moves copies the other
way for balance: a rank whose peers pull its input while it idles (a broadcast's root) takes
some of those copies and writes them into their outputs itself.

>>> from collectx.planner import make_schedule
>>> s = make_schedule(None, "allreduce", 2, 1 << 20)
>>> [[ins.op for ins in lane.instrs] for lanes in s.lanes for lane in lanes]
[['reduce', 'copy'], ['reduce', 'copy']]
>>> p = push_copies(s)
>>> [[(ins.op, ins.dst.rank) for ins in lane.instrs] for lanes in p.lanes for lane in lanes]
[[('reduce', 0), ('copy', 1)], [('reduce', 1), ('copy', 0)]]
"""

from __future__ import annotations

import dataclasses

from .ir import Dep, Instr, Lane, Schedule


def push_copies(schedule: Schedule) -> Schedule:
    """``schedule`` with every pushable copy moved into the producer's lane, right after the
    instruction that computes its source (the schedule itself when none is).

    A copy is pushable when it copies exactly the output or scratch chunks that its one
    dependency, on another rank, writes, into output chunks of its own rank that no other
    instruction reads or writes. The moved copy keeps every ordering it had: what depended on
    it depends on it in its new place, and the instruction after it in its old lane waits for
    it. Where the source is scratch that nothing else uses (a reduce's partial sum on its way
    to the root), the producer writes the destination itself and the copy goes away.

    >>> from collectx.planner import make_schedule
    >>> s = make_schedule(None, "reduce", 2, 1 << 10, root=0, algo="direct")
    >>> [[(ins.op, ins.dst.rank, ins.dst.buf) for ins in lane.instrs] for lanes in s.lanes
    ...  for lane in lanes]        # rank 1 reduces three pieces, rank 0 pulls each
    [[('copy', 0, 'output'), ('copy', 0, 'output')], [('copy', 0, 'output')], [('reduce', 1, 'scratch'), ('reduce', 1, 'scratch')], [('reduce', 1, 'scratch')]]
    >>> p = push_copies(s)
    >>> [[(ins.op, ins.dst.rank, ins.dst.buf) for ins in lane.instrs] for lanes in p.lanes
    ...  for lane in lanes], p.scratch_units
    ([[], [], [('reduce', 0, 'output'), ('reduce', 0, 'output')], [('reduce', 0, 'output')]], (0, 0))
    """
    if schedule.inplace:
        return schedule
    after: dict[Dep, list[Dep]] = {}
    folds: dict[Dep, Dep] = {}
    scratch = _users(schedule, "scratch")
    for copy, producer in _pushable(schedule).items():
        src = schedule.instr(copy).srcs[0]
        if src.buf == "scratch" and _used_by(scratch, src, 2):   # its producer and this copy
            folds[copy] = producer
        else:
            after.setdefault(producer, []).append(copy)
    return _relocate(schedule, after, {}, keep_lane_order=True, folds=folds)


def share_copies(schedule: Schedule) -> Schedule:
    """``schedule`` with copies that peers pull from a rank's input moved to the front of that
    rank's lane 0, as long as each move leaves the rank with no more to move across ranks than
    the peer it relieves (the schedule itself when none moves).

    A broadcast plan has the root's peers pull everything while the root moves nothing; on CPU
    ranks with a core each the root's core then idles, and half the work moved onto it made a
    2-rank broadcast of 4-64 MiB about 2x as fast on a buffer reused unread, 1.1-1.6x where
    the receiver reads or rewrites it around each call. Only a copy with no dependencies moves,
    into output chunks of its own rank that no other instruction writes and that every other
    reader waits for by name (a one-hop broadcast's relays, whose peers pull each piece once it
    has landed): so the rest of its old lane need not wait for it (its rank waits for every
    writer of its output before it returns). Candidates go in lane order across ranks, so the
    owner relieves every peer alike.

    >>> from collectx.planner import make_schedule
    >>> s = make_schedule(None, "broadcast", 2, 1 << 10, algo="direct")
    >>> [[(ins.dst.rank, ins.srcs[0].rank) for ins in lane.instrs] for lanes in s.lanes
    ...  for lane in lanes]
    [[(0, 0)], [(1, 0), (1, 0)], [(1, 0)]]
    >>> p = share_copies(s)
    >>> [[(ins.dst.rank, ins.srcs[0].rank) for ins in lane.instrs] for lanes in p.lanes
    ...  for lane in lanes]
    [[(1, 0), (0, 0)], [(1, 0)], [(1, 0)]]
    """
    if schedule.inplace:
        return schedule
    first: dict[tuple[int, int], list[Dep]] = {}
    for copy, owner in _shareable(schedule).items():
        first.setdefault((owner, 0), []).append(copy)
    return _relocate(schedule, {}, first, keep_lane_order=False)


def read_own_copies(schedule: Schedule) -> Schedule:
    """``schedule`` with every copy of a peer's input chunks that the peer also copies, as they
    are, into its own output (and nothing else writes there) reading that output instead, once
    written: :func:`push_copies` can then move it into the peer's lane, so the peer reads its
    input once and writes it into every output in the same pass (an allgather's one hop).

    >>> from collectx.planner import make_schedule
    >>> s = make_schedule(None, "allgather", 2, 1 << 10)
    >>> [[(ins.srcs[0].rank, ins.srcs[0].buf, len(ins.deps)) for ins in lane.instrs]
    ...  for lane in read_own_copies(s).lanes[0]]
    [[(1, 'output', 1)], [(0, 'input', 0)]]
    """
    if schedule.inplace:
        return schedule
    uses = _accesses(schedule)
    own: dict = {}      # input ref -> (its owner's verbatim copy, the output ref it writes)
    for d, ins in schedule.instructions():
        (src, *more), dst = ins.srcs, ins.dst
        if (ins.op == "copy" and not more and src.buf == "input" and src.rank == d.rank
                and dst.rank == d.rank and dst.buf == "output"
                and all(w == d for j in dst.chunks() for w, writes in uses[d.rank, j] if writes)):
            own[src] = (d, dst)

    def rewired(r: int, ins: Instr) -> Instr:
        hit = own.get(ins.srcs[0]) if ins.op == "copy" and len(ins.srcs) == 1 else None
        if hit is None or ins.srcs[0].rank == r or ins.deps:
            return ins
        return ins._replace(srcs=(hit[1],), deps=(hit[0],))
    lanes = tuple(tuple(Lane(tuple(rewired(r, ins) for ins in lane.instrs)) for lane in lanes)
                  for r, lanes in enumerate(schedule.lanes))
    return dataclasses.replace(schedule, lanes=lanes) if own else schedule


def drop_empty_lanes(schedule: Schedule) -> Schedule:
    """``schedule`` without the lanes that moving copies left empty, deps renumbered: an
    executor that gives every lane its own blocks would leave theirs idle.

    >>> from collectx.planner import make_schedule
    >>> p = push_copies(make_schedule(None, "allreduce", 4, 1 << 20))
    >>> [len(lanes) for lanes in p.lanes], [len(lanes) for lanes in drop_empty_lanes(p).lanes]
    ([3, 3, 3, 3], [1, 1, 1, 1])
    """
    kept = [[li for li, lane in enumerate(lanes) if lane.instrs] for lanes in schedule.lanes]
    if all(len(k) == len(lanes) for k, lanes in zip(kept, schedule.lanes)):
        return schedule
    new_lane = {(r, old): new for r, olds in enumerate(kept) for new, old in enumerate(olds)}

    def moved(ins: Instr) -> Instr:
        deps = tuple(Dep(d.rank, new_lane[(d.rank, d.lane)], d.index) for d in ins.deps)
        return ins._replace(deps=deps)
    lanes = tuple(tuple(Lane(tuple(moved(ins) for ins in schedule.lanes[r][old].instrs))
                        for old in olds) for r, olds in enumerate(kept))
    return dataclasses.replace(schedule, lanes=lanes)


def _relocate(schedule: Schedule, after: dict[Dep, list[Dep]],
              first: dict[tuple[int, int], list[Dep]], keep_lane_order: bool,
              folds: dict[Dep, Dep] | None = None) -> Schedule:
    """``schedule`` with the copies in ``after`` placed right after their anchors and those in
    ``first`` at the front of their (rank, lane), dropped from their own lanes, and each copy in
    ``folds`` dropped for good, its producer writing its destination instead;
    ``keep_lane_order``: the instruction after a moved copy in its old lane waits for it."""
    folds = folds or {}
    moves = {copy for copies in (*after.values(), *first.values()) for copy in copies}
    moves |= folds.keys()
    if not moves:
        return schedule
    layout: list[list[list[Dep]]] = []
    for r, lanes in enumerate(schedule.lanes):
        layout.append([])
        for li, lane in enumerate(lanes):
            ids: list[Dep] = list(first.get((r, li), ()))
            for i in range(len(lane.instrs)):
                d = Dep(r, li, i)
                if d in moves:
                    continue
                ids.append(d)
                ids.extend(after.get(d, ()))
            layout[r].append(ids)
    new_id = {old: Dep(r, li, i) for r, lanes in enumerate(layout)
              for li, ids in enumerate(lanes) for i, old in enumerate(ids)}
    new_id.update((copy, new_id[producer]) for copy, producer in folds.items())
    dst_of = {producer: schedule.instr(copy).dst for copy, producer in folds.items()}
    # The instruction that followed a moved copy in its old lane now waits for it.
    waits: dict[Dep, Dep] = {}
    for copy in moves if keep_lane_order else ():
        nxt = Dep(copy.rank, copy.lane, copy.index + 1)
        while nxt in moves:
            nxt = Dep(nxt.rank, nxt.lane, nxt.index + 1)
        if nxt.index < len(schedule.lanes[nxt.rank][nxt.lane].instrs):
            waits.setdefault(nxt, copy)
    lanes = tuple(tuple(Lane(tuple(_moved(schedule, old, moves, waits, new_id, dst_of)
                                   for old in ids))
                        for ids in rank_lanes) for rank_lanes in layout)
    moved = dataclasses.replace(schedule, lanes=lanes)
    if not folds:
        return moved
    # Folded copies may leave a rank with no scratch to reserve (bigger tiles).
    using = {rank for rank, _ in _users(moved, "scratch")}
    units = tuple(u if rank in using else 0 for rank, u in enumerate(moved.scratch_units))
    return dataclasses.replace(moved, scratch_units=units)


def _moved(schedule: Schedule, old: Dep, moves, waits, new_id, dst_of) -> Instr:
    ins = schedule.instr(old)
    deps = () if old in moves else tuple(dict.fromkeys(new_id[d] for d in ins.deps))
    if old in waits and new_id[waits[old]] not in deps:
        deps += (new_id[waits[old]],)
    return ins._replace(deps=deps, dst=dst_of.get(old, ins.dst))


def _pushable(schedule: Schedule) -> dict[Dep, Dep]:
    """copy id -> id of the instruction that produces its source, for every pushable copy."""
    users = _users(schedule, "output")
    moves = {}
    for d, ins in schedule.instructions():
        if ins.op != "copy" or len(ins.srcs) != 1 or len(ins.deps) != 1:
            continue
        (src,), (producer,) = ins.srcs, ins.deps
        dst = ins.dst
        if (dst.rank != d.rank or dst.buf != "output" or producer.rank == d.rank
                or src.rank != producer.rank or src.buf not in ("output", "scratch")
                or schedule.instr(producer).dst != src
                or schedule.instr(producer).op not in ("copy", "reduce")):
            continue
        if _used_by(users, dst, 1):
            moves[d] = producer
    return moves


def _shareable(schedule: Schedule) -> dict[Dep, int]:
    """copy id -> rank whose input it reads, for the copies :func:`share_copies` moves."""
    uses = _accesses(schedule)
    load = [0] * schedule.nranks    # chunks each rank moves across ranks
    for d, ins in schedule.instructions():
        load[d.rank] += sum(ref.count for ref in (ins.dst, *ins.srcs) if ref.rank != d.rank)
    shares = {}
    # Lane position first: a one-hop broadcast's pieces in step order, each peer's in turn, so
    # the owner takes some of every peer's pieces, in the order peers relay them.
    for d, ins in sorted(schedule.instructions(), key=lambda t: (t[0].index, t[0].rank)):
        if ins.op != "copy" or len(ins.srcs) != 1 or ins.deps:
            continue
        (src,), dst = ins.srcs, ins.dst
        owner, w = src.rank, dst.count
        if (owner == d.rank or src.buf != "input" or dst.rank != d.rank or dst.buf != "output"
                or not _read_after(schedule, uses, d) or load[owner] + w > load[d.rank] - w):
            continue
        load[owner] += w
        load[d.rank] -= w
        shares[d] = owner
    return shares


def _accesses(schedule: Schedule) -> dict[tuple[int, int], list[tuple[Dep, bool]]]:
    """(rank, output chunk) -> (instruction, writes it) for every instruction using it."""
    uses: dict[tuple[int, int], list[tuple[Dep, bool]]] = {}
    for d, ins in schedule.instructions():
        for ref, writes in ((ins.dst, True), *((src, False) for src in ins.srcs)):
            if ref.buf == "output":
                for j in ref.chunks():
                    uses.setdefault((ref.rank, j), []).append((d, writes))
    return uses


def _read_after(schedule: Schedule, uses, copy: Dep) -> bool:
    """True when ``copy`` is the only instruction writing its output chunks and every other
    one reading them waits for it by name (so the copy may run in any lane)."""
    dst = schedule.instr(copy).dst
    return all(d == copy or (not writes and copy in schedule.instr(d).deps)
               for j in dst.chunks() for d, writes in uses[dst.rank, j])


def _users(schedule: Schedule, buf: str) -> dict[tuple[int, int], int]:
    """(rank, chunk of ``buf``) -> how many instructions read or write it."""
    users: dict[tuple[int, int], int] = {}
    for _, ins in schedule.instructions():
        for ref in (ins.dst, *ins.srcs):
            if ref.buf == buf:
                for j in ref.chunks():
                    users[ref.rank, j] = users.get((ref.rank, j), 0) + 1
    return users


def _used_by(users: dict[tuple[int, int], int], ref, n: int) -> bool:
    return all(users.get((ref.rank, j)) == n for j in ref.chunks())
