"""Hierarchical schedules for multi-node clusters: intra-node phases around an engine phase.

How it works (Blink's three phases, generalised). The ranks are grouped by node (the parts of
the topology left connected once network links and network switches are removed). Every node
has ``g`` ranks; rank ``i`` of every node forms *rail group* ``i`` (its NIC ``i`` sits on rail
switch ``i`` on rail-optimized fabrics). For allreduce:

1. intra-node reduce-scatter over the node's best plan (the planner's choice on one node),
   leaving shard ``i`` of the node's partial sum on local rank ``i``;
2. inter-node allreduce of each shard within its rail group, as ``engine`` instructions
   (``engine_op="allreduce"``, ``group`` = the global ranks of the rail group): all ``g`` rails
   carry traffic at once;
3. intra-node allgather of the reduced shards.

Allgather is phase 2 then 3 (gather along rails, then share inside the node), reduce_scatter is
phase 1 then 2 (reduce inside the node, then scatter along rails), broadcast sends the root's
data along the root's rail and broadcasts inside every node. Each shard is cut into ``pieces``
that flow through the phases independently, so NVLink phases overlap the network phase and
the pipeline's fill costs ``~1/pieces`` of the time. Intra-node sub-schedules are planned once
per distinct node shape and embedded by :mod:`.hier_embed`.

The whole result is one schedule: :func:`collectx.schedule.verify` proves it (engine steps by
:mod:`collectx.schedule.engine_steps`) and :func:`collectx.schedule.simulate` times it (engine
calls as rings over the rail, i.e. over the NICs and rail switches)."""

from __future__ import annotations

import itertools
import math
import re

import networkx as nx

from ..errors import PlanError
from ..schedule.builder import ScheduleBuilder
from ..schedule.ir import Ref, Schedule
from ._build import check_args
from .cost_tables import alpha_us, pipeline_pieces, route_terms
from .hier_embed import Writers, embed

SUPPORTED = ("allreduce", "allgather", "reduce_scatter", "broadcast")
_PREFIX = re.compile(r"^n\d+/")


def plan_hierarchical(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int,
                      *, root: int = 0, inplace: bool = False, nchunks: int | None = None
                      ) -> Schedule:
    """Plan ``collective`` as intra-node phases around an inter-node engine phase.

    Parameters are those of every planner (see :func:`collectx.planner.plan`), on a
    multi-node topology (e.g. :func:`collectx.topology.multi_node`) whose nodes hold equally
    many ``ranks``; ``inplace`` must be False (the phases stage data in scratch); ``nchunks``
    is the pipeline pieces per shard (default: :func:`~.cost_tables.pipeline_pieces` over the
    three phases, at the network route's bandwidth and latency). The schedule's ``meta``
    holds the nodes, the intra-node algorithms and the number of pieces.

    Raises
    ------
    PlanError
        Unsupported collective, in place, or nodes with different numbers of ranks.

    Examples
    --------
    >>> from collectx.topology import multi_node, switch, gpus
    >>> from collectx.schedule import verify
    >>> G = multi_node(switch(2), 2, nic_bw=50.0)
    >>> s = plan_hierarchical(G, tuple(gpus(G)), "allreduce", 1 << 20)
    >>> s.meta_dict()["nodes"], verify(s).engine_steps
    (((0, 1), (2, 3)), 4)
    """
    check_args(collective, len(ranks), root, nchunks)
    if not spans_machines(topo, ranks):
        raise PlanError("the ranks are on one machine: hierarchical plans need several "
                        "(joined by net links, e.g. collectx.topology.multi_node)")
    if collective not in SUPPORTED:
        raise PlanError(f"hierarchical plans {collective}? expected one of {SUPPORTED}; use "
                        f"direct for {collective}")
    if inplace:
        raise PlanError("hierarchical plans are out of place (phases stage data in scratch); "
                        "plan with inplace=False")
    nodes = node_groups(topo, ranks)
    pieces = nchunks or _default_pieces(topo, ranks, nodes, nbytes)
    builder, intra = _BUILD[collective](topo, ranks, nodes, pieces, nbytes, root)
    builder.meta("nodes", [list(n) for n in nodes])
    builder.meta("intra", intra)
    builder.meta("pieces", pieces)
    return builder.build()


