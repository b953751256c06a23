"""Host buffers: scratch in a rank's host memory, and how interpreters without them run them.

Why host buffers exist: a copy between two GPUs joined by NVLink always goes over NVLink, so the
PCIe bandwidth between such GPUs (DGX-1: both under one PCIe switch, or both under one CPU) is
reachable only by staging through host memory. The writer copies a chunk into a pinned buffer
of host memory (PCIe up to the CPU), the reader copies it out (PCIe down). In the IR that
buffer is ``host``: per-rank scratch that the simulator places on the rank's host node
(:meth:`~._routes.Routes.host_of`) and the verifier treats exactly like scratch.

Interpreters whose memory is all one kind run host buffers as more scratch:
:func:`host_as_scratch` appends each rank's host units after its scratch units. The CPU executor
(where host memory *is* the shared window) and the MSCCL export use it; the CUDA runtime plans
without host buffers (``plan(..., host_relays=False)``).
"""

from __future__ import annotations

import dataclasses

from .ir import Instr, Lane, Ref, Schedule


def host_as_scratch(s: Schedule) -> Schedule:
    """``s`` with every ``host`` ref moved into scratch, after the rank's scratch units.

    The result computes the same collective with the same races (none): each rank's host
    chunks map one-to-one onto fresh scratch chunks. A schedule without host buffers is
    returned as is.

    >>> from collectx.schedule import ScheduleBuilder, verify
    >>> b = ScheduleBuilder("broadcast", 2, nchunks=1, root=0)
    >>> h = b.host(0, 1)
    >>> up = b.copy(0, 0, Ref(0, "host", h), Ref(0, "input", 0))
    >>> _ = b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    >>> _ = b.copy(1, 0, Ref(1, "output", 0), Ref(0, "host", h), deps=[up])
    >>> folded = host_as_scratch(b.build())
    >>> folded.scratch_units, folded.uses_host, folded.lanes[1][0].instrs[0].srcs
    ((1, 0), False, (Ref(rank=0, buf='scratch', chunk=0, count=1),))
    >>> verify(folded).instructions
    3
    """
    if not s.uses_host:
        return s
    offset = [u * s.nchunks for u in s.scratch_units]

    def move(ref: Ref) -> Ref:
        if ref.buf != "host":
            return ref
        return Ref(ref.rank, "scratch", offset[ref.rank] + ref.chunk, ref.count)

    lanes = tuple(tuple(Lane(tuple(_moved(ins, move) for ins in lane.instrs)) for lane in rl)
                  for rl in s.lanes)
    scratch = tuple(a + b for a, b in zip(s.scratch_units, s.host_units))
    return dataclasses.replace(s, lanes=lanes, scratch_units=scratch,
                               host_units=(0,) * s.nranks)


def _piece(ins: Instr, i: int) -> Instr:
    """Chunk ``i`` of every ref of ``ins`` (copy and reduce work chunk by chunk)."""
    def one(x: Ref) -> Ref:
        return Ref(x.rank, x.buf, x.chunk + i, 1)
    return ins._replace(dst=one(ins.dst), srcs=tuple(one(x) for x in ins.srcs))


def _moved(ins: Instr, move) -> Instr:
    return ins._replace(dst=move(ins.dst), srcs=tuple(move(x) for x in ins.srcs))


def host_chunks(s: Schedule) -> int:
    """How many chunk transfers read or write a host buffer (0: a plan without host relays)."""
    return sum((ins.dst.buf == "host") + sum(x.buf == "host" for x in ins.srcs)
               for _, ins in s.instructions())


def stage_through_host(s: Schedule, pairs=None) -> Schedule:
    """``s`` with every transfer between two ranks staged through the sender's host buffer.

    ``pairs(a, b)``, if given, says which transfers from rank ``a`` to rank ``b`` to stage; the
    others stay direct (a ring-only library's fallback: NVLink where two GPUs share one, host
    memory where they do not: ``perf/fallback_ring.py``).

    How it works: instructions are re-emitted in one topological order of ``s``. A source on
    another rank ``a`` is first copied by ``a`` into a fresh chunk of ``a``'s ``host`` buffer
    (PCIe up), and the instruction reads it there (PCIe down); one staged copy serves every
    later reader of the same source until the source is written again. A destination on
    another rank ``b`` is written to the executing rank's host buffer instead, and ``b`` copies
    it out; what waited for the original instruction waits for that copy. Staging copies run
    on lanes of their own, one per (rank, peer, direction), appended in the same topological
    order, so every lane is a subsequence of one order of the whole schedule and no wait can
    deadlock. Instructions that move data between ranks are staged chunk by chunk (the copy up
    of one chunk overlaps the copy down of the one before); rank-local ones are kept as they
    are.

    Used by the ring-only baseline (``perf/fallback_ring.py``): a ring planned on the machine,
    then staged wherever two neighbours share no direct link, as such a library runs it.

    >>> from collectx.schedule import ScheduleBuilder, verify
    >>> b = ScheduleBuilder("broadcast", 2, nchunks=1, root=0)
    >>> d = b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    >>> _ = b.copy(1, 0, Ref(1, "output", 0), Ref(0, "output", 0), deps=[d])
    >>> staged = stage_through_host(b.build())
    >>> staged.host_units, host_chunks(staged), verify(staged).instructions
    ((1, 0), 2, 3)
    """
    from ._graph import build_graph, topo_order
    from .builder import ScheduleBuilder

    g = build_graph(s)
    b = ScheduleBuilder(s.collective, s.nranks, s.nchunks, root=s.root, inplace=s.inplace,
                        algorithm=s.algorithm)
    st = _Stager(s, b, pairs or (lambda a, b: True))
    for v in topo_order(g):
        st.emit(g.ids[v], g.instrs[v], [g.ids[p] for p in g.preds[v]])
    return dataclasses.replace(b.build(), scratch_units=s.scratch_units, meta=s.meta)


