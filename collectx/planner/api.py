"""The planner's front door: :func:`plan` (judged, for people and tools) and
:func:`make_schedule` (the same choice, for the runtime's per-size-class cache).

Stages of :func:`plan`, one line each below: resolve the allocation -> bound -> pick (plan and
simulate every candidate) or run the algorithm -> verify -> package a frozen :class:`Plan`."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import networkx as nx

from .._concurrent import shared_threads
from .._gc import paused
from ..errors import NoFeasiblePlan, PlanError, TopologyError, integral
from ..schedule.ir import Schedule
from . import registry, select
from ._build import check_args
from .registry import PlannerFn

@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """A schedule with what is known about it: prediction, bound, efficiency.

    ``ranks[i]`` is the topology node that runs schedule rank ``i``. ``predicted`` is the
    simulator's result (None when it is unavailable), ``bound`` the cut bound of the allocation
    (``bound_busbw`` is the reference for allreduce), ``efficiency`` predicted busbw / bound.
    ``no_communication`` says why nothing moves between ranks (one rank, or no bytes): such a
    plan has no bound and no efficiency. ``planning_time_s`` is the wall time of choosing,
    building, simulating and bounding the plan; ``verify_time_s`` that of the symbolic verification after it (0 without one), which
    grows with the instruction count: about 5 s for the 212,000 instructions of a 16-GPU
    MI250 allreduce, planned in 2 s."""

    collective: str
    algorithm: str
    ranks: tuple[str, ...]
    nbytes: int
    schedule: Schedule
    predicted: Any = None
    bound: Any = None
    efficiency: float | None = None
    planning_time_s: float = 0.0
    verified: bool = False
    verify_time_s: float = 0.0
    no_communication: str | None = None

    def to_dict(self) -> dict:
        """The JSON fields of ``collectx plan --json`` (bandwidths in GB/s, times in us)."""
        return {**self.summary(), "schedule": self.schedule.to_dict()}

    def summary(self) -> dict:
        """:meth:`to_dict` without the schedule: serializing a 16-GPU schedule of 200k
        instructions takes seconds, and a text report needs none of it."""
        p, b = self.predicted, self.bound
        return {
            "collective": self.collective, "ranks": list(self.ranks),
            "algorithm": self.algorithm, "nbytes": self.nbytes,
            "predicted_time_us": getattr(p, "time_us", None),
            "predicted_algbw_GBps": getattr(p, "algbw_GBps", None),
            "predicted_busbw_GBps": getattr(p, "busbw_GBps", None),
            "bound_busbw_GBps": getattr(b, "bound_busbw", None),
            "ceiling_busbw_GBps": getattr(b, "ceiling_busbw", None),
            "efficiency": self.efficiency, "no_communication": self.no_communication,
            "planning_time_s": self.planning_time_s, "verified": self.verified,
            "verify_time_s": self.verify_time_s}


@paused
def plan(topo: nx.DiGraph, collective: str, nbytes: int, *,
         gpus: Sequence[int | str] | None = None, algo: str | PlannerFn | None = None,
         root: int = 0, inplace: bool = False, nchunks: int | None = None,
         verify: bool = True, host_relays: bool = True) -> Plan:
    """Plan one collective on an allocation of a topology, and say how good the plan is.

    Parameters
    ----------
    topo : nx.DiGraph
        The topology (not modified). GPUs outside ``gpus`` are removed before planning: they
        belong to other jobs and must not relay traffic.
    collective : str
        allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall or sendrecv.
    nbytes : int
        Message size in bytes (nccl-tests convention: the full output of allgather, the full
        input of reduce_scatter, the buffer of the other collectives).
    gpus : sequence of int or str, optional
        GPU indices (into ``collectx.topology.gpus(topo)``) or ids; default all GPUs.
    algo : str or callable, optional
        None lets the cost model choose among the registered algorithms; a name of
        :data:`~collectx.planner.ALGORITHMS` or a planner callable forces one.
    root : int
        Root rank (index into the allocation) of broadcast/reduce, sender of sendrecv.
    inplace : bool
        Plan for aliased input and output buffers.
    nchunks : int, optional
        Chunks per payload unit; default: the algorithm's choice for this size.
    verify : bool
        Symbolically verify the schedule (raises if it is wrong).
    host_relays : bool
        The executor has host buffers: packed trees may stage tree edges through host
        memory over PCIe beside the direct links (schedules then use ``host`` buffers).
        Runtimes whose executor has none (CUDA) pass False; the bound then leaves host
        staging out too (:func:`~.bounds.peer_bounds`).

    Returns
    -------
    Plan

    Raises
    ------
    PlanError
        Unknown collective or algorithm, bad root, unsupported combination.
    TopologyError
        A GPU not in the topology, or listed twice.
    NoFeasiblePlan
        The allocation is disconnected, or no algorithm can serve the request.

    Examples
    --------
    >>> from collectx.topology import switch
    >>> p = plan(switch(4), "allgather", 1 << 20, algo="direct")
    >>> p.algorithm, p.ranks, p.verified
    ('direct', ('GPU0', 'GPU1', 'GPU2', 'GPU3'), True)
    """
    t0 = time.perf_counter()
    ranks, view = allocation(topo, gpus)                       # resolve the allocation
    name, schedule, predicted, bound, idle = _chosen(        # bound, then pick or run
        view, ranks, collective, nbytes, algo, root, inplace, nchunks, host_relays, whole=True)
    planned = time.perf_counter()
    verified = _verify(schedule) if verify else False           # verify
    return Plan(collective=collective, algorithm=name, ranks=ranks, nbytes=_byte_count(nbytes),
                schedule=schedule, predicted=predicted, bound=bound,
                efficiency=_efficiency(predicted, bound), verified=verified,
                no_communication=idle, planning_time_s=planned - t0,
                verify_time_s=time.perf_counter() - planned if verify else 0.0)


def _chosen(view, ranks, collective, nbytes, algo, root, inplace, nchunks, host, whole):
    """``(name, schedule, predicted, bound, why nothing moves)``: the choice both front doors
    make. The bound steers the choice; where ``whole`` it is solved in full (a cut left out
    for speed is solved beside planning), else only where the choice needs it."""
    nbytes = _byte_count(nbytes)
    root, nchunks = check_args(collective, len(ranks), root, nchunks)   # here, not per planner
    if algo is None and _multi_machine(view, ranks, collective):  # clusters: phases + engine
        algo = "hierarchical"
    idle = no_communication(len(ranks), nbytes)
    with shared_threads():
        bound = None if idle or not (whole or algo is None) else \
            _bound(view, collective, ranks, root, host, cut=False)
        with ThreadPoolExecutor(1) as beside:   # a cut left out is solved beside planning
            rest = whole and bound and bound.cut_busbw is None and beside.submit(
                _bound, view, collective, ranks, root, host)
            name, schedule, predicted = _planned(view, ranks, collective, nbytes, algo, root,
                                                 inplace, nchunks, host, bound)
        bound = rest.result() if rest else bound
    forget_candidates()                                        # free them now, not next plan
    return name, schedule, predicted, bound, idle


def _planned(view, ranks, collective, nbytes, algo, root, inplace, nchunks, host, bound):
    """(name, schedule, predicted): the cost model's choice, or the algorithm asked for."""
    if algo is None:
        return select.choose(view, ranks, collective, nbytes, root=root, inplace=inplace,
                             nchunks=nchunks, host=host, bound=bound)
    name = registry.name_of(algo)
    extra = {"host": host} if name in select.PACKED else {}
    schedule = registry.call(algo, view, ranks, collective, nbytes, root=root,
                             inplace=inplace, nchunks=nchunks, **extra)
    if schedule.algorithm.startswith(name):   # blink+host: the name says what it staged
        name = schedule.algorithm
    return name, schedule, select.predict(schedule, view, nbytes, ranks, name)


