"""Export a schedule to MSCCL's algorithm XML, so collectx plans also run inside NCCL via MSCCL.

How it works: instructions are lowered in one topological order of the happens-before graph.
A copy between two ranks becomes a send (``s``) on the source rank and a receive (``r``) on the
destination rank; a local copy is ``cpy``. A reduce into rank d receives its first remote source
with ``rrc`` (receive, reduce with a local source, copy to dst) or ``r`` when it has no local
source, folds further local sources with ``re`` and further remote ones with ``rrc``; every
remote source sends with ``s``. So an n-ary reduce of k remote sources is k send/receive pairs.

Threadblocks: an MSCCL threadblock has one send peer and one receive peer, and a connection
(sender, receiver, channel) is matched in FIFO order. Lane ``l`` of the executing rank is
channel ``l``; on each GPU a lane's steps go to threadblocks of that channel, reusing one
whose send (or receive) peer is free, so a ring lane is one threadblock. Because every
threadblock receives its steps in the same global topological order, sends and receives of a
connection line up and no threadblock can wait on one that waits on it.

Dependencies: MSCCL dependencies are per GPU, one per step (extra ones become ``nop`` steps, as
MSCCL's own generator does). A step waits for the last step, on the same GPU, of each
instruction its instruction depends on (lane predecessor and deps); steps of one instruction on
one GPU run in order. A dependency on an instruction with no step on that GPU is carried by the
send/receive that moves the data (a data hazard always shares a GPU with both instructions).
Refs keep their own buffers; ``inplace`` is written as the schedule says.

Limits of the MSCCL runtime are not enforced here (256 steps per threadblock, ``cnt`` < 72,
32 threadblocks per channel): plans with thousands of instructions per rank need fewer, larger
chunks before they load into NCCL.
"""

from __future__ import annotations

from ..errors import ArgumentError, ScheduleError
from ._graph import Graph, build_graph, topo_order
from .host import host_as_scratch
from .ir import Instr, Ref, Schedule
from .msccl_xml import MscclAlgo, MscclGpu, MscclStep, MscclTb, parse_msccl_xml, render

_BUF = {"input": "i", "output": "o", "scratch": "s"}
_COLL = {"sendrecv": "custom"}
PROTOCOLS = ("Simple", "LL", "LL128")

__all__ = ["to_msccl_xml", "lower_to_msccl", "parse_msccl_xml"]


def to_msccl_xml(schedule: Schedule, name: str | None = None, proto: str = "Simple") -> str:
    """MSCCL algorithm XML for ``schedule``.

    Parameters
    ----------
    schedule : Schedule
        A schedule without engine steps (MSCCL runs within one NCCL communicator).
    name : str, optional
        The algorithm name (default: ``collectx_<algorithm>_<collective>``).
    proto : str
        MSCCL protocol: ``Simple``, ``LL`` or ``LL128``.

    Returns
    -------
    str
        The XML document; :func:`parse_msccl_xml` reads it back.

    Examples
    --------
    >>> from collectx.schedule import ScheduleBuilder, Ref
    >>> b = ScheduleBuilder("broadcast", 2, nchunks=1, root=0)
    >>> d = b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    >>> _ = b.copy(1, 0, Ref(1, "output", 0), Ref(0, "output", 0), deps=[d])
    >>> algo = parse_msccl_xml(to_msccl_xml(b.build(), name="bcast"))
    >>> [[st.type for tb in g.tbs for st in tb.steps] for g in algo.gpus]
    [['cpy', 's'], ['r']]
    """
    return render(lower_to_msccl(schedule, name, proto))


def lower_to_msccl(schedule: Schedule, name: str | None = None,
                   proto: str = "Simple") -> MscclAlgo:
    """The :class:`~.msccl_xml.MscclAlgo` of ``schedule``; each step's ``origin`` is its IR Dep.

    MSCCL buffers are device memory only: ``host`` buffers (PCIe relays) are exported as more
    scratch (:func:`~.host.host_as_scratch`), so the result is the same but NCCL moves those
    chunks over its own transport (NVLink between NVLink peers) instead of through host memory.
    """
    if proto not in PROTOCOLS:
        raise ArgumentError(f"MSCCL protocol {proto!r}; expected one of {', '.join(PROTOCOLS)}")
    s = host_as_scratch(schedule)
    g = build_graph(s)
    engine = [v for v in range(len(g)) if g.instrs[v].op == "engine"]
    if engine:
        raise ScheduleError(f"{g.name(engine[0])}: MSCCL has no inter-node engine steps; "
                            "expected a schedule of copy/reduce only (export each node's part)")
    low = _Lowering(s, g)
    for v in topo_order(g):
        low.instruction(v)
    return low.algo(name or f"collectx_{s.algorithm or 'plan'}_{s.collective}", proto)