plan_hierarchical.collectives = SUPPORTED


def node_groups(topo: nx.DiGraph, ranks: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Schedule ranks grouped by node, nodes in order of their first rank.

    A node is a connected part of ``topo`` once ``net`` links and ``net_switch`` nodes are
    removed (NICs stay with their node).

    >>> from collectx.topology import multi_node, switch, gpus
    >>> G = multi_node(switch(2), 3, nic_bw=25.0)
    >>> node_groups(G, tuple(gpus(G)))
    [(0, 1), (2, 3), (4, 5)]
    """
    part = machine_of(topo)
    order: dict[int, list[int]] = {}
    for r, node in enumerate(ranks):
        order.setdefault(part[node], []).append(r)
    nodes = [tuple(v) for v in order.values()]
    sizes = sorted({len(n) for n in nodes})
    if len(sizes) != 1:
        raise PlanError(f"nodes hold {sizes} ranks; hierarchical plans need the same number "
                        f"of ranks on every node (allocate whole nodes or equal shares)")
    return nodes


def spans_machines(topo: nx.DiGraph, ranks: tuple[str, ...]) -> bool:
    """Whether ``ranks`` sit on more than one machine of ``topo`` (joined by ``net`` links).

    >>> from collectx.topology import multi_node, switch, gpus
    >>> spans_machines(switch(2), ("GPU0", "GPU1"))
    False
    """
    if not any(t == "net" for _, _, t in topo.edges(data="type")):
        return False
    part = machine_of(topo)
    return len({part[r] for r in ranks}) > 1


def suits(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str) -> bool:
    """Whether a hierarchical plan serves this request: a supported collective on ranks spread
    evenly over several machines (what :func:`collectx.planner.plan` picks it for).

    >>> from collectx.topology import multi_node, switch
    >>> G = multi_node(switch(2), 2, nic_bw=25.0)
    >>> suits(G, ("n0/GPU0", "n1/GPU0"), "allreduce"), suits(G, ("n0/GPU0", "n1/GPU0"), "alltoall")
    (True, False)
    """
    if collective not in SUPPORTED or not spans_machines(topo, ranks):
        return False
    try:
        node_groups(topo, ranks)   # raises unless every machine holds as many ranks
    except PlanError:
        return False
    return True


def machine_of(topo: nx.DiGraph) -> dict:
    """Every node outside the network fabric -> the number of the machine it is in."""
    local = nx.Graph()
    local.add_nodes_from(n for n, d in topo.nodes(data=True) if d.get("kind") != "net_switch")
    local.add_edges_from((u, v) for u, v, d in topo.edges(data=True)
                         if d.get("type") != "net" and u in local and v in local)
    return {n: k for k, comp in enumerate(nx.connected_components(local)) for n in comp}


def _default_pieces(topo, ranks, nodes, nbytes: int) -> int:
    """Pieces per shard: a piece passes three phases (within the node, across the network, within
    the node again), paced by the network route between the nodes' first ranks; each network step
    waits out an engine call (the cost table's network step), not only the wire's latency."""
    bw, wait = route_terms(topo, ranks, [(nodes[0][0], nodes[1][0])])
    return pipeline_pieces(nbytes / len(nodes[0]), 3, bw, max(wait, alpha_us("net", "ring")))


# -- intra-node sub-plans ------------------------------------------------------------------------
def _sub_plans(topo, ranks, nodes, collective, nchunks, nbytes, root=0):
    """One sub-schedule per node (planned once per node shape) and the algorithm chosen."""
    from . import registry, select
    cache: dict[tuple, tuple[str, Schedule]] = {}
    out = []
    part = machine_of(topo)
    for node in nodes:
        ids = tuple(ranks[r] for r in node)
        view = _node_view(topo, part, ids)
        key = _shape(view)
        if key not in cache:
            names = [a for a in registry.candidates(collective) if a != "hierarchical"]
            name, sub, _ = select.choose(view, ids, collective, nbytes, root=root,
                                         nchunks=nchunks, algorithms=names)
            if sub.nchunks != nchunks:
                raise PlanError(f"intra-node {name} plan has {sub.nchunks} chunks; expected "
                                f"{nchunks} (the hierarchical layout needs them aligned)")
            cache[key] = (name, sub)
        out.append(cache[key])
    return [s for _, s in out], out[0][0]


def _node_view(topo: nx.DiGraph, part: dict, ids: tuple[str, ...]) -> nx.DiGraph:
    members = [n for n in topo if part.get(n) == part[ids[0]]]
    others = {n for n in members if topo.nodes[n].get("kind") == "gpu" and n not in ids}
    return topo.subgraph([n for n in members if n not in others]).copy()


def _shape(view: nx.DiGraph) -> tuple:
    strip = lambda n: _PREFIX.sub("", str(n))  # noqa: E731
    return tuple(sorted((strip(u), strip(v), bw) for u, v, bw in view.edges(data="bw_gbps")))


def _reserve(b: ScheduleBuilder, chunks: int) -> None:
    for r in range(b.nranks):
        b.scratch(r, math.ceil(chunks / b.nchunks))


def _lanes(s: Schedule) -> int:
    return max(len(lanes) for lanes in s.lanes)


def _embed_pieces(b, subs, nodes, lane0, pieces, map_of_piece, earlier) -> Writers:
    """Append every node's sub-schedule once per piece, piece after piece on the same lanes,
    so piece ``p + 1`` of a phase streams while the next phase works on piece ``p``."""
    written = Writers()
    for p in range(pieces):
        chunk_map = map_of_piece(p)
        for sub, node in zip(subs, nodes):
            embed(b, sub, node, lane0, chunk_map, earlier, written)
    return written


def _scratch_chunks(subs: list[Schedule]) -> int:
    return max(max(s.scratch_units) * s.nchunks for s in subs)


def _rail_blocks(user: str, n: int, g: int, pieces: int, at: int, per: int):
    """Piece ``c``'s chunk map for a sub-plan whose ``user`` buffer (the collective's own input
    of a reduce-scatter, output of an allgather) is unit ``u``'s piece ``c`` of node ``k``'s
    block (sub-plan chunk ``j = u*n + k``); its other buffer is scratch ``[c*n, (c+1)*n)``,
    where the rail engine meets it, and its own scratch ``per`` chunks per piece from ``at``."""
    def map_of_piece(c):
        def chunk_map(buf, j, rank):
            if buf == user:
                u, k = divmod(j, n)
                return user, (k * g + u) * pieces + c
            return ("scratch", c * n + j) if buf in ("input", "output") else (
                "scratch", at + c * per + j)
        return chunk_map
    return map_of_piece


# -- collectives -----------------------------------------------------------------------------------
def _allreduce(topo, ranks, nodes, pieces, nbytes, root):
    """A unit is g shards x pieces (chunk ``u*pieces + p``); scratch holds A (node partials of
    each piece), B (the engine's reduced pieces) and the sub-plans' scratch, per piece."""
    g, n = len(nodes[0]), len(nodes)
    rs, rs_name = _sub_plans(topo, ranks, nodes, "reduce_scatter", 1, nbytes // pieces)
    ag, ag_name = _sub_plans(topo, ranks, nodes, "allgather", 1, nbytes // pieces)
    b = ScheduleBuilder("allreduce", n * g, g * pieces, algorithm="hierarchical")
    A, B, S1, x1, x3 = 0, pieces, 2 * pieces, _scratch_chunks(rs), _scratch_chunks(ag)
    S3 = S1 + pieces * x1
    _reserve(b, S3 + pieces * x3)
    w1 = _embed_pieces(b, rs, nodes, 0, pieces, lambda p: lambda buf, j, r: {
        "input": ("input", j * pieces + p), "output": ("scratch", A + p),
        "scratch": ("scratch", S1 + p * x1 + j)}[buf], Writers())
    w2 = _engine_phase(b, _rails(nodes), pieces, lane_e := max(map(_lanes, rs)), "allreduce",
                       lambda r, p: (Ref(r, "scratch", B + p), Ref(r, "scratch", A + p)), w1)
    _embed_pieces(b, ag, nodes, lane_e + 1, pieces, lambda p: lambda buf, j, r: {
        "input": ("scratch", B + p), "output": ("output", j * pieces + p),
        "scratch": ("scratch", S3 + p * x3 + j)}[buf], w2)
    return b, {"reduce_scatter": rs_name, "allgather": ag_name}


def _reduce_scatter(topo, ranks, nodes, pieces, nbytes, root):
    """Per piece ``c``, the sub-reduce-scatter's unit ``u`` is piece ``c`` of global units
    ``k*g + u`` (k = node), so each rank's n partials of a piece land contiguous in scratch
    ``[c*n, (c+1)*n)``, in rail order, as the engine's reduce_scatter blocks."""
    g, n = len(nodes[0]), len(nodes)
    rs, rs_name = _sub_plans(topo, ranks, nodes, "reduce_scatter", n, nbytes // pieces)
    b = ScheduleBuilder("reduce_scatter", n * g, pieces, algorithm="hierarchical")
    S1, x1 = n * pieces, _scratch_chunks(rs)
    _reserve(b, S1 + pieces * x1)

    w1 = _embed_pieces(b, rs, nodes, 0, pieces, _rail_blocks("input", n, g, pieces, S1, x1),
                       Writers())
    _engine_phase(b, _rails(nodes), pieces, max(map(_lanes, rs)), "reduce_scatter",
                  lambda r, c: (Ref(r, "output", c), Ref(r, "scratch", c * n, n)), w1)
    return b, {"reduce_scatter": rs_name}


def _allgather(topo, ranks, nodes, pieces, nbytes, root):
    """The engine gathers piece ``c`` along the rail into scratch ``[c*n, (c+1)*n)`` (block
    ``k`` from node ``k``); per piece, a sub-allgather spreads those blocks to their slots."""
    g, n = len(nodes[0]), len(nodes)
    ag, ag_name = _sub_plans(topo, ranks, nodes, "allgather", n, nbytes // pieces)
    b = ScheduleBuilder("allgather", n * g, pieces, algorithm="hierarchical")
    S3, x3 = n * pieces, _scratch_chunks(ag)
    _reserve(b, S3 + pieces * x3)
    w1 = _engine_phase(b, _rails(nodes), pieces, 0, "allgather",
                       lambda r, c: (Ref(r, "scratch", c * n, n), Ref(r, "input", c)))
    _embed_pieces(b, ag, nodes, 1, pieces, _rail_blocks("output", n, g, pieces, S3, x3), w1)
    return b, {"allgather": ag_name}


def _broadcast(topo, ranks, nodes, pieces, nbytes, root):
    """The root's rail broadcasts each piece into scratch, then every node broadcasts it from
    its rank on that rail."""
    g, n = len(nodes[0]), len(nodes)
    home = next(k for k, node in enumerate(nodes) if root in node)
    local = nodes[home].index(root)
    bc, bc_name = _sub_plans(topo, ranks, nodes, "broadcast", 1, nbytes // pieces, root=local)
    b = ScheduleBuilder("broadcast", n * g, pieces, root=root, algorithm="hierarchical")
    S, x = pieces, _scratch_chunks(bc)
    _reserve(b, S + pieces * x)
    group = tuple(nodes[(home + k) % n][local] for k in range(n))   # the root first
    w1 = _engine_phase(b, [group], pieces, 0, "broadcast",
                       lambda r, c: (Ref(r, "scratch", c), Ref(r, "input", c)))
    _embed_pieces(b, bc, nodes, 1, pieces, lambda c: lambda buf, j, r: {
        "input": ("scratch", c), "output": ("output", c),
        "scratch": ("scratch", S + c * x + j)}[buf], w1)
    return b, {"broadcast": bc_name}


def _engine_phase(b, groups, pieces: int, lane: int, op: str, refs, after=None) -> Writers:
    """The inter-node phase: per group, piece ``c`` and rank ``r``, an ``op`` engine step on
    ``lane`` into and from ``refs(r, c)``, after what ``after`` wrote there. Returns its writes."""
    w = Writers()
    for group, c in itertools.product(groups, range(pieces)):
        for r in group:
            dst, src = refs(r, c)
            w.record(dst, b.engine(r, lane, dst, [src], op, group,
                                   deps=after.of(src) if after else ()))
    return w


def _rails(nodes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Rail group ``i``: local rank ``i`` of every node, in node order."""
    return [tuple(node[i] for node in nodes) for i in range(len(nodes[0]))]


_BUILD = {"allreduce": _allreduce, "reduce_scatter": _reduce_scatter,
          "allgather": _allgather, "broadcast": _broadcast}