@paused
def make_schedule(topo: nx.DiGraph | None, collective: str, nranks: int, nbytes: int, *,
                  algo: str | PlannerFn | None = None, root: int = 0, inplace: bool = False,
                  nchunks: int | None = None, host_relays: bool = True) -> Schedule:
    """A schedule for the first ``nranks`` GPUs of ``topo``: what :func:`plan` would choose,
    without verification.

    The runtime calls this once per (collective, size class) and caches the result.
    ``topo=None`` means one host's shared memory (:func:`collectx.topology.host`): every rank
    reaches every other in one hop. ``host_relays`` as in :func:`plan`; runtimes without host
    buffers (CUDA) pass False.

    Examples
    --------
    >>> s = make_schedule(None, "allreduce", 4, 1 << 20)
    >>> s.algorithm, s.nranks
    ('direct', 4)
    """
    from ..topology import gpus as all_gpus, host
    if topo is None:
        topo = host(nranks)
    have = all_gpus(topo)
    if not 1 <= nranks <= len(have):
        raise PlanError(f"{nranks} ranks on a topology with {len(have)} GPUs: expected "
                        f"1..{len(have)}; pass a topology that has a node per rank")
    ranks, view = allocation(topo, have[:nranks])
    return _chosen(view, ranks, collective, nbytes, algo, root, inplace, nchunks, host_relays,
                   whole=False)[1]


