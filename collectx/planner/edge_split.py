"""The job's view of a topology, and how relay nodes (switches, CPUs, NICs) are taken out of it.

How it works
------------
Packings (spanning trees, per-root forests) are built over the job's GPUs only. Relays forward
data but never copy or reduce it, so a tree edge ``u -> t`` between two GPUs stands for a *path*
``u -> w1 -> ... -> t`` whose inner nodes are relays. ForestColl removes relays by edge splitting
(Lovász/Mader, Bang-Jensen–Frank–Jackson): each pair ``(u->w, w->t)`` is replaced by a logical edge
``u->t``, choosing the amounts with max-flow checks so cut values between GPUs survive.

collectx uses the equivalent LP formulation instead: a column of a packing LP is a GPU tree whose
every edge carries the relay path it takes, and link capacities are the LP rows. The pricing step
of column generation needs, for link prices ``y``, the cheapest relay path between every GPU pair
(:func:`relay_paths`); a min-cost arborescence / spanning tree over those path costs is then the
most improving column. This is exact for trees that only forward through relays (the split
multigraph's trees are such trees, and every such tree splits the relays along its paths), needs
no fractional splitting bookkeeping, and keeps each logical edge's path explicit for the
schedule's metadata and the simulator.

GPUs outside the job are removed (they belong to other jobs); they are never relays.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass

import networkx as nx

from ..errors import ArgumentError, TopologyError
from .turnaround import direct_link

_HOP_EPS = 1e-9   # tie-break: among equal-price paths prefer fewer hops


def natural_key(name) -> tuple:
    """Sort key putting ``GPU2`` before ``GPU10``.

    >>> sorted(["GPU10", "GPU2", "GPU1"], key=natural_key)
    ['GPU1', 'GPU2', 'GPU10']
    """
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(name)))


def job_gpus(topo: nx.DiGraph, gpus=None) -> tuple:
    """The job's GPUs: ``gpus`` as given, or every ``kind == "gpu"`` node in natural order.

    >>> G = nx.DiGraph(); G.add_nodes_from(["GPU1", "GPU0"], kind="gpu")
    >>> job_gpus(G)
    ('GPU0', 'GPU1')
    """
    if gpus is None:
        return tuple(sorted((n for n, d in topo.nodes(data=True) if d.get("kind") == "gpu"),
                            key=natural_key))
    gpus = tuple(gpus)
    for g in gpus:
        if g not in topo or topo.nodes[g].get("kind") != "gpu":
            raise ArgumentError(f"{g!r} is not a GPU of this topology; expected one of "
                                f"{job_gpus(topo)}; pass GPU node ids")
    if len(set(gpus)) != len(gpus):
        raise ArgumentError(f"gpus {gpus} repeat a GPU; list each GPU once")
    return gpus


def job_graph(topo: nx.DiGraph, gpus) -> nx.DiGraph:
    """Copy of ``topo`` without the GPUs outside ``gpus``; each edge gets ``cap`` (GB/s).

    ``topo`` is not modified. Edges without ``bw_gbps`` or with a non-positive one are dropped.
    """
    keep = set(gpus)
    G = nx.DiGraph(**topo.graph)
    for n, d in topo.nodes(data=True):
        if d.get("kind") != "gpu" or n in keep:
            G.add_node(n, **{**d, "kind": d.get("kind", "relay")})
    for u, v, d in topo.edges(data=True):
        cap = float(d.get("bw_gbps", 0.0) or 0.0)
        if cap > 0 and u in G and v in G:
            G.add_edge(u, v, **{**d, "cap": cap})
    return G


@dataclass(frozen=True)
class LinkIndex:
    """Numbered directed links of a job graph (LP rows) and per-node adjacency."""

    nodes: tuple
    links: tuple            # (u, v) per link id
    caps: tuple             # GB/s per link id
    out: dict               # node -> tuple of (link id, head)
    rev: tuple              # link id of the reverse direction, or -1
    ids: dict               # (u, v) -> link id

    @classmethod
    def of(cls, G: nx.DiGraph) -> "LinkIndex":
        links = tuple(G.edges())
        ids = {e: i for i, e in enumerate(links)}
        out: dict = {n: [] for n in G.nodes}
        for i, (u, v) in enumerate(links):
            out[u].append((i, v))
        return cls(nodes=tuple(G.nodes), links=links,
                   caps=tuple(G.edges[e]["cap"] for e in links),
                   out={n: tuple(a) for n, a in out.items()},
                   rev=tuple(ids.get((v, u), -1) for u, v in links), ids=ids)


def relay_paths(index: LinkIndex, gpus, weight) -> tuple[dict, dict]:
    """Cheapest path between every ordered GPU pair whose inner nodes are relays.

    Parameters
    ----------
    index : LinkIndex
    gpus : sequence of GPU node ids (the terminals; no other GPU is in the graph)
    weight : sequence of float, the non-negative price of each link id

    Returns
    -------
    (cost, path) : dicts keyed by ``(u, t)``; ``path`` is a tuple of ``(link id, 1.0)`` (the
    same form as :func:`simulator_routes`), ``cost`` its price. Pairs without a path are absent.
    """
    terminals = set(gpus)
    cost, path = {}, {}
    for src in gpus:
        dist = {src: 0.0}
        via: dict = {}
        heap = [(0.0, 0, src)]
        while heap:
            d, hops, n = heapq.heappop(heap)
            if d > dist.get(n, float("inf")):
                continue
            if n != src and n in terminals:
                continue   # a GPU ends a logical edge; it never forwards inside one
            for link, head in index.out[n]:
                nd = d + weight[link] + _HOP_EPS
                if nd < dist.get(head, float("inf")):
                    dist[head] = nd
                    via[head] = link
                    heapq.heappush(heap, (nd, hops + 1, head))
        for t in gpus:
            if t != src and t in dist:
                cost[src, t] = dist[t]
                path[src, t] = tuple((link, 1.0) for link in _walk_back(index, via, src, t))
    return cost, path


def simulator_routes(G: nx.DiGraph, index: LinkIndex, gpus, reverse: bool = False) -> dict:
    """The links each ordered GPU pair's transfer crosses, as the simulator routes it.

    Returns ``{(a, b): ((link id, share), ...)}``: :func:`collectx.schedule.simulate` sends a
    transfer over a direct link, else its widest route, striped over NVSwitch planes in
    proportion to the pair's max-flow, so packings that must come true there price each tree
    edge by those shares instead of choosing relay paths freely. The simulator's own route table is asked, so the two cannot drift apart.
    With ``reverse``, ``index`` numbers the reversed graph and ``(p, c)`` maps to the reversed
    route of ``c -> p`` (in-trees packed as out-trees of the reversed graph).
    """
    from ..schedule._routes import routes_for

    table = routes_for(G)
    stripes = {(a, b): [([table.names[r] for r in res], share)
                        for res, _, share in table.spread(a, b)]
               for a in gpus for b in gpus if a != b}
    # A tree edge whose route crosses another job GPU adds nothing a tree through that GPU
    # lacks, and makes the pricing degenerate (a ring's overlay becomes a complete graph).
    terminals = set(gpus)
    direct = {k: h for k, h in stripes.items()
              if not any(v in terminals for hops, _ in h for _, v in hops[:-1])}
    overlay = nx.DiGraph(list(direct))
    overlay.add_nodes_from(gpus)
    if nx.is_strongly_connected(overlay):
        stripes = direct
    routes = {}
    for (a, b), h in stripes.items():
        use: dict = {}
        for hops, share in h:
            for u, v in hops:
                link = index.ids[v, u] if reverse else index.ids[u, v]
                use[link] = use.get(link, 0.0) + share
        routes[(b, a) if reverse else (a, b)] = tuple(sorted(use.items()))
    return routes


def host_routes(G: nx.DiGraph, index: LinkIndex, gpus, reverse: bool = False,
                any_pair: bool = False) -> dict:
    """The links a transfer staged through host memory crosses, for every ordered pair of
    ``gpus`` joined by a direct GPU link (the pairs whose PCIe bandwidth CUDA never uses
    unless a plan stages through host, :mod:`.host_relay`); with ``any_pair``, for every
    ordered pair (GPUs without a direct link then also reach each other through host memory,
    across the sockets' link where they sit under different CPUs).

    The sender copies into its ``host`` buffer (GPU -> PCIe -> its host CPU) and the receiver
    copies it out (that CPU -> PCIe -> GPU), each routed as the simulator routes it. Same
    format and ``reverse`` convention as :func:`simulator_routes`; pairs whose staged route
    would cross another GPU, or whose sender has no CPU, get none.
    """
    from ..schedule._routes import routes_for

    table = routes_for(G)
    kinds = dict(G.nodes(data="kind"))
    routes = {}
    for a in gpus:
        host = table.host_of(a)
        if host == a or kinds.get(host) != "cpu":
            continue
        for b in gpus:
            if b == a or not (any_pair or direct_link(G, a, b)):
                continue
            use: dict = {}
            for x, y in ((a, host), (host, b)):
                for res, _, share in table.spread(x, y):
                    for u, v in (table.names[r] for r in res):
                        link = index.ids[v, u] if reverse else index.ids[u, v]
                        use[link] = use.get(link, 0.0) + share
            if not any(kinds.get(index.links[i][0]) == "gpu" and index.links[i][0] not in (a, b)
                       for i in use):
                routes[(b, a) if reverse else (a, b)] = tuple(sorted(use.items()))
    return routes


def _walk_back(index: LinkIndex, via: dict, src, t) -> tuple:
    links = []
    n = t
    while n != src:
        link = via[n]
        links.append(link)
        n = index.links[link][0]
    return tuple(reversed(links))


def require_connected(G: nx.DiGraph, gpus) -> None:
    """Raise :class:`TopologyError` unless every GPU reaches every other one."""
    if len(gpus) < 2:
        return
    reach = nx.descendants(G, gpus[0]) | {gpus[0]}
    back = nx.ancestors(G, gpus[0]) | {gpus[0]}
    lost = [g for g in gpus if g not in reach or g not in back]
    if lost:
        raise TopologyError(f"GPUs {lost} cannot exchange data with {gpus[0]} in this topology "
                            f"(no path both ways); check the links or choose another allocation")
