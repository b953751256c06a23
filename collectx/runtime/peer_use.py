"""Which of a rank's user buffers its peers may use in place, across processes.

From a size on (engine.cma_min_bytes) a rank can publish the address of its input or output
instead of staging it in the window, and peers read it with process_vm_readv and write its
output with process_vm_writev (native/src/executor_cma.cpp). When the call's input and output
share memory that is safe only if no write over an input chunk can land before every rank has
read it. This module decides both from the schedule (:class:`PeerUse`) and names the ways
input and output can share memory (the ``alias`` codes the Communicator passes with every
call).
"""

from __future__ import annotations

from ..schedule._graph import build_graph, topo_order, vector_clocks
from ..schedule.ir import Schedule

BUFS = ("input", "output")        # the user's buffers
# How a call's input and output share memory (Communicator works it out per call):
DISJOINT, SAME, OVERLAP = 0, 1, 2
IN_AT_UNIT = 1 << 16   # + u: the input is unit u of the output (allgather in place, NCCL style)
OUT_AT_UNIT = 2 << 16  # + u: the output is unit u of the input (reduce_scatter in place)


def unit_of(alias: int) -> tuple[str, int] | None:
    """``(buffer, u)`` for a unit-offset ``alias``: the named buffer (the shorter one) is unit
    ``u`` of the other; None for the other codes.

    >>> unit_of(IN_AT_UNIT + 2), unit_of(OUT_AT_UNIT + 1), unit_of(SAME)
    (('input', 2), ('output', 1), None)
    """
    if alias >= OUT_AT_UNIT:
        return "output", alias - OUT_AT_UNIT
    if alias >= IN_AT_UNIT:
        return "input", alias - IN_AT_UNIT
    return None


def chunk_shift(alias: int, nchunks: int) -> int | None:
    """For input and output sharing memory as ``alias`` says: the ``shift`` such that input
    chunk ``j`` is output chunk ``j + shift`` (chunks count across units); None when they are
    disjoint or overlap some other way.

    >>> chunk_shift(SAME, 4), chunk_shift(IN_AT_UNIT + 2, 4), chunk_shift(OUT_AT_UNIT + 1, 4)
    (0, 8, -4)
    """
    if alias == SAME:
        return 0
    unit = unit_of(alias)
    if unit is None:
        return None
    buf, u = unit
    return u * nchunks if buf == "input" else -u * nchunks


