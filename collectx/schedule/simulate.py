"""Predict a schedule's time on a topology: routes, fair link sharing, per-hop latency.

How it works: each instruction becomes *flows*. The executing rank ``e`` pulls every source that
lives on another rank (a flow ``src rank -> e``) and pushes its result when the destination is on
another rank (a flow ``e -> dst rank``), so an n-ary reduce of k remote sources moves k streams;
an instruction touching only ``e``'s memory is one flow over ``e``'s local memory. A flow of B
bytes crosses the direct link between the two nodes; through an NVSwitch fabric it is striped over
every switch route in proportion to the max-flow between the pair (as the hardware stripes
traffic over all switch planes); otherwise it takes the widest route (fewest hops among equally
wide ones, see :func:`collectx.topology.paths.widest_path`). Each part starts after the route's summed latency, and then shares every link on it max-min fairly with
the other active flows (:mod:`._fairshare`). An instruction starts when its lane predecessor
and deps have completed, and completes with its last flow. Engine calls run as a ring over their
group in group order (see :func:`_engine_flows`).

Units: bytes, microseconds, GB/s = 1e9 B/s. The result never beats the link capacities, because
no flow is given more than a fair share of any link it crosses.
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from ..errors import ArgumentError
from ._fairshare import FlowLoop
from ._graph import build_graph
from ._routes import Routes, routes_for
from .engine_steps import engine_groups, span_ratio
from .ir import Instr, Schedule, range_span
from .metrics import algbw, bus_factor, unit_bytes


@dataclasses.dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` predicts for one message size.

    ``link_util[(u, v)]`` is bytes carried / (capacity x time): the fraction of the run the
    directed link would be busy at full rate. ``link_bytes[(u, v)]`` is the bytes it carried.
    Only links that carried data appear.
    """

    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    link_util: dict
    link_bytes: dict
    nbytes: int


