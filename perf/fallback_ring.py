"""The ring a ring-only library falls back to when the GPUs have no NVLink ring: a baseline.

Why: NCCL builds rings. When the GPUs of a job cannot be ordered so that every neighbour pair
shares an NVLink (most fragmented DGX-1 allocations), its ring still has to cross from one GPU
to the next, and a hop without NVLink goes through PCIe and, across sockets, through host
memory and the socket link (its shared-memory transport). The ring then runs at the speed of
its slowest hop, about 5 GB/s on a DGX-1V where the NVLink hops would give 25-50 (NCCL's
maintainers quote "most random sets of 4 GPUs out of 8 would run at 5GB/s instead of
40-60GB/s"). :func:`plan_fallback_ring` plans that ring so collectx's plans can be compared with
what such a library gets. It is not one of the planner's choices (it never beats
:func:`~.ring.plan_ring`, which may relay over other GPUs' NVLinks); pass it as ``algo=``.

How it works
------------
1. Hop rates: NVLink (or xGMI) where two GPUs share a link, else the widest route between them
   through PCIe switches and CPUs only (no other GPU forwards the data).
2. The ring order is the one whose slowest hop is fastest, then with the most direct hops;
   every order is tried (at most 8 GPUs on the machines this models: 5040 orders).
3. The ring schedule of :func:`~.ring.ring_schedule`, in :data:`PIPELINE` pieces per shard
   (broadcast and reduce chains are in pieces already), with every hop between GPUs without a direct link staged through the sender's host memory
   (:func:`~collectx.schedule.host.stage_through_host`), piece by piece as NCCL's FIFO does.

>>> from collectx.topology import load, subset
>>> from collectx.schedule import simulate
>>> G = subset(load("dgx1v"), [0, 1, 2, 6])
>>> s = plan_fallback_ring(G, ("GPU0", "GPU1", "GPU2", "GPU6"), "allgather", 1 << 28)
>>> s.algorithm, s.meta_dict()["rings"][0][0], s.uses_host
('fallback_ring', ('GPU0', 'GPU1', 'GPU2', 'GPU6'), True)
>>> round(simulate(s, G, 1 << 28, ranks=("GPU0", "GPU1", "GPU2", "GPU6")).busbw_GBps)
6
"""

from __future__ import annotations

import itertools

import networkx as nx

from collectx.errors import NoFeasiblePlan, PlanError, TopologyError
from collectx.planner._build import check_args
from collectx.planner.ring import SUPPORTED, _default_nchunks, ring_schedule
from collectx.planner.ring_search import Ring
from collectx.schedule.host import stage_through_host
from collectx.schedule.ir import Schedule
from collectx.topology.paths import widest_path
from collectx.topology.view import DIRECT_TYPES

PIPELINE = 16          # pieces per shard: the staged copies up and down overlap piece by piece
MAX_RANKS = 9          # orders tried: (n - 1)! / 1 ... 40320 at 9


def plan_fallback_ring(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int,
                       *, root: int = 0, inplace: bool = False,
                       nchunks: int | None = None) -> Schedule:
    """One ring over ``ranks``, NVLink where neighbours share one, host memory elsewhere.

    Parameters are those of every planner (see :func:`collectx.planner.plan`).

    Raises
    ------
    PlanError
        Unsupported collective, or more than :data:`MAX_RANKS` ranks.
    NoFeasiblePlan
        Two ranks with neither a direct link nor a route through PCIe and CPUs.
    """
    n = len(ranks)
    check_args(collective, n, root, nchunks)
    if collective not in SUPPORTED:
        raise PlanError(f"fallback_ring does not support {collective}; it supports "
                        f"{', '.join(SUPPORTED)}")
    if n > MAX_RANKS:
        raise PlanError(f"fallback_ring tries every ring order, so at most {MAX_RANKS} ranks; "
                        f"got {n}. Use plan_ring for larger jobs")
    direct, rate = hop_rates(topo, ranks)
    order, bw = best_order(rate, direct)
    ring = Ring(order, bw, ())
    c = nchunks or _default_nchunks(collective, n, nbytes, [ring], topo, ranks)
    if nchunks is None and collective not in ("broadcast", "reduce"):
        c *= PIPELINE   # shards in pieces (a broadcast/reduce chain is in pieces already)
    s = ring_schedule(topo, ranks, collective, nbytes, [ring], root=root, inplace=inplace,
                      nchunks=c, algorithm="fallback_ring")
    return stage_through_host(s, pairs=lambda a, b: not direct[a][b])


plan_fallback_ring.collectives = SUPPORTED


def hop_rates(topo: nx.DiGraph, ranks) -> tuple[list[list[bool]], list[list[float]]]:
    """Per ordered rank pair: whether a direct GPU link joins them, and the hop's GB/s."""
    n = len(ranks)
    direct = [[False] * n for _ in range(n)]
    rate = [[0.0] * n for _ in range(n)]
    host = _host_view(topo, ranks)
    for i, j in itertools.permutations(range(n), 2):
        a, b = ranks[i], ranks[j]
        data = topo.get_edge_data(a, b) or {}
        if data.get("type") in DIRECT_TYPES:
            direct[i][j], rate[i][j] = True, float(data["bw_gbps"])
            continue
        try:
            rate[i][j] = widest_path(host, a, b).bw_gbps
        except TopologyError:
            raise NoFeasiblePlan(f"{a} and {b} share no direct link and no route through PCIe "
                                 f"and CPUs; a ring cannot join them") from None
    return direct, rate


def best_order(rate, direct) -> tuple[tuple[int, ...], float]:
    """The ring order whose slowest hop is fastest (then: most direct hops), and that rate."""
    n = len(rate)
    if n == 1:
        return (0,), 0.0
    best, key = None, None
    for rest in itertools.permutations(range(1, n)):
        order = (0, *rest)
        hops = list(zip(order, order[1:] + order[:1]))
        k = (min(rate[a][b] for a, b in hops), sum(direct[a][b] for a, b in hops))
        if key is None or k > key:
            best, key = order, k
    return best, key[0]


def _host_view(topo: nx.DiGraph, ranks) -> nx.DiGraph:
    """``topo`` without direct GPU links and without GPUs other than ``ranks``: the routes a
    hop without NVLink can take (no GPU forwards another's data)."""
    keep = set(ranks)
    H = topo.subgraph(v for v, kind in topo.nodes(data="kind") if kind != "gpu" or v in keep)
    H = H.copy()
    H.remove_edges_from([(u, v) for u, v, t in H.edges(data="type") if t in DIRECT_TYPES])
    return H
