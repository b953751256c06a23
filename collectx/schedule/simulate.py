"""Predict a schedule's time on a topology: routes, fair link sharing, per-hop latency.

How it works: each instruction becomes *flows*. The executing rank ``e`` pulls every source that
lives on another rank (a flow ``src rank -> e``) and pushes its result when the destination is on
another rank (a flow ``e -> dst rank``), so an n-ary reduce of k remote sources moves k streams;
an instruction touching only ``e``'s memory is one flow over ``e``'s local memory. A flow of B
bytes crosses the direct link between the two nodes; through an NVSwitch fabric it is striped over
every switch route in proportion to the max-flow between the pair (as the hardware stripes
traffic over all switch planes; planes every GPU reaches in one ratio, one switch each or
several joined by trunks, run as one flow over their summed links,
:meth:`~collectx.topology.routes.Routes.merged`, which shares links as the stripes would);
otherwise it takes the widest route (fewest hops among equally
wide ones, see :func:`collectx.topology.paths.widest_path`). A ``host`` buffer sits on its rank's
host node (the CPU its PCIe path reaches, :meth:`._routes.Routes.host_of`), so staging a chunk
there is a flow GPU -> CPU over PCIe and reading it back one CPU -> GPU. Each part starts after the route's summed latency, and then shares every link on it max-min fairly with
the other active flows (:mod:`._fairshare`). An instruction starts when its lane predecessor
and deps have completed, and completes with its last flow. Engine calls run as a ring over their
group in group order (see :func:`_engine_flows`).

Units: bytes, microseconds, GB/s = 1e9 B/s. The result never beats the link capacities, because
no flow is given more than a fair share of any link it crosses.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Callable

import networkx as nx
import numpy as np

from .._gc import paused
from ..errors import ArgumentError
from ._graph import build_graph
from ._routes import Routes, route_classes, routes_for
from ._flat import flat_tasks, instruction_flows
from ._taskloop import TaskGraph, native_available, run as run_tasks, run_arrays
from .engine_steps import engine_groups, span_ratio
from .ir import Instr, PackedSchedule, Schedule, range_span
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


@paused
def simulate(schedule: Schedule, topo: nx.DiGraph, nbytes: int, *, ranks=None,
             dtype_size: int = 4, local_bw_gbps: float | None = None,
             native: bool | None = None) -> SimResult:
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
    native : bool, optional
        Run the event loop in libcollectx (True) or Python (False); default: native when the
        library provides it. Both give the same numbers.

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
    return _remembered(schedule, topo, nbytes, ranks, dtype_size, local_bw_gbps, native)


@paused
def time_within(schedule: Schedule | PackedSchedule, topo: nx.DiGraph, nbytes: int,
                give_up_us: float, *, ranks=None, dtype_size: int = 4) -> float:
    """:func:`simulate`'s ``time_us``, or, once the run is sure to take longer than
    ``give_up_us`` (a link still has more bytes to carry than it can by then), a lower bound
    on it above ``give_up_us``, without running the rest: a planner weighing a candidate
    against the best so far needs no more. A run that ends is remembered as
    :func:`simulate`'s (the planner prices the one it keeps); one given up is not.

    >>> from collectx.topology import ring
    >>> from collectx.schedule import ScheduleBuilder, Ref
    >>> b = ScheduleBuilder("sendrecv", 2, nchunks=1)
    >>> _ = b.copy(0, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    >>> s, topo = b.build(), ring(2, bw=25.0)
    >>> round(time_within(s, topo, 25_000_000, give_up_us=2000.0), 1)
    1000.7
    >>> time_within(s, topo, 25_000_000, give_up_us=500.0) > 500.0
    True
    """
    try:
        return _remembered(schedule, topo, nbytes, ranks, dtype_size, None, None,
                           give_up_us).time_us
    except _GaveUp as e:
        return e.bound_us


class _GaveUp(Exception):
    """A run given up (:func:`time_within`): it ends after ``bound_us`` at the earliest."""

    def __init__(self, bound_us: float):
        super().__init__(bound_us)
        self.bound_us = bound_us


def _remembered(s, topo, nbytes: int, ranks, dtype_size: int, local_bw_gbps, native,
                give_up_us: float | None = None) -> SimResult:
    """:func:`simulate`'s result, remembered for the schedule object (planners compare
    candidates, then predict the winner); raises _GaveUp, remembering nothing, where the
    native loop gave up at ``give_up_us``."""
    return _entry(s, topo, nbytes, ranks, dtype_size, local_bw_gbps, native, give_up_us)[1]


def _entry(s, topo, nbytes: int, ranks, dtype_size: int, local_bw_gbps, native,
           give_up_us: float | None = None) -> tuple:
    """``s``'s entry in :data:`_SEEN` (:func:`_remembered`), made where there is none."""
    nodes = _rank_nodes(s, topo, ranks)
    routes = routes_for(topo, local_bw_gbps)
    key = (id(s), id(routes), nbytes, tuple(nodes), dtype_size, native)
    hit = _SEEN.get(key)
    if hit is not None and hit[0] is s:
        return hit
    result, longest, pairs, ends = _simulate(s, nodes, routes, nbytes, dtype_size, native,
                                             give_up_us)
    with _SEEN_LOCK:   # planners simulate candidates on threads
        while len(_SEEN) >= _SEEN_LIMIT:
            _SEEN.pop(next(iter(_SEEN)))   # the oldest
        entry = _SEEN[key] = (s, result, longest, pairs, ends)   # keeps its schedule alive
    return entry