def simulate(schedule: Schedule, topo: nx.DiGraph, nbytes: int, *, ranks=None,
             dtype_size: int = 4, local_bw_gbps: float | None = None) -> SimResult:
    """Simulate ``schedule`` on ``topo`` for a message of ``nbytes`` (nccl-tests convention).

    Parameters
    ----------
    schedule : Schedule
        Any schedule; it is not verified here (call :func:`verify` for that).
    topo : networkx.DiGraph
        The topology (treated as immutable: routes are cached per graph object).
    nbytes : int
        Message size as nccl-tests counts it (see :func:`unit_bytes`).
    ranks : sequence of node ids, optional
        ``ranks[i]`` is the node of schedule rank ``i``; default the first ``nranks`` GPUs.
    dtype_size : int
        Element size; chunk sizes are whole elements as the executors cut them.
    local_bw_gbps : float, optional
        Bandwidth of rank-local copies; default per node (see :mod:`._routes`).

    Returns
    -------
    SimResult

    Examples
    --------
    >>> from collectx.topology import ring
    >>> from collectx.schedule import ScheduleBuilder, Ref
    >>> b = ScheduleBuilder("sendrecv", 2, nchunks=1)
    >>> _ = b.copy(0, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    >>> r = simulate(b.build(), ring(2, bw=25.0), nbytes=25_000_000)
    >>> round(r.time_us, 1), round(r.link_util["GPU0", "GPU1"], 3)
    (1000.7, 0.999)
    """
    s = schedule
    nodes = _rank_nodes(s, topo, ranks)
    routes = routes_for(topo, local_bw_gbps)
    unit = unit_bytes(s.collective, nbytes, s.nranks)
    elems = int(unit // dtype_size)
    size = lambda ref: range_span(ref.chunk, ref.count, s.nchunks, elems)[1] * dtype_size  # noqa

    g = build_graph(s)
    groups = engine_groups(s, g)
    jg = groups.joined_graph(g)
    tasks = [(v,) for v in range(len(g)) if g.instrs[v].op != "engine"] + groups.calls
    task_of = {v: t for t, members in enumerate(tasks) for v in members}
    succs: list[list[int]] = [[] for _ in range(len(g))]
    for v, ps in enumerate(jg.preds):
        for p in ps:
            succs[p].append(v)
    waiting = [len(ps) for ps in jg.preds]
    flows_left = [0] * len(tasks)
    flow_task: list[int] = []
    started = [False] * len(tasks)
    link_bytes: dict[int, float] = {}

    def start(t: int) -> None:
        if started[t]:
            return
        started[t] = True
        members = tasks[t]
        if g.instrs[members[0]].op == "engine":
            flows = _engine_flows(g, members, nodes, size)
        else:
            flows = _instr_flows(g.ids[members[0]].rank, g.instrs[members[0]], nodes, size)
        parts = [(nb * share, route, lat) for a, b, nb in flows
                 for route, lat, share in routes.spread(a, b)]
        flows_left[t] = len(parts)
        for nb, route, lat in parts:
            flow_task.append(t)
            loop.add(nb, route, lat)
            for link in route:
                link_bytes[link] = link_bytes.get(link, 0.0) + nb
        if not flows:
            finish(t, loop.now)

    def finish(t: int, now: float) -> None:
        for v in tasks[t]:
            for w in succs[v]:
                waiting[w] -= 1
                if waiting[w] == 0:
                    start(task_of[w])

    def on_flow_done(f: int, now: float) -> None:
        t = flow_task[f]
        flows_left[t] -= 1
        if flows_left[t] == 0:
            finish(t, now)

    loop = FlowLoop(routes.capacity, on_flow_done, routes.classes)
    for v in range(len(g)):
        if waiting[v] == 0:
            start(task_of[v])
    time_us = loop.run()
    _check_all_ran(g, started, task_of)
    return _result(s, nbytes, time_us, routes, link_bytes)


def _rank_nodes(s: Schedule, topo: nx.DiGraph, ranks) -> list:
    from ..topology import gpus

    nodes = list(gpus(topo)[:s.nranks] if ranks is None else ranks)
    if len(nodes) != s.nranks:
        raise ArgumentError(f"{len(nodes)} topology nodes for a {s.nranks}-rank schedule; "
                            f"expected ranks= to map every schedule rank to a node")
    missing = [n for n in nodes if n not in topo]
    if missing:
        raise ArgumentError(f"ranks {missing} are not nodes of the topology; expected ids "
                            f"such as {list(topo.nodes)[:3]}")
    return nodes


def _instr_flows(rank: int, ins: Instr, nodes: list, size) -> list[tuple]:
    nb = size(ins.dst)
    flows = [(nodes[x.rank], nodes[rank], nb) for x in ins.srcs if x.rank != rank]
    if ins.dst.rank != rank:
        flows.append((nodes[rank], nodes[ins.dst.rank], nb))
    return flows or [(nodes[rank], nodes[rank], nb)]


def _engine_flows(g, members: tuple[int, ...], nodes: list, size) -> list[tuple]:
    """An engine call as a ring over its group: what each member sends to the next.

    Ring allreduce sends 2(G-1)/G of the buffer per member, allgather / reduce_scatter (G-1)/G of
    the larger (gathered) side, and broadcast a pipeline chain from member 0 (G-1 hops of the
    whole buffer). Per-step latencies of a real engine are not modelled (one route latency).
    """
    gsize = len(members)
    op = g.instrs[members[0]].engine_op
    if gsize == 1:
        return []
    ring = [nodes[g.ids[v].rank] for v in members]
    ins = g.instrs[members[0]]
    big = size(ins.dst) if span_ratio(op, gsize)[1] > 1 else size(ins.srcs[0])
    if op == "broadcast":
        return [(ring[i], ring[i + 1], big) for i in range(gsize - 1)]
    share = (2.0 if op == "allreduce" else 1.0) * (gsize - 1) / gsize * big
    return [(ring[i], ring[(i + 1) % gsize], share) for i in range(gsize)]


def _check_all_ran(g, started: list[bool], task_of: dict) -> None:
    stuck = [v for v in range(len(g)) if not started[task_of[v]]]
    if stuck:
        from ..errors import DependencyCycle
        raise DependencyCycle(f"{len(stuck)} instructions never became ready, first "
                              f"{g.name(stuck[0])}; expected an acyclic schedule (run verify)")


def _result(s: Schedule, nbytes: int, time_us: float, routes: Routes,
            link_bytes: dict[int, float]) -> SimResult:
    seconds = time_us * 1e-6
    util, carried = {}, {}
    for link, nb in link_bytes.items():
        key = routes.names[link]
        if key[0] == "local" or nb <= 0:
            continue
        carried[key] = nb
        util[key] = nb / (routes.capacity[link] * time_us) if time_us > 0 else 0.0
    return SimResult(time_us=time_us, algbw_GBps=algbw(nbytes, seconds),
                     busbw_GBps=algbw(nbytes, seconds) * bus_factor(s.collective, s.nranks),
                     link_util=util, link_bytes=carried, nbytes=nbytes)
