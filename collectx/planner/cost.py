"""The cost model: ``t = base + steps * alpha + bytes / busbw``.

``steps`` is the schedule's critical path (longest chain of dependent instructions), ``alpha``
the per-step latency of the allocation's link class (:mod:`.cost_tables`). The bandwidth term
comes from the simulator (link contention, per-hop wire latency), which :func:`.select.predict`
combines with the latency terms; the choice made by :mod:`.select` and the predicted time it
reports are one number.
"""

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
    its class is its worst link (``shm`` when there is no topology: one host's shared memory).
    """
    if topo is None:
        return "shm"
    pairs = known_pairs(schedule)
    if pairs is None:
        pairs = {(other, rank) for rank, rank_lanes in enumerate(schedule.lanes)
                 for other in _ranks_named(rank_lanes) if other != rank}
    worst = 0
    router = Router(topo)     # prepared once: a plan's pairs all ask the same graph
    for a, b in pairs:
        _, cls = widest_path(topo, ranks[a], ranks[b], router=router)
        worst = max(worst, LINK_ORDER.index(cls) if cls in LINK_ORDER else len(LINK_ORDER) - 1)
    return LINK_ORDER[worst] if pairs else "shm"


def _ranks_named(rank_lanes) -> set:
    """The ranks whose buffers one rank's instructions name (a plan has 10^4-10^5 of them:
    this is a set comprehension over plain tuples, not a walk that builds a Dep for each)."""
    return {ref[0] for lane in rank_lanes for ins in lane.instrs for ref in (ins[1], *ins[2])}


def device_kind(topo: nx.DiGraph | None, ranks: tuple[str, ...]) -> str:
    if topo is None:
        return "cpu"
    return "cpu" if topo.nodes[ranks[0]].get("device") == "cpu" else "gpu"


def latency_terms(schedule: Schedule, topo: nx.DiGraph | None, ranks: tuple[str, ...],
                  algorithm: str) -> tuple[float, float]:
    """``(base, alpha)`` in microseconds for one schedule on one allocation."""
    return base_us(topo, ranks), alpha_us(link_class(schedule, topo, ranks), algorithm)


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


def overhead_us(schedule: Schedule, topo: nx.DiGraph | None, ranks: tuple[str, ...],
                algorithm: str) -> float:
    """The latency terms ``base + steps * alpha`` of one schedule on one allocation.

    >>> from collectx.planner.direct import plan_direct
    >>> round(overhead_us(plan_direct(None, ("A", "B"), "allreduce", 64), None, ("A", "B"),
    ...                   "direct"), 1)  # CPU base 2 us + 2 steps of 1 us over shared memory
    4.0
    """
    base, alpha = latency_terms(schedule, topo, ranks, algorithm)
    return base + steps(schedule) * alpha


def transfer_us(nbytes: int, busbw_GBps: float, factor: float) -> float:
    """The bandwidth term: ``bytes * factor / busbw`` in microseconds (GB/s = 1e3 bytes/us).

    >>> transfer_us(1 << 30, 100.0, 1.0)  # 1 GiB at 100 GB/s
    10737.41824
    """
    if nbytes == 0:
        return 0.0
    return nbytes * factor / (busbw_GBps * 1e3)


def widest_path(topo: nx.DiGraph, a: str, b: str, avoid: frozenset = frozenset(),
                router: Router | None = None) -> tuple[float, str]:
    """Bottleneck GB/s and worst link class of the widest ``a -> b`` route avoiding ``avoid``
    (:func:`collectx.topology.paths.widest_path`; ``router``: one prepared on ``topo``, to
    share among many questions); ``(0.0, "net")`` when there is none.

    >>> from collectx.topology import line
    >>> widest_path(line(3), "GPU0", "GPU2")
    (25.0, 'nvlink')
    """
    try:
        route = (router or Router(topo)).widest(a, b, avoid=avoid - {a, b})
    except TopologyError:
        return 0.0, "net"
    types = [topo.edges[u, v].get("type") for u, v in zip(route.hops, route.hops[1:])]
    worst = max((LINK_ORDER.index(t) if t in LINK_ORDER else len(LINK_ORDER) - 1
                 for t in types), default=0)
    return route.bw_gbps, LINK_ORDER[worst]