_SEEN: dict = {}
_SEEN_LIMIT = 16
_SEEN_LOCK = threading.Lock()


def unpacked(s: Schedule | PackedSchedule) -> Schedule:
    """``s`` as a :class:`Schedule`: a candidate simulated as words is unpacked, and what was
    simulated of it is remembered for the schedule (the planner prices the one it keeps)."""
    full = s.unpacked()
    if full is s:
        return s
    for key, entry in list(_SEEN.items()):
        if entry[0] is s:
            _SEEN[(id(full),) + key[1:]] = (full,) + entry[1:]
    return full


def forget() -> None:
    """Drop the remembered simulations and the schedules they keep alive (a planner calls
    this when its plan is made: the candidates are of no use to the next one)."""
    _SEEN.clear()


def _simulate(s: Schedule, nodes: list, routes, nbytes: int, dtype_size: int,
              native: bool | None, give_up_us: float | None = None
              ) -> tuple[SimResult, int, Callable[[], frozenset] | None, Callable]:
    """The result, where the native front end read the schedule (else -1 and None) the
    longest chain of dependent instructions and what gives the rank pairs of
    :func:`known_pairs` when asked, and what gives :func:`chunk_ends` when asked; raises
    _GaveUp where the native loop gave up at ``give_up_us``."""
    ran = _ran_flat(s, nodes, routes, nbytes, dtype_size, give_up_us) \
        if native is not False else None
    if ran is not None:
        flat, time_us, finish = ran
        a = flat.arrays
        class_bytes = np.bincount(a["part_class"], weights=a["part_bytes"],
                                  minlength=len(route_classes(routes).links)).tolist()
        longest, pairs, written = flat.longest, flat.pairs, flat.written
    else:
        time_us, class_bytes, written, finish = _simulate_graph(   # walked as objects
            s.unpacked(), nodes, _hosts(s, nodes, routes), routes,
            lambda a, b: _parts(routes, a, b), _sizes(s, nbytes, dtype_size), native)
        longest, pairs = -1, None
    result = _result(s, nbytes, time_us, routes,
                     _link_bytes(class_bytes, route_classes(routes), routes.folded))
    ends = functools.cache(lambda: _last_written(*written, finish, s.nranks))
    return result, longest, pairs, ends


def _ran_flat(s: Schedule | PackedSchedule, nodes: list, routes, nbytes: int, dtype_size: int,
              give_up_us: float | None = None) -> tuple | None:
    """``(flat tasks, simulated time, when each task finished)`` from the native loop, or None
    where only the Python path applies; raises _GaveUp where the loop gave up at
    ``give_up_us`` (:func:`time_within`)."""
    if not native_available():
        return None
    flat = flat_tasks(s, nodes, _hosts(s, nodes, routes), lambda a, b: _parts(routes, a, b),
                      _sizes(s, nbytes, dtype_size))
    if flat is None:
        return None
    finish = np.zeros(flat.ntasks)
    time_us, order = run_arrays(flat.arrays, flat.ntasks, flat.ntasks, routes.capacity,
                                route_classes(routes), give_up_us=give_up_us, finish_us=finish)
    if order is None:
        raise _GaveUp(time_us)
    if len(order) < flat.ntasks:
        _check_all_ran(schedule_graph(s.unpacked()), set(order), range(flat.ntasks))
    return flat, time_us, finish


