"""Lowering a :class:`~collectx.schedule.ir.Schedule` to the native executor's flat arrays.

The executor (native/src/executor.cpp) runs one rank's lanes; it needs, per rank:

* its lanes as int32 records (op, dst ref, source range, dep range), refs already resolved
  through :func:`~collectx.schedule.ir.alias` for in-place schedules;
* ``fin_deps``: the last instruction of every lane (of any rank) that writes this rank's output,
  so it knows when the output is final and may be copied out;
* whether any *other* rank touches this rank's input or output. If none does, the executor reads
  the user's input / writes the user's output in place instead of staging it in the window.

A :class:`FlatPlan` is built once per (schedule, rank) and cached by the communicator.

>>> from collectx.planner import make_schedule
>>> fp = FlatPlan(make_schedule(None, "allgather", 2, 64), rank=0)
>>> fp.in_private, fp.out_private, fp.units
(False, True, (1, 2, 0))
"""

from __future__ import annotations

from ..errors import PlanError, ScheduleError
from ..schedule.host import host_as_scratch
from ..schedule.ir import MAX_LANES, Dep, Schedule, alias
from ._lib import native
from .peer_use import DISJOINT, SAME, PeerUse

BUF_CODE = {"input": 0, "output": 1, "scratch": 2}
OP_CODE = {"copy": 0, "reduce": 1}
INSTR_WORDS = 9