class _Stager:
    """Bookkeeping of :func:`stage_through_host`: lanes, host chunks, staged copies."""

    def __init__(self, s: Schedule, b, pairs):
        self.s, self.b, self.pairs = s, b, pairs
        self.base = [len(rl) for rl in s.lanes]       # staging lanes follow the originals
        self.extra: list[dict] = [{} for _ in range(s.nranks)]
        self.done: dict = {}        # original Dep -> Dep that completes it
        self.staged: dict = {}      # (rank, buf) -> {(chunk, count): (host Ref, Dep)}
        self.widths: dict = {}      # (rank, buf) -> chunk counts of the runs staged from it

    def emit(self, d, ins: Instr, preds: list) -> None:
        waits = [self.done[p] for p in preds]
        if ins.op == "engine":
            self.done[d] = self.b.engine(d.rank, d.lane, ins.dst, ins.srcs, ins.engine_op,
                                         ins.group, deps=waits)
            return
        moves = self._crosses(ins.dst, d.rank, read=False) or any(
            self._crosses(x, d.rank) for x in ins.srcs)
        # Chunk by chunk, so that the copy up of one chunk overlaps the copy down of the last.
        pieces = [_piece(ins, i) for i in range(ins.dst.count)] if moves else [ins]
        for piece in pieces:
            done = self._emit_piece(d, piece, waits)
        self.done[d] = done

    def _emit_piece(self, d, ins: Instr, waits: list):
        deps = list(waits)
        srcs = []
        for x in ins.srcs:
            if not self._crosses(x, d.rank):
                srcs.append(x)
                continue
            ref, dep = self._staged(x, waits, d.rank)
            srcs.append(ref)
            deps.append(dep)
        dst = ins.dst
        remote = self._crosses(dst, d.rank, read=False)
        if remote:
            dst = self.b.fresh("host", d.rank, ins.dst)
        self._written(ins.dst)
        own = self._add(d.rank, d.lane, ins.op, dst, srcs, deps)
        if not remote:
            return own
        return self._add(ins.dst.rank, self._lane(ins.dst.rank, ("down", d.rank)), "copy",
                         ins.dst, [dst], [own])

    def _crosses(self, x: Ref, rank: int, read: bool = True) -> bool:
        """Whether ``x``, read (or written) by ``rank``, lives on another rank and the transfer
        between the two is staged."""
        if x.rank == rank or x.buf == "host":
            return False
        return self.pairs(x.rank, rank) if read else self.pairs(rank, x.rank)

    def _staged(self, x: Ref, waits: list, reader: int):
        mine = self.staged.setdefault((x.rank, x.buf), {})
        key = (x.chunk, x.count)
        if key not in mine:
            ref = self.b.fresh("host", x.rank, x)
            dep = self._add(x.rank, self._lane(x.rank, ("up", reader)), "copy", ref, [x],
                            list(waits))
            mine[key] = (ref, dep)
            self.widths.setdefault((x.rank, x.buf), set()).add(x.count)
        return mine[key]

    def _written(self, ref: Ref) -> None:
        # A source written again needs a fresh staged copy for its later readers.
        mine = self.staged.get((ref.rank, ref.buf))
        if not mine:
            return
        if ref.count < len(mine) and self.widths[ref.rank, ref.buf] == {1}:
            for c in range(ref.chunk, ref.chunk + ref.count):   # staged pieces are one chunk
                mine.pop((c, 1), None)
            return
        for k in [k for k in mine if k[0] < ref.chunk + ref.count and ref.chunk < k[0] + k[1]]:
            del mine[k]

    def _lane(self, rank: int, key) -> int:
        lanes = self.extra[rank]
        return self.base[rank] + lanes.setdefault(key, len(lanes))

    def _add(self, rank, lane, op, dst, srcs, deps):
        deps = [x for x in dict.fromkeys(deps) if x is not None and
                not (x.rank == rank and x.lane == lane)]   # lane order already waits for them
        if op == "copy":
            return self.b.copy(rank, lane, dst, srcs[0], deps=deps)
        return self.b.reduce(rank, lane, dst, srcs, deps=deps)