class _Lowering:
    """Threadblock bookkeeping while steps are appended in topological order."""

    def __init__(self, s: Schedule, g: Graph):
        self.s, self.g = s, g
        self.gpus = [MscclGpu(r, *(s.units(r, b) * s.nchunks for b in ("input", "output",
                                                                         "scratch")))
                     for r in range(s.nranks)]
        self.peer_tb: dict[tuple, int] = {}   # (rank, "send"|"recv", peer, chan) -> tb
        self.home_tb: dict[tuple, int] = {}   # (rank, exec rank, lane) -> tb for local steps
        self.last: dict[tuple[int, int], tuple[int, int]] = {}  # (node, rank) -> (tb, step)

    # -- one instruction ------------------------------------------------------------------------
    def instruction(self, v: int) -> None:
        d, ins = self.g.ids[v], self.g.instrs[v]
        for rank, role, peer, step in _steps(ins):
            waits = ([self.last[(v, rank)]] if (v, rank) in self.last else
                     [self.last[(p, rank)] for p in self.g.preds[v] if (p, rank) in self.last])
            tb = self._tb(rank, role, peer, (d.rank, d.lane), d.lane)
            step.origin = d
            self.last[(v, rank)] = self._append(rank, tb, step, waits)

    def _append(self, rank: int, tb: int, step: MscclStep, waits) -> tuple[int, int]:
        tbs = self.gpus[rank].tbs
        latest: dict[int, int] = {}
        for t, i in waits:
            if t != tb:  # steps of one threadblock already run in order
                latest[t] = max(latest.get(t, -1), i)
        pending = sorted(latest.items())
        for t, i in pending[:-1]:  # MSCCL steps carry one dependency: the rest wait in nops
            tbs[tb].steps.append(MscclStep("nop", depid=t, deps=i, origin=step.origin))
            tbs[t].steps[i].hasdep = 1
        if pending:
            step.depid, step.deps = pending[-1]
            tbs[step.depid].steps[step.deps].hasdep = 1
        tbs[tb].steps.append(step)
        return tb, len(tbs[tb].steps) - 1

    # -- threadblock choice -----------------------------------------------------------------------
    def _tb(self, rank: int, role: str, peer: int, lane_key: tuple, chan: int) -> int:
        tbs = self.gpus[rank].tbs
        home = self.home_tb.get((rank, *lane_key))
        if role == "local":
            if home is None:
                home = self.home_tb[(rank, *lane_key)] = self._new_tb(rank, chan)
            return home
        key = (rank, role, peer, chan)
        if key in self.peer_tb:
            return self.peer_tb[key]
        free = [t for t in ([home] if home is not None else []) + list(range(len(tbs)))
                if tbs[t].chan == chan and getattr(tbs[t], role) == -1]
        tb = free[0] if free else self._new_tb(rank, chan)
        setattr(tbs[tb], role, peer)
        self.peer_tb[key] = tb
        self.home_tb.setdefault((rank, *lane_key), tb)
        return tb

    def _new_tb(self, rank: int, chan: int) -> int:
        tbs = self.gpus[rank].tbs
        tbs.append(MscclTb(id=len(tbs), chan=chan))
        return len(tbs) - 1

    def algo(self, name: str, proto: str) -> MscclAlgo:
        chans = [tb.chan for gpu in self.gpus for tb in gpu.tbs]
        per_loop = max((max(gpu.i_chunks, gpu.o_chunks) for gpu in self.gpus), default=1)
        return MscclAlgo(name=name, coll=_COLL.get(self.s.collective, self.s.collective),
                         ngpus=self.s.nranks, nchunksperloop=per_loop,
                         nchannels=max(chans, default=0) + 1, inplace=self.s.inplace,
                         proto=proto, gpus=self.gpus)


def _steps(ins: Instr) -> list[tuple[int, str, int, MscclStep]]:
    """(rank, role, peer, step) for one instruction, in the order each rank runs them."""
    y = ins.dst
    if ins.op == "copy":
        (x,) = ins.srcs
        if x.rank == y.rank:
            return [(y.rank, "local", -1, _step("cpy", x, y))]
        return [(x.rank, "send", y.rank, _step("s", x, y)),
                (y.rank, "recv", x.rank, _step("r", x, y))]
    local = [x for x in ins.srcs if x.rank == y.rank]
    remote = [x for x in ins.srcs if x.rank != y.rank]
    out = [(x.rank, "send", y.rank, _step("s", x, y)) for x in remote]
    if remote:
        first = _step("rrc", local[0], y) if local else _step("r", remote[0], y)
        out.append((y.rank, "recv", remote[0].rank, first))
    elif local[0] != y:
        out.append((y.rank, "local", -1, _step("cpy", local[0], y)))
    out += [(y.rank, "local", -1, _step("re", x, y)) for x in local[1:]]
    out += [(y.rank, "recv", x.rank, _step("rrc", y, y)) for x in remote[1:]]
    return out


def _step(kind: str, src: Ref, dst: Ref) -> MscclStep:
    return MscclStep(kind, srcbuf=_BUF[src.buf], srcoff=src.chunk, dstbuf=_BUF[dst.buf],
                     dstoff=dst.chunk, cnt=dst.count)
