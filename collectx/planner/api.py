"""The planner's front door: :func:`plan` (judged, for people and tools) and
:func:`make_schedule` (cheap, for the runtime's per-size-class cache).

Stages of :func:`plan`, one line each below: resolve the allocation -> pick or run the algorithm
-> verify -> simulate -> bound -> package a frozen :class:`Plan`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import networkx as nx

from .._gc import paused
from ..errors import NoFeasiblePlan, PlanError, TopologyError
from ..schedule.ir import COLLECTIVES, Schedule
from . import registry, select
from .registry import PlannerFn

# Allreduce bounds this close are a tie: trees with host edges are planned both ways then (as
# reduce-scatter + allgather forests and as reduce/broadcast trees; see host_relay.INTEGRATED),
# up to TIE_BOTH_UP_TO ranks. Of the DGX-1 allocations, 4-GPU ones gained (DGX-1P GPUs 0, 1,
# 4, 5: 0.934 -> 0.970); both full machines tie too, gained nothing, took 0.14-0.3 s longer.
BOUND_TIE = 1e-6
TIE_BOTH_UP_TO = 7


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
    MI250 allreduce, planned in 2 s.
    """

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
        Let the cost-model choice stage a share of the data through host memory over PCIe
        beside the direct links (:mod:`~.host_relay`; schedules then use ``host`` buffers).
        Runtimes whose executor has no host buffers (CUDA) pass False. Ignored with ``algo``.

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
    _check_request(collective, nbytes)
    ranks, view = allocation(topo, gpus)                       # resolve the allocation
    if algo is None and _multi_machine(view, ranks, collective):  # clusters: phases + engine
        algo = "hierarchical"
    bound_memo: dict = {}                                      # relays may need it first
    if algo is None:                                           # pick (or run) the algorithm
        name, schedule, predicted = select.choose(view, ranks, collective, nbytes, root=root,
                                                  inplace=inplace, nchunks=nchunks)
        if host_relays and nchunks is None:                    # PCIe beside NVLink
            name, schedule, predicted = _with_relays(view, ranks, collective, nbytes, root,
                                                     inplace, (name, schedule, predicted),
                                                     bound_memo)
    else:
        name = registry.name_of(algo)
        schedule = registry.call(algo, view, ranks, collective, nbytes, root=root,
                                 inplace=inplace, nchunks=nchunks)
        predicted = select.predict(schedule, view, nbytes, ranks, name)
    idle = no_communication(len(ranks), nbytes)
    bound = None if idle else bound_memo.get("bound") or _bound(view, collective, ranks, root)
    forget_candidates()                                        # free them now, not next plan
    planned = time.perf_counter()
    verified = _verify(schedule) if verify else False           # verify
    return Plan(collective=collective, algorithm=name, ranks=ranks, nbytes=int(nbytes),
                schedule=schedule, predicted=predicted, bound=bound,
                efficiency=_efficiency(predicted, bound), verified=verified,
                no_communication=idle, planning_time_s=planned - t0,
                verify_time_s=time.perf_counter() - planned if verify else 0.0)


@paused
def make_schedule(topo: nx.DiGraph | None, collective: str, nranks: int, nbytes: int, *,
                  algo: str | PlannerFn | None = None, root: int = 0, inplace: bool = False,
                  nchunks: int | None = None, host_relays: bool = True) -> Schedule:
    """A schedule for the first ``nranks`` GPUs of ``topo``, without simulation or bounds.

    The runtime calls this once per (collective, size class) and caches the result. With
    ``algo=None`` the analytic cost model (no simulator) chooses. ``topo=None`` means one
    host's shared memory (:func:`collectx.topology.host`): every rank reaches every other in
    one hop, so the direct algorithm is chosen. ``host_relays`` as in :func:`plan`: with
    ``algo=None``, a topology with CPUs and direct GPU links, and a large message, the chosen
    schedule is joined with a share staged through host memory where the simulator finds that
    faster; runtimes without host buffers (CUDA) pass False.

    Examples
    --------
    >>> s = make_schedule(None, "allreduce", 4, 1 << 20)
    >>> s.algorithm, s.nranks
    ('direct', 4)
    """
    _check_request(collective, nbytes)
    from ..topology import gpus as all_gpus, host
    if topo is None:
        topo = host(nranks)
    have = all_gpus(topo)
    if not 1 <= nranks <= len(have):
        raise PlanError(f"{nranks} ranks on a topology with {len(have)} GPUs: expected "
                        f"1..{len(have)}; pass a topology that has a node per rank")
    ranks, view = allocation(topo, have[:nranks])
    if algo is None:
        name = select.choose_analytic(view, ranks, collective, nbytes)
        schedule = registry.call(name, view, ranks, collective, nbytes, root=root,
                                 inplace=inplace, nchunks=nchunks)
        if host_relays and nchunks is None and _relays_possible(view, ranks):
            predicted = select.predict(schedule, view, nbytes, ranks, name)
            schedule = _with_relays(view, ranks, collective, nbytes, root, inplace,
                                    (name, schedule, predicted))[1]
            forget_candidates()
        return schedule
    return registry.call(algo, view, ranks, collective, nbytes, root=root, inplace=inplace,
                         nchunks=nchunks)