class PeerUse:
    """How the ranks of one schedule use each other's input and output buffers: what decides
    whether a rank's buffers may be read by peers across processes, in the user's memory.

    >>> from collectx.planner import make_schedule
    >>> use = PeerUse(make_schedule(None, "allgather", 2, 1 << 20))
    >>> use.buffers(1, DISJOINT), use.buffers(1, IN_AT_UNIT + 1), use.buffers(1, OVERLAP)
    ((True, False), (True, True), (False, False))
    >>> use.everywhere()
    True
    """

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.read: set[tuple[int, str]] = set()   # (rank, buffer) some other rank reads
        self.wrote: set[tuple[int, str]] = set()  # (rank, buffer) some other rank writes
        for d, ins in schedule.instructions():
            if ins.dst.rank != d.rank:
                self.wrote.add((ins.dst.rank, ins.dst.buf))
            self.read.update((r.rank, r.buf) for r in ins.srcs if r.rank != d.rank)
        self._clocks = None
        self._rbw: dict[tuple[int, int], bool] = {}
        self._own: dict[int, tuple[frozenset[int], frozenset[int]]] = {}
        self._uses: dict[int, tuple[dict[int, list[int]], dict[int, list[int]]]] = {}

    def touched(self, rank: int, buf: str) -> bool:
        """Whether another rank reads or writes ``rank``'s ``buf`` (for an in-place schedule,
        its input or output: they are one storage, and refs keep their rank when resolved)."""
        bufs = BUFS if self.schedule.inplace else (buf,)
        return any((rank, b) in self.read or (rank, b) in self.wrote for b in bufs)

    def buffers(self, rank: int, alias: int) -> tuple[bool, bool]:
        """(input, output) of ``rank`` that peers may use in the user's memory.

        An input qualifies when peers read it (they never write one); an output when peers read
        or write it (a peer writes it with a pushed copy, ``collectx/schedule/push.py``).
        Disjoint input and output qualify one by one. Input and output that share memory as a
        whole buffer or one unit of the other (see :func:`chunk_shift`) qualify together, and
        only if no write of an output chunk can clobber the input chunk under it before every
        rank has read it (:meth:`reads_before_writes`); other overlaps and in-place schedules
        never.
        """
        s = self.schedule
        if s.inplace:
            return False, False
        ok = {"input": (rank, "input") in self.read and (rank, "input") not in self.wrote,
              "output": self.touched(rank, "output")}
        if alias == DISJOINT:
            return ok["input"], ok["output"]
        shift = chunk_shift(alias, s.nchunks)
        if shift is None or not self._fits(rank, alias):
            return False, False
        both = (all(ok[b] or not self.touched(rank, b) for b in BUFS) and any(ok.values())
                and self.reads_before_writes(rank, shift))
        return both, both

    def layouts(self, rank: int) -> list[int]:
        """The ways ``rank``'s input and output can share memory: disjoint; the same memory
        when they are equally long; or, NCCL style, the shorter as the longer one's unit
        ``rank`` (allgather, reduce_scatter in place)."""
        units_in, units_out = (self.schedule.units(rank, b) for b in BUFS)
        if units_in == units_out:
            return [DISJOINT, SAME]
        return [DISJOINT, (IN_AT_UNIT if units_in < units_out else OUT_AT_UNIT) + rank]

    def _fits(self, rank: int, alias: int) -> bool:
        """``alias`` is one of ``rank``'s possible :meth:`layouts` (any unit of the longer)."""
        units = {b: self.schedule.units(rank, b) for b in BUFS}
        if alias == SAME:
            return units["input"] == units["output"]
        buf, u = unit_of(alias)
        other = "output" if buf == "input" else "input"
        return units[buf] == 1 and u < units[other]

    def everywhere(self) -> bool:
        """True if, in every one of its :meth:`layouts`, no rank stages anything: every buffer
        peers touch qualifies on every rank."""
        s = self.schedule
        if s.inplace:
            return False
        for r in range(s.nranks):
            for alias in self.layouts(r):
                got = self.buffers(r, alias)
                if any(self.touched(r, b) and not g for b, g in zip(BUFS, got)):
                    return False
        return True

    def reads_before_writes(self, rank: int, shift: int) -> bool:
        """True if, with input chunk ``j`` of ``rank`` stored as its output chunk ``j + shift``,
        every read of an input chunk, by any rank, happens before every write over it: then the
        two may share the user's memory with nothing staged. A write may also read what it
        overwrites, element by element (the kernels read before they write), and a copy of an
        input chunk onto itself writes nothing (the executor skips it); it still reads."""
        key = (rank, shift)
        if key not in self._rbw:
            g, vc = self._graph()
            writes, reads = self._chunk_uses(rank)
            self._rbw[key] = all(
                _before(g, vc, r, w, rank, shift)
                for j, ws in writes.items() for w in ws
                if not _onto_itself(g.instrs[w], rank, shift)
                for r in reads.get(j - shift, ()))
        return self._rbw[key]

    def own_writes(self, rank: int) -> tuple[frozenset[int], frozenset[int]]:
        """(output chunks of ``rank`` that only its own instructions write, those of them under
        which every read of the same input chunk by ``rank`` happens before every write, or is
        the writing instruction itself reading element by element): what the executor may
        write through to the user's output right away when input and output are disjoint, and
        when they are the same memory (see ``FlatPlan.through_mask``)."""
        if rank not in self._own:
            g, vc = self._graph()
            writes, reads = self._chunk_uses(rank)
            mine = lambda v: g.ids[v].rank == rank  # noqa: E731
            only = frozenset(j for j, ws in writes.items() if all(map(mine, ws)))
            ordered = frozenset(j for j in only if all(
                _before(g, vc, r, w, rank, 0)
                for w in writes[j] for r in reads.get(j, ()) if mine(r)))
            self._own[rank] = only, ordered
        return self._own[rank]

    def _chunk_uses(self, rank: int) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """(output chunk of ``rank`` -> instructions writing it, input chunk of ``rank`` ->
        instructions reading it), instructions as nodes of :meth:`_graph`."""
        if rank not in self._uses:
            g, _ = self._graph()
            writes: dict[int, list[int]] = {}
            reads: dict[int, list[int]] = {}
            for v, ins in enumerate(g.instrs):
                d = ins.dst
                if d.rank == rank and d.buf == "output":
                    for j in range(d.chunk, d.chunk + d.count):
                        writes.setdefault(j, []).append(v)
                for ref in ins.srcs:
                    if ref.rank == rank and ref.buf == "input":
                        for j in range(ref.chunk, ref.chunk + ref.count):
                            reads.setdefault(j, []).append(v)
            self._uses[rank] = writes, reads
        return self._uses[rank]

    def _graph(self):
        if self._clocks is None:
            g = build_graph(self.schedule)
            self._clocks = g, vector_clocks(g, topo_order(g))
        return self._clocks


def _before(g, vc, r: int, w: int, rank: int, shift: int) -> bool:
    """Whether read ``r`` of ``rank``'s input is done before write ``w`` over it: ``r`` happens
    before ``w``, or is ``w`` itself reading only under what it writes (element by element).
    (A node's clock holds itself, so the clock test alone would also pass ``r == w``.)"""
    if r == w:
        return _elementwise(g.instrs[w], rank, shift)
    return vc[w, g.lane_of[r]] >= g.ids[r].index


def _elementwise(ins, rank: int, shift: int) -> bool:
    """An instruction that reads ``rank``'s input only under the output chunks it writes."""
    return all(x.chunk + shift == ins.dst.chunk for x in ins.srcs
               if x.rank == rank and x.buf == "input")


def _onto_itself(ins, rank: int, shift: int) -> bool:
    """A copy of ``rank``'s input chunks onto the output chunks stored over them."""
    (src,) = ins.srcs if ins.op == "copy" else (None,)
    return (src is not None and src.rank == rank and src.buf == "input"
            and src.chunk + shift == ins.dst.chunk and src.count == ins.dst.count)