def _sizes(s: Schedule, nbytes: int, dtype_size: int):
    """``run_bytes(chunk, count)``: the bytes of a run of ``s``'s chunks, whole elements."""
    elems = int(unit_bytes(s.collective, nbytes, s.nranks) // dtype_size)
    return lambda chunk, count: range_span(chunk, count, s.nchunks, elems)[1] * dtype_size


def _hosts(s: Schedule, nodes: list, routes) -> list:
    """Where each rank's ``host`` buffers live (its device's node where it has none)."""
    return [routes.host_of(n) for n in nodes] if s.uses_host else nodes


def _simulate_graph(s: Schedule, nodes, hosts, routes, parts, run_bytes, native):
    """(time, bytes per route class, what each instruction writes (:attr:`._flat.FlatTasks.
    written`), when it finished) through the happens-before graph: engine steps, the Python
    event loop, or a build without the compiled module."""
    spans: dict[tuple[int, int], int] = {}   # pipelined schedules repeat a few chunk runs

    def size(ref) -> int:
        key = (ref.chunk, ref.count)
        nb = spans.get(key)
        if nb is None:
            nb = spans[key] = run_bytes(ref.chunk, ref.count)
        return nb

    g = schedule_graph(s)
    tg = _task_graph(g, engine_groups(s, g), parts, nodes, hosts, size)
    finish = np.zeros(len(tg.parts))
    time_us, order = run_tasks(tg, routes.capacity, route_classes(routes), native=native,
                               finish_us=finish)
    _check_all_ran(g, set(order), tg.node_task)
    class_bytes = [0.0] * len(route_classes(routes).links)
    for task_parts in tg.parts:   # task order, as np.bincount sums the flat arrays
        for nb, cls, _ in task_parts:
            class_bytes[cls] += nb
    written = [(d.rank if d.buf == "output" else -1, d.chunk, d.count)
               for d in (g.instrs[v].dst for v in range(len(g)))]
    return time_us, class_bytes, tuple(np.array(c, dtype=np.int64).reshape(-1) for c in (
        zip(*written) if written else ((), (), ()))), finish[np.asarray(tg.node_task, np.int64)]


def _link_bytes(class_bytes: list, classes, folded: dict) -> dict[int, float]:
    """Bytes each resource carried: the sum over the route classes that cross it (a sum of
    twin planes' links, ``folded``, handing each link its share)."""
    link_bytes: dict[int, float] = {}
    for cls, nb in enumerate(class_bytes):
        if nb:
            for res in classes.links[cls]:
                for link, part in folded.get(res, ((res, 1.0),)):
                    link_bytes[link] = link_bytes.get(link, 0.0) + nb * part
    return link_bytes


_LAST_GRAPH: tuple = (None, None)


def known_steps(s: Schedule) -> int | None:
    """The longest chain of dependent instructions of ``s`` when one of the last
    :data:`_SEEN_LIMIT` simulations read it flat (:mod:`._flat` works it out on the way),
    else None.

    The planner asks for the critical path of candidates it has simulated
    (:func:`collectx.planner.cost.steps`), often not right after: it compares several, then
    prices the winner. Building the graph again for it cost as much as the simulation's whole
    front end (0.05 s for a 40,000-instruction schedule).
    """
    longest = _seen(s, 2)
    return longest if longest is not None and longest >= 0 else None


def known_pairs(s: Schedule) -> frozenset | None:
    """``{(other rank, rank)}`` for every instruction of ``rank`` that names a buffer of
    ``other``, when one of the last :data:`_SEEN_LIMIT` simulations read ``s`` flat, else None
    (:func:`collectx.planner.cost.link_class` prices the routes between them; walking a cut
    schedule's 70,000 instructions for them cost 0.01 s)."""
    pairs = _seen(s, 3)
    return None if pairs is None else pairs()


def chunk_ends(s: Schedule | PackedSchedule, topo: nx.DiGraph, nbytes: int, *, ranks=None,
               dtype_size: int = 4) -> np.ndarray:
    """``ends[rank, chunk]``: when the chunk of ``rank``'s output buffer was last written
    (0.0: never), in :func:`simulate`'s run of ``s`` (remembered, or run now). A planner reads
    from it when each of a schedule's trees delivered its last chunk.

    >>> from collectx.topology import ring
    >>> from collectx.schedule import ScheduleBuilder, Ref
    >>> b = ScheduleBuilder("sendrecv", 2, nchunks=2)
    >>> _ = b.copy(0, 0, Ref(1, "output", 0, 2), Ref(0, "input", 0, 2))
    >>> chunk_ends(b.build(), ring(2, bw=25.0), 50_000_000).round(1).tolist()
    [[0.0, 0.0], [2000.7, 2000.7]]
    """
    return _entry(s, topo, nbytes, ranks, dtype_size, None, None)[4]()


def _last_written(rank: np.ndarray, chunk: np.ndarray, count: np.ndarray, finish: np.ndarray,
                  nranks: int) -> np.ndarray:
    """:func:`chunk_ends` from what each instruction writes (``rank``: whose output, -1 for
    another buffer; first ``chunk``; ``count`` chunks) and when it finished."""
    out = np.asarray(rank) >= 0
    rank, first, count = (np.asarray(x, dtype=np.int64)[out] for x in (rank, chunk, count))
    ends = np.zeros((nranks, int((first + count).max(initial=0))))
    runs = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count - first, count)
    np.maximum.at(ends, (np.repeat(rank, count), runs), np.repeat(finish[out], count))
    return ends


