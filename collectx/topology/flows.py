"""What a job graph can carry: max-flows, the cut rate of every GPU sending to all, and the
multicommodity and multicast LPs over its links.

These are rates of the graph alone; :mod:`collectx.planner.bounds` says which one bounds which
collective, in what units, on which view of the machine (switches split where they cannot
turn traffic around). Capacities are the links' ``cap`` unless a function says otherwise.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from .._native import compiled_helper
from ..errors import PlanError
from .symmetry import orbits
from .view import LinkIndex


def max_flow(cap, source: int, sink: int, enough: float = float("inf")) -> tuple[float, set]:
    """Max-flow from ``source`` to ``sink`` over the dense capacities ``cap`` (``n x n``),
    stopping once it reaches ``enough``; with it, the nodes the source still reaches in the
    residual graph (the source side of a minimum cut when the flow falls short).

    Shortest augmenting paths (Edmonds–Karp) on Python lists (on a few dozen nodes a library
    call costs more to set up than the search), or in C where ``collectx._fastpath`` is built
    (Lovász's construction asks thousands of these per 16-GPU plan).

    >>> max_flow([[0, 2, 1], [0, 0, 1], [0, 0, 0]], 0, 2)
    (2.0, {0, 1})
    """
    native = compiled_helper("max_flow")
    if native is not None:
        flow, flags = native(np.ascontiguousarray(cap, dtype=np.float64), int(source), int(sink),
                             float(enough))
        return flow, {v for v, f in enumerate(flags) if f}
    return _max_flow(cap, source, sink, enough)


def _max_flow(cap, source: int, sink: int, enough: float) -> tuple[float, set]:
    n = len(cap)
    left = [list(map(float, row)) for row in cap]
    flow = 0.0
    while flow < enough:
        back = [-1] * n
        back[source] = source
        frontier = [source]
        while frontier and back[sink] < 0:
            nxt = []
            for u in frontier:
                row = left[u]
                for v in range(n):
                    if back[v] < 0 and row[v] > 1e-12:
                        back[v] = u
                        nxt.append(v)
            frontier = nxt
        if back[sink] < 0:
            return flow, {v for v in range(n) if back[v] >= 0}
        push, v = float("inf"), sink
        while v != source:
            push = min(push, left[back[v]][v])
            v = back[v]
        v = sink
        while v != source:
            u = back[v]
            left[u][v] -= push
            left[v][u] += push
            v = u
        flow += push
    return flow, set()


def cut_rate(G: nx.DiGraph, gpus, towards=None) -> tuple[float, frozenset]:
    """``min_S B+(S) / |S ∩ C|`` over sets ``S`` with some but not all GPUs, and a minimizer;
    ``towards``: the max-flows run only to these GPUs (one per orbit of a symmetric graph).

    Notes
    -----
    For a rate ``x`` add a source with an arc of capacity ``x`` to every GPU. A cut separating
    the source from GPU ``v`` with source side ``{s} ∪ S`` costs ``x |C \\ S| + B+(S)``, so
    ``maxflow(s -> v) >= N x`` for every ``v`` iff ``B+(S) >= x |S ∩ C|`` for every ``S``.
    Dinkelbach's iteration starts from a valid ratio, takes the most violated cut at that
    ``x`` and moves to its ratio; it stops at the exact minimum after a few rounds of N max-flows.
    The cuts come from :func:`max_flow`, whose residual test has a tolerance: a partition read
    off a floating-point preflow by exact comparison (networkx's ``minimum_cut``) can name a
    side that the flow value does not belong to, depending on the order the graph was built in.
    """
    C = tuple(gpus)
    v = min(C, key=lambda g: sum(d["cap"] for _, _, d in G.in_edges(g, data=True)))
    S = frozenset(G.nodes) - {v}   # start from the GPU with the least coming in
    x = _ratio(G, S, C)
    nodes = list(G.nodes)
    at = {u: i for i, u in enumerate(nodes)}
    source = len(nodes)
    cap = np.zeros((source + 1, source + 1))
    for a, b, c in G.edges(data="cap"):
        cap[at[a], at[b]] = c
    for _ in range(100):
        cap[source, [at[g] for g in C]] = x
        worst, worst_S = 0.0, None
        for t in C if towards is None else towards:
            value, reached = max_flow(cap, source, at[t])
            side = frozenset(nodes[i] for i in reached if i != source)
            # no set without GPUs falls short (all N source arcs cross its cut): one that
            # seems to is rounding in the flow
            if value - len(C) * x < worst and any(g in side for g in C):
                worst, worst_S = value - len(C) * x, side
        if worst_S is None or worst > -1e-9 * x:
            return x, S
        x, S = _ratio(G, worst_S, C), worst_S
    raise PlanError("cut bound search did not converge in 100 rounds; report this topology")


def _ratio(G, S, C) -> float:
    # fsum: rounded once, whatever order the links come in (it follows string hashing)
    out = math.fsum(d["cap"] for u, w, d in G.edges(data=True) if u in S and w not in S)
    return out / len([g for g in C if g in S])


def max_flows(G: nx.DiGraph, capacity: str = "cap"):
    """``value(s, t)``: the max-flow value from ``s`` to ``t`` over ``G``'s ``capacity`` (a
    link without one carries nothing), its dense matrix built once for every pair asked
    (:func:`max_flow`: networkx's preflow push took milliseconds a pair)."""
    at = {v: i for i, v in enumerate(G)}
    cap = np.zeros((len(at), len(at)))
    for a, b, c in G.edges(data=capacity, default=0.0):
        cap[at[a], at[b]] = c
    return lambda s, t: float(max_flow(cap, at[s], at[t])[0])


def rooted_flow(G: nx.DiGraph, gpus, root, inbound: bool = False) -> float:
    """``min_v maxflow(root -> v)`` over the other GPUs (``v -> root`` when ``inbound``)."""
    value = max_flows(G)
    return min(value(v, root) if inbound else value(root, v) for v in gpus if v != root)


def min_pair_flow(G: nx.DiGraph, gpus) -> float:
    """Min over ordered GPU pairs of maxflow, with 2(N-1) max-flows.

    Any cut between GPUs either keeps ``gpus[0]`` inside (then some ``maxflow(g0 -> v)`` meets
    it) or outside (some ``maxflow(v -> g0)`` does)."""
    return min(rooted_flow(G, gpus, gpus[0]), rooted_flow(G, gpus, gpus[0], inbound=True))


def alltoall_rate(G: nx.DiGraph, gpus) -> float:
    """Largest rate every ordered GPU pair can exchange at once (max concurrent flow LP).

    Flows of one source are merged into one commodity (exact for multicommodity flow). Rows:
    conservation per (source, node), capacity per link. Variables: flow per (source, link), t."""
    index = LinkIndex.of(G)
    m, n_src = len(index.links), len(gpus)
    nvar = n_src * m + 1   # every other GPU absorbs t, the source emits (N-1) t
    A_eq = _conservation(index, [{src: 1 - n_src, **{g: 1.0 for g in gpus if g != src}}
                                 for src in gpus], nvar)
    ub_r = [e for s in range(n_src) for e in range(m)]
    A_ub = sp.csr_matrix((np.ones(len(ub_r)), (ub_r, range(len(ub_r)))), shape=(m, nvar))
    c = np.zeros(nvar)
    c[-1] = -1.0
    res = linprog(c, A_ub=A_ub, b_ub=np.asarray(index.caps), A_eq=A_eq,
                  b_eq=np.zeros(A_eq.shape[0]), bounds=(0, None), method="highs")
    if res.status != 0:
        raise PlanError(f"alltoall flow LP failed: {res.message}")
    return float(res.x[-1])


def _conservation(index: LinkIndex, rates: list, nvar: int) -> sp.csr_matrix:
    """Flow conservation rows of commodities over ``index``'s links, a commodity's flow on
    link ``e`` in column ``p * len(links) + e`` and the rate in the last of ``nvar``: per
    commodity ``p`` and node ``v``, outflow - inflow + ``rates[p].get(v, 0)`` * rate = 0."""
    nodes = {v: i for i, v in enumerate(index.nodes)}
    m, nv = len(index.links), len(index.nodes)
    tails = np.array([nodes[a] for a, _ in index.links], dtype=np.int64)
    heads = np.array([nodes[b] for _, b in index.links], dtype=np.int64)
    rows, cols, vals = [], [], []
    for p, at in enumerate(rates):
        cols += [np.arange(p * m, (p + 1) * m)] * 2 + [np.full(len(at), nvar - 1)]
        rows += [p * nv + tails, p * nv + heads, p * nv + np.array([nodes[v] for v in at])]
        vals += [np.ones(m), -np.ones(m), np.array(list(at.values()), dtype=float)]
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(len(rates) * nv, nvar))


COPIERS = ("gpu", "cpu")   # nodes that can store what they receive and send it again


def multicast_rate(G: nx.DiGraph, gpus, roots=None, *, symmetric: bool = True) -> float:
    """Largest rate ``x`` at which every root (default: every GPU) can send its data to all
    other GPUs at once: an LP relaxation of the allgather (or, with one root, broadcast)
    optimum in which GPUs and CPUs (host memory) may copy what passes through them and
    switches only forward.

    Why: the cut bound is the allgather optimum on graphs whose relays pass on what they take
    in (ForestColl's edge splitting), but not once a switch is split into an upward and a
    downward half (:mod:`.view`): two GPUs relaying to each other through the CPU share its
    uplink, and two GPUs below one switch share its downlink, which no single cut sees.
    Copying at GPUs and CPUs only loosens the problem, so this is still an upper bound.

    Rows: conservation per (root, destination, node); the flow of each (root, destination)
    over a link is at most the root's usage ``y`` of it; the roots' usages share each link; a
    switch sends on no more of a root's data than it receives (it copies nothing). With
    ``symmetric``, roots that an automorphism of ``G`` carries onto each other share one root's
    variables (:func:`~.symmetry.orbits`: some optimum uses the links alike for all of them);
    ``symmetric=False`` solves for every root, the same rate with more variables.

    >>> from collectx.topology import load
    >>> from collectx.topology.view import job_graph, without_turnarounds
    >>> H = without_turnarounds(job_graph(load("dgx1v"), ["GPU0", "GPU1"]), ["GPU0", "GPU1"])
    >>> round(cut_rate(H, ["GPU0", "GPU1"])[0], 3), round(multicast_rate(H, ["GPU0", "GPU1"]), 3)
    (40.75, 32.875)

    Four DGX-1P GPUs, two below each of two PCIe switches: each switch's downlink feeds both
    of its GPUs, so PCIe adds 15.75 GB/s per pair, not per GPU (the cut counts 18.58 per root).

    >>> four = ["GPU0", "GPU1", "GPU4", "GPU5"]
    >>> round(multicast_rate(without_turnarounds(job_graph(load("dgx1p"), four), four), four), 3)
    15.958
    """
    index = LinkIndex.of(G)
    m = len(index.links)
    roots = list(range(len(gpus))) if roots is None else list(roots)
    groups = (_root_orbits(G, index, gpus, roots) if symmetric and len(roots) > 1 else
              [(k, [list(range(m))]) for k in roots])
    reps = [k for k, _ in groups]
    pairs = [(j, v) for j, k in enumerate(reps) for v in range(len(gpus)) if v != k]
    nf, ny = len(pairs) * m, len(reps) * m
    x_col = nf + ny        # the root emits x, the destination absorbs it
    A_eq = _conservation(index, [{gpus[reps[j]]: -1.0, gpus[v]: 1.0} for j, v in pairs],
                         x_col + 1)
    f = list(range(nf))
    owner = [nf + j * m + e for j, _ in pairs for e in range(m)]
    # sum over roots of their usage of e <= cap[e]: a root of an orbit uses link links[e] as
    # its representative uses e
    cap_r = [nf + link[e] for _, links in groups for link in links for e in range(m)]
    cap_c = [nf + j * m + e for j, (_, links) in enumerate(groups) for _ in links
             for e in range(m)]
    ub_r, ub_c = f + f + cap_r, f + owner + cap_c       # f[p, e] - y[k, e] <= 0
    ub_v = [1.0] * nf + [-1.0] * nf + [1.0] * len(cap_r)
    row = nf + m
    kinds = dict(G.nodes(data="kind"))
    for w in (w for w in index.nodes if kinds.get(w) not in COPIERS):
        touching = [(e, 1.0 if a == w else -1.0) for e, (a, b) in enumerate(index.links)
                    if w in (a, b)]
        for k in range(len(reps)):            # out - in of root k's data at a switch <= 0
            ub_r += [row] * len(touching)
            ub_c += [nf + k * m + e for e, _ in touching]
            ub_v += [sign for _, sign in touching]
            row += 1
    A_ub = sp.csr_matrix((ub_v, (ub_r, ub_c)), shape=(row, x_col + 1))
    b_ub = np.concatenate([np.zeros(nf), np.asarray(index.caps, dtype=float),
                           np.zeros(row - nf - m)])
    c = np.zeros(x_col + 1)
    c[-1] = -1.0
    # A root's flow back into the root only closes cycles: fixed at 0, the optimum stays, and
    # HiGHS solves the largest 16-GPU split-switch LP in half the time (fixing flows out of their
    # sink instead made it 5x slower: the simplex's path, more than the LP's size, decides)
    heads = np.array([b for _, b in index.links], dtype=object)
    idle = np.concatenate([heads == gpus[reps[j]] for j, _ in pairs])
    most = np.r_[np.where(idle, 0.0, np.inf), np.full(ny + 1, np.inf)]
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=np.zeros(A_eq.shape[0]),
                  bounds=np.c_[np.zeros(x_col + 1), most], method="highs")
    if res.status != 0:
        raise PlanError(f"multicast flow LP failed: {res.message}")
    return float(res.x[-1])


def _root_orbits(G: nx.DiGraph, index: LinkIndex, gpus, roots) -> list:
    """``roots`` (indices into ``gpus``) in orbits of ``G``'s automorphisms
    (:func:`~.symmetry.orbits`): per orbit, its representative and, per
    root of it, the link ids the representative's links are carried onto."""
    at = {gpus[k]: k for k in roots}
    return [(at[rep], [[index.ids[carry[a], carry[b]] for a, b in index.links]
                       for _, carry in members])
            for rep, members in orbits(G, [gpus[k] for k in roots])]
