"""Ring packing: find rings (Hamiltonian cycles of the ranks) that share the links' capacity.

How it works. Each *hop* of a ring (rank ``a`` to the next rank ``b``) is routed as the
executors and the simulator route it: over the link joining ``a`` and ``b`` when there is one,
over the topology's widest route when that relays through another GPU's NVLinks, and otherwise
along the widest path through switches, CPUs and PCIe bridges in the residual capacity. Rings
are found greedily in the *residual* graph: find the ring whose narrowest hop is widest
(thresholds tried from the widest hop bandwidth down, a depth-first Hamiltonian search at each;
rings without GPU-relayed hops are tried too, and the wider wins), give it the bottleneck capacity
of its routes (a link crossed by k hops of the ring counts k times), subtract that from every
link it uses, and repeat up to ``max_channels`` rings or until a ring would get less than
:data:`MIN_RING_FRACTION` of the first one. NVLink rings come first because their hops are the
widest; PCIe/socket routes are only used where no wider ring remains, which is what a ring-only
library does. A ring and its reverse are distinct (links are full duplex), so a fabric is
typically covered by rings in both directions.

Complexity: per ring, one widest-path search per ordered rank pair (``O(n^2 E log V)``) plus a
Hamiltonian search bounded by :data:`SEARCH_BUDGET` expansions per threshold."""

from __future__ import annotations

import dataclasses
from collections import Counter

import networkx as nx

from ..errors import NoFeasiblePlan, TopologyError
from ..topology.paths import Router

MAX_CHANNELS = 16
MIN_RING_FRACTION = 0.1   # rings this much thinner than the first add steps, not bandwidth
SEARCH_BUDGET = 20000     # DFS expansions per threshold before relaxing it
_EPS = 1e-9


@dataclasses.dataclass(frozen=True, slots=True)
class Ring:
    """A ring over schedule ranks: ``order[i]`` sends to ``order[i+1]``; ``bw_gbps`` per hop."""

    order: tuple[int, ...]
    bw_gbps: float
    routes: tuple[tuple[str, ...], ...]


def find_rings(topo: nx.DiGraph, ranks: tuple[str, ...],
               max_channels: int = MAX_CHANNELS) -> list[Ring]:
    """Greedy ring packing over ``ranks`` (node ids) of ``topo``; see the module docstring.

    Raises
    ------
    NoFeasiblePlan
        No ring exists at all (some rank cannot reach the next without relaying through a rank).

    Examples
    --------
    >>> from collectx.topology import ring
    >>> [(r.order, r.bw_gbps) for r in find_rings(ring(4), ("GPU0", "GPU1", "GPU2", "GPU3"))]
    [((0, 1, 2, 3), 25.0), ((0, 3, 2, 1), 25.0)]
    """
    n = len(ranks)
    if n == 1:
        return [Ring((0,), 0.0, ())]  # nothing to send: no hop, no bandwidth
    cache: dict = {}  # fixed routes, per call: planners keep no state between calls
    # Greedy rings can block each other: on a DGX-1P the first three widest rings leave no
    # fourth, where two rings each taken with its reverse cover every NVLink both ways (80
    # GB/s per GPU against 60). So rings are also packed in pairs, and the wider set wins.
    rings = max((_greedy(topo, ranks, max_channels, cache, paired) for paired in (False, True)),
                key=lambda rs: sum(r.bw_gbps for r in rs) * (1 - _EPS * len(rs)))
    if not rings:
        raise NoFeasiblePlan(f"no ring through {', '.join(ranks)}: some rank cannot reach "
                             f"another without relaying through a third; use tree or direct")
    return rings


def _greedy(topo, ranks, max_channels: int, cache: dict, paired: bool) -> list[Ring]:
    """Widest rings one after another in the residual capacity; ``paired``: each ring is
    followed by its reverse, where the reverse keeps the ring's bandwidth."""
    residual = {(u, v): float(bw or 0.0) for u, v, bw in topo.edges(data="bw_gbps")}
    rings: list[Ring] = []

    def take(ring: Ring) -> None:
        for edge, k in _link_use(ring.routes).items():
            residual[edge] -= k * ring.bw_gbps
        rings.append(ring)

    while len(rings) < max_channels:
        ring = _best_ring(topo, ranks, residual, cache)
        if ring is None or (rings and ring.bw_gbps < MIN_RING_FRACTION * rings[0].bw_gbps):
            break
        take(ring)
        if paired and len(rings) < max_channels and len(ranks) > 2:
            back = _ring_of(topo, ranks, ring.order[:1] + ring.order[:0:-1], residual, cache)
            if back is not None and back.bw_gbps >= ring.bw_gbps * (1 - 1e-6):
                take(back)
    return rings


def _ring_of(topo, ranks, order, residual, cache) -> Ring | None:
    """The ring visiting ``order``, its hops routed as :func:`_best_ring` routes them."""
    avoid = frozenset(ranks)
    routes = []
    for a, b in zip(order, order[1:] + order[:1]):
        bw, route = _hop(topo, residual, ranks[a], ranks[b], avoid, cache)
        if bw <= _EPS:
            return None
        routes.append(route)
    return _priced(order, routes, residual)