def _seen(s: Schedule, field: int):
    """Field ``field`` of ``s``'s entry in :data:`_SEEN` (any size it ran at), or None."""
    for entry in list(_SEEN.values()):   # a snapshot: another thread may plan meanwhile
        if entry[0] is s:
            return entry[field]
    return None


def schedule_graph(s: Schedule):
    """``build_graph(s)``, kept for the last schedule asked about.

    The planner may ask for a candidate's critical path (:func:`collectx.planner.cost.steps`)
    right after a simulation that needed the graph (engine steps, the Python loop); on
    schedules of thousands of instructions building it twice was a visible part of planning.
    Schedules are immutable, so the graph stays valid. The pair is read and replaced whole:
    candidates are simulated on threads, and another may replace it between two reads.
    """
    global _LAST_GRAPH
    seen, graph = _LAST_GRAPH
    if seen is not s:
        graph = build_graph(s)
        _LAST_GRAPH = (s, graph)
    return graph


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


def _instr_flows(rank: int, ins: Instr, nodes: list, hosts: list, size) -> list[tuple]:
    nb = size(ins.dst)
    me = nodes[rank]

    def where(ref):   # a host buffer lives in its rank's host memory, not on the device
        return hosts[ref.rank] if ref.buf == "host" else nodes[ref.rank]

    return instruction_flows(me, where(ins.dst), [where(x) for x in ins.srcs], nb)


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


def _task_graph(g, groups, parts, nodes: list, hosts: list, size) -> TaskGraph:
    """Tasks (instructions; an engine call is one task over its members) and their flows.

    ``parts(a, b)`` is how a transfer from node ``a`` to ``b`` splits: ``[(share, class,
    latency)]``. Engine members also wait for every other member's predecessors.
    """
    jg = groups.joined_graph(g)
    tasks = [(v,) for v in range(len(g)) if g.instrs[v].op != "engine"] + groups.calls
    node_task = [0] * len(g)
    for t, members in enumerate(tasks):
        for v in members:
            node_task[v] = t
    succs: list[list[int]] = [[] for _ in range(len(g))]
    for v, ps in enumerate(jg.preds):
        for p in ps:
            succs[p].append(v)
    split: dict = {}    # (a, b) -> parts(a, b)
    shapes: dict = {}   # (rank, dst rank, bytes, src ranks) -> a task's parts, shared read-only

    def expand(flows):
        return [(nb * share, cls, lat) for a, b, nb in flows
                for share, cls, lat in split.get((a, b)) or split.setdefault((a, b), parts(a, b))]

    task_parts = []
    for members in tasks:
        ins = g.instrs[members[0]]
        if ins.op == "engine":
            task_parts.append(expand(_engine_flows(g, members, nodes, size)))
            continue
        rank = g.ids[members[0]].rank
        key = (rank, ins.dst.rank, ins.dst.buf == "host", size(ins.dst),
               tuple((x.rank, x.buf == "host") for x in ins.srcs))
        got = shapes.get(key)
        if got is None:
            got = shapes[key] = expand(_instr_flows(rank, ins, nodes, hosts, size))
        task_parts.append(got)
    return TaskGraph(task_parts, tasks, node_task, succs, [len(ps) for ps in jg.preds])


def _parts(routes: Routes, a, b) -> list[tuple[float, int, float]]:
    of = route_classes(routes).class_of
    return [(share, of(route), lat) for route, lat, share in routes.merged(a, b)]


def _check_all_ran(g, started: set, node_task: list) -> None:
    stuck = [v for v in range(len(g)) if node_task[v] not in started]
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