class FlatPlan:
    """One rank's part of a schedule as the ``cx_exec_plan`` struct (arrays kept alive here),
    for an executor that runs at most ``most_lanes`` lanes per rank."""

    def __init__(self, schedule: Schedule, rank: int, most_lanes: int = MAX_LANES,
                 executor: str = "CPU"):
        if not 0 <= rank < schedule.nranks:
            raise ScheduleError(f"rank {rank} outside a schedule of {schedule.nranks} ranks")
        # On a CPU host, host memory is the shared window: host buffers are more scratch.
        schedule = host_as_scratch(schedule)
        self.schedule, self.rank = schedule, rank
        lanes = schedule.lanes[rank]
        if len(lanes) > most_lanes:
            raise PlanError(f"{schedule.algorithm} schedule gives rank {rank} {len(lanes)} lanes; "
                            f"the {executor} executor runs at most {most_lanes}: plan it for "
                            f"this executor (its planning entry point keeps to its lanes)")
        instrs, srcs, deps, lane_off = [], [], [], [0]
        for lane in lanes:
            for ins in lane.instrs:
                instrs += self._record(ins, srcs, deps)
            lane_off.append(len(instrs) // INSTR_WORDS)
        fin = self._fin_deps()
        self.peer_use = PeerUse(schedule)
        self.in_private = not self.peer_use.touched(rank, "input")
        self.out_private = not self.peer_use.touched(rank, "output")
        scratch = max(schedule.scratch_units) if schedule.scratch_units else 0
        self.units = (schedule.units(rank, "input"), schedule.units(rank, "output"), scratch)
        self.shared = None if schedule.inplace else (self._shared_chunks("input"),
                                                     self._shared_chunks("output"))
        self._struct(lane_off, instrs, srcs, deps, fin)

    def _record(self, ins, srcs: list, deps: list) -> list[int]:
        if ins.op not in OP_CODE:
            raise PlanError(f"instruction op {ins.op!r}: the CPU executor runs copy and reduce "
                            f"only; plan without inter-node engine steps for one host")
        s = self.schedule
        dst = alias(s, ins.dst)
        rec = [OP_CODE[ins.op], dst.rank, BUF_CODE[dst.buf], dst.chunk, dst.count,
               len(srcs) // 4, len(ins.srcs), len(deps) // 3, len(ins.deps)]
        for ref in ins.srcs:
            a = alias(s, ref)
            if a.count != dst.count:
                raise ScheduleError(f"source {ref} spans {a.count} chunks, destination {dst} "
                                    f"spans {dst.count}; expected equal spans")
            srcs += [a.rank, BUF_CODE[a.buf], a.chunk, a.count]
        for d in ins.deps:
            deps += [d.rank, d.lane, d.index]
        return rec

    def _fin_deps(self) -> list[Dep]:
        last: dict[tuple[int, int], int] = {}
        for d, ins in self.schedule.instructions():
            dst = alias(self.schedule, ins.dst)
            if dst.rank == self.rank and dst.buf == "output":
                last[(d.rank, d.lane)] = max(last.get((d.rank, d.lane), -1), d.index)
        return [Dep(r, lane, i) for (r, lane), i in sorted(last.items())]

    def _shared_chunks(self, buf: str) -> bytes:
        """Per chunk (unit * nchunks + chunk) of this rank's ``buf``: 1 if another rank reads or
        writes it (it must then live in the window), 0 if only this rank does."""
        s, me = self.schedule, self.rank
        mask = bytearray(s.units(me, buf) * s.nchunks)
        for d, ins in s.instructions():
            if d.rank == me:
                continue
            for ref in (ins.dst, *ins.srcs):
                if ref.rank == me and ref.buf == buf:
                    mask[ref.chunk:ref.chunk + ref.count] = b"\x01" * ref.count
        return bytes(mask)

    def direct_masks(self, alias: int) -> tuple[bytes, bytes] | None:
        """Which chunks of this rank's input and output a call uses in place in the user's
        buffers (1) rather than staging them in the window (0); None for in-place schedules
        (then ``in_private`` / ``out_private`` decide for whole buffers).

        ``alias``: :data:`DISJOINT` when the user's input and output are disjoint, :data:`SAME`
        when they are the same memory (``allreduce(x)``), anything else when they overlap
        otherwise. When they are the same memory, an input chunk is read in place only if its
        output chunk goes through the window (so it is written back after every read of the
        tile); other overlaps stage the whole input.

        >>> from collectx.planner import make_schedule
        >>> fp = FlatPlan(make_schedule(None, "allreduce", 2, 64), rank=0)
        >>> [list(m) for m in fp.direct_masks(0)], [list(m) for m in fp.direct_masks(1)]
        ([[1, 0], [0, 1]], [[1, 0], [0, 1]])
        """
        if self.shared is None:
            return None
        shared_in, shared_out = self.shared
        out = bytes(1 - v for v in shared_out)
        if alias not in (DISJOINT, SAME):
            return bytes(len(shared_in)), out
        if alias == SAME:
            inp = bytes(int(not a and b) for a, b in zip(shared_in, shared_out))
        else:
            inp = bytes(1 - v for v in shared_in)
        return inp, out

    def through_mask(self, alias: int) -> bytes | None:
        """Which chunks of this rank's output the executor writes through to the user's buffer
        as soon as it computes them (1), instead of copying them out of the window once the
        tile is done; None when none may be.

        A chunk qualifies when it goes through the window (peers read it there), only this
        rank writes it, and, when input and output are the same memory, every read of the
        input chunk under it that is done in place happens before every write (staged input
        chunks are read from the window). Other overlaps and in-place schedules never. The copy
        out reads the window back after the whole tile, when the chunk has left the caches; a
        write-through copies what the kernel just wrote (2-rank 1 MiB allreduce in place: the
        copy out is a quarter of the call).

        >>> from collectx.planner import make_schedule
        >>> fp = FlatPlan(make_schedule(None, "allreduce", 2, 64), rank=0)
        >>> list(fp.through_mask(0)), list(fp.through_mask(1)), fp.through_mask(2)
        ([1, 0], [1, 0], None)
        """
        if self.shared is None or alias not in (DISJOINT, SAME):
            return None
        only, ordered = self.peer_use.own_writes(self.rank)
        direct_in = self.direct_masks(alias)[0]
        shared_out = self.shared[1]
        mask = bytes(int(bool(shared_out[j]) and j in only and
                         (alias == DISJOINT or not direct_in[j] or j in ordered))
                     for j in range(len(shared_out)))
        return mask if any(mask) else None

    def cma_buffers(self, alias: int) -> tuple[bool, bool]:
        """Whether peers may read this rank's input / output across processes, in the user's
        buffers (``cma_in`` / ``cma_out`` of the call), instead of staged copies in the window.

        ``alias`` as in :meth:`direct_masks`; the rules are :meth:`PeerUse.buffers`.

        >>> from collectx.planner import make_schedule
        >>> fp = FlatPlan(make_schedule(None, "allreduce", 2, 1 << 20), rank=0)
        >>> fp.cma_buffers(0), fp.cma_buffers(1), fp.cma_buffers(2)
        ((True, True), (True, True), (False, False))
        """
        return self.peer_use.buffers(self.rank, alias)

    def _struct(self, lane_off, instrs, srcs, deps, fin) -> None:
        ffi, _ = native()
        arr = lambda v: ffi.new("int[]", list(v) or [0])  # noqa: E731  (never a NULL array)
        last = [(r, li, len(lane) - 1) for r, lanes in enumerate(self.schedule.lanes)
                for li, lane in enumerate(lanes) if len(lane)]
        self._keep = [arr(lane_off), arr(instrs), arr(srcs), arr(deps),
                      arr([x for d in fin for x in (d.rank, d.lane, d.index)]),
                      arr([x for d in last for x in d])]
        p = ffi.new("cx_exec_plan*")
        p.nranks, p.rank, p.nchunks = self.schedule.nranks, self.rank, self.schedule.nchunks
        p.nlanes = len(lane_off) - 1
        p.lane_off, p.instrs, p.srcs, p.deps, p.fin_deps, p.all_deps = self._keep
        p.nfin, p.nall = len(fin), len(last)
        p.units = list(self.units)
        self.native = p

    def tile_count(self, set_bytes: int, itemsize: int, tile_bytes: int | None = None) -> int:
        """Elements per unit per tile, a multiple of 64: as many as one staging set holds, or
        fewer when ``tile_bytes`` (the bytes of one tile's slots, all units) is smaller.

        Small tiles keep a tile's slots, on every rank, in the caches while the next tile is
        staged: with whole-message tiles every pass (stage, reduce, copy out) streams from DRAM.
        """
        per_elem = max(1, sum(self.units)) * itemsize
        budget = set_bytes if tile_bytes is None else min(set_bytes, tile_bytes)
        return max(64, (budget // per_elem) // 64 * 64)