def forget_candidates() -> None:
    """Drop what the simulator and the pipeline cutter remember of the candidate schedules of
    the plan just made. Their memos keep each schedule they saw alive (so that ids stay
    unique); kept past the plan, up to 16 schedules of 10^4-10^5 instructions were freed
    during the next plan, which also grew slower with every plan in a row from the scattered
    memory (DGX-1P GPUs 0, 1, 3, 4, 6, 7 allreduce, eight in a row: 0.93 s up to 1.10 s; freed
    at the end of each, 0.70-0.77 s: ``perf/planner_internals.py``)."""
    from ..schedule.simulate import forget
    from ..schedule.split import forget_passed
    forget()
    forget_passed()


def _relays_possible(view: nx.DiGraph, ranks: tuple[str, ...]) -> bool:
    """Cheap test before any simulation: a CPU and a direct GPU link in the allocation."""
    from .host_relay import relay_view
    return relay_view(view, ranks) is not None


def _with_relays(view, ranks, collective, nbytes, root, inplace, chosen, bound_memo=None):
    """``chosen`` joined with a host-relayed share where that simulates faster."""
    from .host_relay import COLLECTIVES as RELAYED, MIN_BYTES, with_host_relays
    if collective not in RELAYED or nbytes < MIN_BYTES or chosen[2] is None or \
            not _relays_possible(view, ranks):
        return chosen
    bound = _bound(view, collective, ranks, root)
    if bound_memo is not None:   # plan() reports the same bound: compute it once
        bound_memo["bound"] = bound
    tree, cut = (getattr(bound, "tree_busbw", None) or 0), (getattr(bound, "cut_busbw", None) or 0)
    tie = abs(tree - cut) <= BOUND_TIE * max(tree, cut) and len(ranks) <= TIE_BOTH_UP_TO
    trees_lead = None if tie else tree > cut
    return with_host_relays(view, ranks, collective, nbytes, chosen,
                            getattr(bound, "bound_busbw", None), root=root, inplace=inplace,
                            trees_lead=trees_lead)


def allocation(topo: nx.DiGraph, gpus: Sequence[int | str] | None
               ) -> tuple[tuple[str, ...], nx.DiGraph]:
    """Resolve ``gpus`` to node ids and the topology view the planners see.

    Raises TopologyError for unknown or repeated GPUs and NoFeasiblePlan when the chosen GPUs
    cannot all reach each other once the other GPUs are removed.
    """
    from ..topology import gpus as all_gpus, subset
    if topo is None or not all_gpus(topo):
        raise TopologyError("the topology has no GPU (rank) nodes; expected nodes of kind "
                            "'gpu' (CPU ranks are RANK<i> nodes of kind gpu)")
    wanted = list(all_gpus(topo) if gpus is None else gpus)
    if not wanted:
        raise PlanError("an empty GPU list: a collective needs at least one rank")
    view = subset(topo, wanted)
    ranks = tuple(g for g in _resolved_order(topo, wanted))
    _check_connected(view, ranks)
    return ranks, view


def _resolved_order(topo: nx.DiGraph, wanted: list) -> list[str]:
    from ..topology import gpus as all_gpus
    order = all_gpus(topo)
    return [order[w] if isinstance(w, int) else w for w in wanted]


def _check_connected(view: nx.DiGraph, ranks: tuple[str, ...]) -> None:
    strong = next(c for c in nx.strongly_connected_components(view) if ranks[0] in c)
    cut_off = [r for r in ranks if r not in strong]
    if cut_off:
        raise NoFeasiblePlan(f"GPUs {', '.join(cut_off)} cannot reach {ranks[0]} once GPUs "
                             f"outside the allocation are removed; choose GPUs that are "
                             f"connected through links, switches or CPUs")


def _multi_machine(view: nx.DiGraph, ranks: tuple[str, ...], collective: str) -> bool:
    try:
        from .hierarchical import suits
    except ImportError:
        return False
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


def _check_request(collective: str, nbytes: int) -> None:
    if collective not in COLLECTIVES:
        raise PlanError(f"unknown collective {collective!r}; expected one of "
                        f"{', '.join(COLLECTIVES)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise PlanError(f"nbytes={nbytes!r}: expected a non-negative integer byte count")


def _verify(schedule: Schedule) -> bool:
    from ..schedule.verify import verify
    verify(schedule)  # raises a ScheduleError subclass naming the first bad instruction
    return True


def _bound(view: nx.DiGraph, collective: str, ranks: tuple[str, ...], root: int):
    try:
        from .bounds import KINDS, Bounds, bounds
    except ImportError:  # the cut-bound module is optional; plans stay valid without it
        return None
    if collective in KINDS:
        return bounds(view, collective, gpus=list(ranks), root=root)
    if collective == "sendrecv" and len(ranks) > 1:
        # One sender, one receiver: the best possible is the max flow between them.
        peer = ranks[(root + 1) % len(ranks)]
        flow = nx.maximum_flow_value(view, ranks[root], peer, capacity="bw_gbps")
        return Bounds(kind="maxflow", bound_busbw=flow, ceiling_busbw=None, cut_busbw=flow,
                      tree_busbw=None, notes=f"max flow {ranks[root]} -> {peer}",
                      gpus=tuple(ranks))
    return None


def _efficiency(predicted, bound) -> float | None:
    ref = getattr(bound, "bound_busbw", None)
    got = getattr(predicted, "busbw_GBps", None)
    if not ref or got is None:
        return None
    return got / ref
