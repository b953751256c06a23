"""The cost model: ``t = base + steps * alpha + bytes / busbw``.

``steps`` is the schedule's critical path (longest chain of dependent instructions), ``alpha``
the per-step latency of the allocation's link class (:mod:`.cost_tables`). The bandwidth term
comes from the simulator (link contention, per-hop wire latency), which :func:`.select.predict`
combines with the latency terms; the choice made by :mod:`.select` and the predicted time it
reports are one number."""

from __future__ import annotations

import networkx as nx

from ..errors import TopologyError
from ..schedule._graph import depths, topo_order
from ..schedule.ir import Schedule
# The simulator keeps what it read of the schedules it just ran (critical path, rank pairs):
# the cost model's usual next question is about one of them.
from ..schedule.simulate import known_pairs, known_steps, schedule_graph
from ..topology.paths import Router
from .cost_tables import BASE_US, LINK_ORDER, alpha_us


def steps(schedule: Schedule) -> int:
    """Longest chain of dependent instructions (lane order plus explicit deps).

    >>> from collectx.planner.direct import plan_direct
    >>> steps(plan_direct(None, ("A", "B", "C"), "allreduce", 64))  # reduce, then copy
    2
    """
    # Over the dense happens-before graph in topological order: pipelined schedules have
    # thousands of instructions, and integer lists are several times cheaper than a walk keyed
    # by Dep. Raises DependencyCycle for a schedule that could never finish.
    known = known_steps(schedule)
    if known is not None:
        return known
    g = schedule_graph(schedule)
    return max(depths(g, topo_order(g)), default=0)


def link_class(schedule: Schedule, topo: nx.DiGraph | None, ranks: tuple[str, ...]) -> str:
    """The worst link class among the routes the schedule's remote reads and writes take.

    Each route is the widest path between the two ranks (GPUs may relay, as NVLink peers do);
    its class is its worst link (``shm`` when there is no topology: one host's shared memory)."""
    if topo is None:
        return "shm"
    pairs = known_pairs(schedule)
    if pairs is None:
        pairs = {(other, rank) for rank, rank_lanes in enumerate(schedule.lanes)
                 for other in _ranks_named(rank_lanes) if other != rank}
    router = Router(topo)     # prepared once: a plan's pairs all ask the same graph
    worst = max((_route_class(topo, router, ranks[a], ranks[b]) for a, b in pairs), default=0)
    return LINK_ORDER[worst] if pairs else "shm"


def _ranks_named(rank_lanes) -> set:
    """The ranks whose buffers one rank's instructions name (a plan has 10^4-10^5 of them:
    this is a set comprehension over plain tuples, not a walk that builds a Dep for each)."""
    return {ref[0] for lane in rank_lanes for ins in lane.instrs for ref in (ins[1], *ins[2])}


def device_kind(topo: nx.DiGraph | None, ranks: tuple[str, ...]) -> str:
    return "cpu" if topo is None or topo.nodes[ranks[0]].get("device") == "cpu" else "gpu"


def base_us(topo: nx.DiGraph | None, ranks: tuple[str, ...]) -> float:
    """The fixed per-call latency on this kind of device."""
    return BASE_US[device_kind(topo, ranks)]


def most_steps_us(schedule: Schedule, algorithm: str) -> float:
    """An upper bound on ``steps(schedule) * alpha``: every instruction in one chain, over the
    slowest link class.

    >>> from collectx.planner.direct import plan_direct
    >>> most_steps_us(plan_direct(None, ("A", "B"), "allreduce", 64), "direct") >= 2 * 1.0
    True
    """
    n = sum(len(lane.instrs) for rank_lanes in schedule.lanes for lane in rank_lanes)
    return n * max(alpha_us(cls, algorithm) for cls in LINK_ORDER)


def _route_class(topo: nx.DiGraph, router: Router, a: str, b: str) -> int:
    """The worst link class (an index into :data:`LINK_ORDER`) of the widest ``a -> b`` route;
    ``net``, the slowest, when there is none."""
    try:
        route = router.widest(a, b)
    except TopologyError:
        return len(LINK_ORDER) - 1
    types = [topo.edges[u, v].get("type") for u, v in zip(route.hops, route.hops[1:])]
    return max((LINK_ORDER.index(t) if t in LINK_ORDER else len(LINK_ORDER) - 1
                for t in types), default=0)