def _priced(order, routes, residual) -> Ring | None:
    """The ring over ``routes`` at the bandwidth its busiest residual link leaves it (a link
    its routes cross k times gives each crossing 1/k), or None when that is nothing."""
    bw = min(residual[e] / k for e, k in _link_use(routes).items())
    return Ring(tuple(order), bw, tuple(routes)) if bw > _EPS else None


def _link_use(routes) -> Counter:
    return Counter((a, b) for route in routes for a, b in zip(route, route[1:]))


def _best_ring(topo, ranks, residual, cache) -> Ring | None:
    """The widest ring: strict hops first (links and non-rank relays), then GPU-relayed hops.

    Relayed hops share their NVLinks with the hops of the relaying rank, so a ring made of
    them is often thinner than it looks; both candidates are measured and the wider wins."""
    n = len(ranks)
    avoid = frozenset(ranks)
    hops = {}
    for i in range(n):
        apart = [b for b in ranks if b != ranks[i] and not topo.has_edge(ranks[i], b)]
        searched = _widest(topo, residual, ranks[i], apart, avoid, cache) if apart else {}
        for j in range(n):
            if i != j:
                bw, route = _hop(topo, residual, ranks[i], ranks[j], avoid, cache, searched)
                if bw > _EPS:
                    hops[i, j] = (bw, route)
    strict = {k: v for k, v in hops.items() if not avoid.intersection(v[1][1:-1])}
    found = [r for r in (_widest_ring(n, strict, residual), _widest_ring(n, hops, residual))
             if r is not None]
    return max(found, key=lambda r: r.bw_gbps, default=None)


def _widest_ring(n, hops, residual) -> Ring | None:
    for t in sorted({bw for bw, _ in hops.values()}, reverse=True):
        order = _hamiltonian(n, {k: v[0] for k, v in hops.items() if v[0] >= t - _EPS})
        if order is not None:
            return _priced(order, [hops[a, b][1] for a, b in zip(order, order[1:] + order[:1])],
                           residual)
    return None


def _hop(topo, residual, a, b, avoid, cache, searched=None) -> tuple[float, tuple[str, ...]]:
    """Residual bandwidth and route of one hop, routed as executors and the simulator do.

    Peers joined by a link always use it (GPU peer copies cannot pick another path); a route
    the topology relays through another GPU over NVLink is fixed too. Only routes through
    switches, PCIe bridges and CPUs are searched in the residual graph (``searched``: those
    routes from ``a``, :func:`_widest`'s)."""
    if topo.has_edge(a, b):
        return residual[a, b], (a, b)
    route = _fixed_route(topo, a, b, cache)
    if route is not None and any(v in avoid for v in route[1:-1]):
        return min(residual[e] for e in zip(route, route[1:])), route
    if searched is None:
        searched = _widest(topo, residual, a, (b,), avoid, cache)
    return searched.get(b, (0.0, ()))


def _fixed_route(topo, a, b, cache: dict) -> tuple[str, ...] | None:
    if (a, b) not in cache:
        try:
            cache[a, b] = tuple(_router(topo, cache).widest(a, b).hops)
        except TopologyError:
            cache[a, b] = None
    return cache[a, b]


def _router(topo, cache: dict) -> Router:
    """One :class:`Router` per search: preparing a graph's links costs more than a route."""
    router = cache.get("router")
    if router is None:
        router = cache["router"] = Router(topo)
    return router


def _hamiltonian(n: int, hop_bw: dict[tuple[int, int], float]) -> tuple[int, ...] | None:
    """A Hamiltonian cycle from rank 0 using the given hops, widest hops tried first."""
    succ = {i: sorted((j for (a, j) in hop_bw if a == i), key=lambda j: (-hop_bw[i, j], j))
            for i in range(n)}
    if any(not succ[i] for i in range(n)):
        return None
    path, seen, budget = [0], {0}, [SEARCH_BUDGET]

    def extend() -> bool:
        if len(path) == n:
            return (path[-1], 0) in hop_bw
        budget[0] -= 1
        if budget[0] < 0:
            return False
        for j in succ[path[-1]]:
            if j not in seen:
                path.append(j)
                seen.add(j)
                if extend():
                    return True
                seen.discard(path.pop())
        return False

    return tuple(path) if extend() else None


def _widest(topo, residual, a, targets, avoid, cache) -> dict:
    """``{b: (bandwidth, route)}``: the widest ``a -> b`` path in the residual graph to each
    of ``targets`` it reaches, fewest hops among equally wide ones, relaying through no node
    of ``avoid`` (a route may end at one)."""
    found = _router(topo, cache).widest_from(a, targets, widths=residual, avoid=avoid - {a})
    return {b: (p.bw_gbps, p.hops) for b, p in found.items() if p.bw_gbps > _EPS}