def forget_candidates() -> None:
    """Drop what the simulator remembers of the candidate schedules of the plan just made.
    Its memo keeps each schedule it saw alive (so that ids stay unique); kept past the plan,
    schedules of 10^4-10^5 instructions were freed during the next plan, which also grew
    slower with every plan in a row from the scattered memory."""
    from ..schedule.simulate import forget
    forget()


def allocation(topo: nx.DiGraph, gpus: Sequence[int | str] | None
               ) -> tuple[tuple[str, ...], nx.DiGraph]:
    """Resolve ``gpus`` to node ids and the topology view the planners see.

    Raises TopologyError for unknown or repeated GPUs and NoFeasiblePlan when the chosen GPUs
    cannot all reach each other once the other GPUs are removed."""
    from ..topology import gpus as all_gpus, resolve_gpus, subset
    if topo is None or not (order := all_gpus(topo)):
        raise TopologyError("the topology has no GPU (rank) nodes; expected nodes of kind "
                            "'gpu' (CPU ranks are RANK<i> nodes of kind gpu)")
    ranks = tuple(order if gpus is None else resolve_gpus(topo, gpus))
    if not ranks:
        raise PlanError("an empty GPU list: a collective needs at least one rank")
    view = subset(topo, ranks)
    _check_connected(view, ranks)
    return ranks, view


def _check_connected(view: nx.DiGraph, ranks: tuple[str, ...]) -> None:
    strong = next(c for c in nx.strongly_connected_components(view) if ranks[0] in c)
    cut_off = [r for r in ranks if r not in strong]
    if cut_off:
        raise NoFeasiblePlan(f"GPUs {', '.join(cut_off)} cannot reach {ranks[0]} once GPUs "
                             f"outside the allocation are removed; choose GPUs that are "
                             f"connected through links, switches or CPUs")


def _multi_machine(view: nx.DiGraph, ranks: tuple[str, ...], collective: str) -> bool:
    from .hierarchical import suits
    return suits(view, ranks, collective)


def no_communication(nranks: int, nbytes: int) -> str | None:
    """Why a collective of ``nbytes`` on ``nranks`` moves nothing between ranks, or None when
    it does: one rank has no peer, and zero bytes have nothing to move (a schedule still
    synchronizes the ranks). No bandwidth bound applies to such a call, and its busbw says
    nothing.

    >>> no_communication(1, 1 << 20)
    'one rank: nothing moves between ranks'
    >>> no_communication(4, 0), no_communication(4, 64) is None
    ('0 bytes: nothing to move', True)
    """
    if nranks < 2:
        return "one rank: nothing moves between ranks"
    if nbytes == 0:
        return "0 bytes: nothing to move"
    return None


def _byte_count(nbytes) -> int:
    if integral(nbytes) is None or nbytes < 0:
        raise PlanError(f"nbytes={nbytes!r}: expected a non-negative integer byte count")
    return int(nbytes)


def _verify(schedule: Schedule) -> bool:
    from ..schedule.verify import verify
    verify(schedule)  # raises a ScheduleError subclass naming the first bad instruction
    return True


def _bound(view: nx.DiGraph, collective: str, ranks: tuple[str, ...], root: int,
           host: bool = True, cut: bool = True):
    from ..topology.flows import max_flows
    from ..topology.routes import uneven_planes
    from .bounds import KINDS, Bounds, bounds, peer_bounds
    if collective in KINDS and not host:
        return peer_bounds(view, collective, gpus=list(ranks), root=root)
    if collective in KINDS:   # cuts overstate uneven planes' fixed stripes: the routes' LP
        b = bounds(view, collective, gpus=list(ranks), root=root, cut=cut)
        lp = uneven_planes(view) and not _multi_machine(view, ranks, collective) and \
            peer_bounds(view, collective, list(ranks), root, True)   # (clusters: by phase)
        return dataclasses.replace(lp, ceiling_busbw=b.ceiling_busbw) if lp and \
            lp.bound_busbw < b.bound_busbw * (1 - 1e-6) else b
    if collective == "sendrecv" and len(ranks) > 1:
        # One sender, one receiver: the best possible is the max flow between them.
        peer = ranks[(root + 1) % len(ranks)]
        flow = max_flows(view, "bw_gbps")(ranks[root], peer)
        return Bounds(kind="maxflow", bound_busbw=flow, ceiling_busbw=None, cut_busbw=flow,
                      tree_busbw=None, notes=f"max flow {ranks[root]} -> {peer}", gpus=tuple(ranks))
    return None


def _efficiency(predicted, bound) -> float | None:
    ref = getattr(bound, "bound_busbw", None)
    got = getattr(predicted, "busbw_GBps", None)
    return None if not ref or got is None else got / ref
