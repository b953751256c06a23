"""Equal unit-rate trees over direct links counted in whole lanes: Edmonds' disjoint
broadcast trees, and greedy spanning trees for Blink allreduce.

Why
---
The LP of :func:`~.treepack.pack_out_trees` reaches the broadcast optimum with a few trees of
very different rates, but a link is shared equally among the transfers crossing it, so unequal
trees never get their planned rates. When every direct GPU link is a whole multiple of one
unit (xGMI links of 1, 2 or 4 lanes of 50 GB/s), Edmonds' branching theorem gives ``k``
out-trees from the root that use each link at most its multiplicity times, where ``k`` is the
smallest max-flow from the root in units: ``k`` equal trees of one unit each reach the
optimum, and a link crossed by ``m`` tree edges carries ``m`` equal transfers, exactly what it
was planned for.

How it works
------------
Lovász's constructive proof: trees are grown one edge at a time, and edge ``(u, v)`` joins the
tree being grown only if afterwards the unused links still hold ``k - 1`` unit paths from the
root to every GPU, and ``k`` from the tree to every GPU outside it (max-flows per GPU). The
theorem says some edge always passes. Among passing edges the one nearest the root is taken,
so the trees stay shallow and their pipelines fill sooner; local moves that keep every link's
count then shorten the deepest trees (:func:`_shallower`).

Allreduce trees are used both ways, so they must share each GPU pair's lanes undirected
(Nash-Williams–Tutte); :func:`spanning_unit_trees` finds them greedily, not exactly.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from .treepack import Packing, Tree

UNIT_TOL = 1e-6


def lane_counts(index, gpus, routes: dict) -> tuple[float, np.ndarray, dict] | None:
    """The common unit (GB/s), the ``n x n`` integer multiplicities of direct GPU links and
    the link id of each, or None when a direct link is not a whole multiple of the unit."""
    at = {g: i for i, g in enumerate(gpus)}
    direct = {}
    for (a, b), route in routes.items():
        if a in at and b in at and len(route) == 1 and abs(route[0][1] - 1.0) < UNIT_TOL:
            direct[at[a], at[b]] = route[0][0]
    if not direct:
        return None
    caps = {e: index.caps[link] for e, link in direct.items()}
    unit = min(caps.values())
    mult = np.zeros((len(gpus), len(gpus)), dtype=np.int32)
    for (a, b), cap in caps.items():
        k = round(cap / unit)
        if k < 1 or abs(cap - k * unit) > UNIT_TOL * cap:
            return None
        mult[a, b] = k
    return unit, mult, direct


def _paths_ok(mult: np.ndarray, root: int, k: int, inside: set) -> bool:
    """Lovász's condition for completing the tree spanning ``inside`` (root included) and
    ``k - 1`` more from the links ``mult`` leaves: ``k - 1`` unit paths from the root to every
    GPU, and ``k`` from the tree (taken as one source) to every GPU outside it."""
    n = len(mult)
    plain = csr_matrix(mult)
    big = mult.copy()
    for t in inside:
        if t != root:
            big[root, t] = n * int(mult.max() + 1) * max(k, 1)
    merged = csr_matrix(big)
    for v in range(n):
        if v == root:
            continue
        if v not in inside and maximum_flow(merged, root, v).flow_value < k:
            return False
        if k > 1 and maximum_flow(plain, root, v).flow_value < k - 1:
            return False
    return True


def disjoint_arborescences(mult: np.ndarray, root: int, k: int) -> list | None:
    """``k`` out-trees from ``root`` spanning every GPU, together using arc ``(u, v)`` at
    most ``mult[u, v]`` times: each a list of top-down ``(parent, child)`` pairs, the deepest
    then shortened by local moves (:func:`_shallower`). None when some GPU has fewer than
    ``k`` unit paths from the root."""
    n = len(mult)
    left = mult.copy()
    if not _paths_ok(left, root, k, {root}):
        return None
    sets = _SetTest.of(n, root)
    trees = []
    for i in range(k, 0, -1):
        level = {root: 0}
        edges: list = []
        while len(level) < n:
            edge = _next_edge(left, root, i, level, sets)
            if edge is None:      # cannot happen when the theorem's condition holds
                return None
            u, v = edge
            left[u, v] -= 1
            level[v] = level[u] + 1
            edges.append(edge)
        trees.append(edges)
    return _shallower(trees, left, root)


SWEEPS = 30


def _shallower(trees: list, left: np.ndarray, root: int) -> list:
    """The trees after local moves that keep every link's use and shorten the pipelines.

    Lovász's construction completes one tree before the next, and the later trees get the
    leftovers, ~13 levels deep on mi250_16gcd. Two moves keep the packing valid: a GPU swaps
    its parents in two trees (each link keeps its count), or takes its parent in one tree over
    a link with an unused lane. A move is kept when it lowers (deepest tree, sum of the trees'
    depths, sum of all levels) and leaves both trees acyclic.
    """
    par = [_parents(edges, root, len(left)) for edges in trees]
    left = left.copy()
    stats = [_tree_stats(p, root) for p in par]   # (depth, sum of levels) per tree
    score = _score(stats)
    for _ in range(SWEEPS):
        improved = False
        for v in range(len(left)):
            if v == root:
                continue
            for move in _moves(par, left, v):
                undo = _apply(par, left, v, move)
                if undo is None:
                    continue
                touched = {move[1], move[2]} if move[0] == "swap" else {move[1]}
                before = {i: stats[i] for i in touched}
                for i in touched:
                    stats[i] = _tree_stats(par[i], root)
                new = _score(stats)
                if new < score:
                    score, improved = new, True
                else:
                    _apply(par, left, v, undo)
                    for i, kept in before.items():
                        stats[i] = kept
        if not improved:
            break
    return [_top_down_pairs(p, root) for p in par]


def _tree_stats(par: list, root: int) -> tuple:
    levels = _levels_of(par, root)
    return max(levels), sum(levels)


def _score(stats: list) -> tuple:
    """(deepest tree, sum of the trees' depths, sum of all levels): lower is shallower."""
    return (max(d for d, _ in stats), sum(d for d, _ in stats), sum(s for _, s in stats))


def _moves(par: list, left: np.ndarray, v: int):
    k = len(par)
    for a in range(k):
        for b in range(a + 1, k):
            if par[a][v] != par[b][v]:
                yield ("swap", a, b)
        for q in np.nonzero(left[:, v] > 0)[0]:
            if q != par[a][v]:
                yield ("spare", a, int(q))


def _apply(par: list, left: np.ndarray, v: int, move):
    """Apply ``move`` at ``v``; its inverse, or None (nothing changed) if it makes a cycle."""
    kind, a, x = move
    if kind == "swap":
        b = x
        if _under(par[a], par[b][v], v) or _under(par[b], par[a][v], v):
            return None
        par[a][v], par[b][v] = par[b][v], par[a][v]
        return move
    old = par[a][v]
    if _under(par[a], x, v):
        return None
    left[old, v] += 1
    left[x, v] -= 1
    par[a][v] = x
    return ("spare", a, old)


def _under(parent: list, u: int, v: int) -> bool:
    """Whether ``u`` lies in the subtree of ``v`` (``v`` itself included)."""
    while u >= 0:
        if u == v:
            return True
        u = parent[u]
    return False


def _parents(edges: list, root: int, n: int) -> list:
    par = [-1] * n
    for p, c in edges:
        par[c] = p
    return par


def _levels_of(par: list, root: int) -> list:
    level = [0] * len(par)
    for v in range(len(par)):
        d, u = 0, v
        while u != root:
            u, d = par[u], d + 1
        level[v] = d
    return level


def _top_down_pairs(par: list, root: int) -> list:
    level = _levels_of(par, root)
    order = sorted((v for v in range(len(par)) if v != root), key=lambda v: (level[v], v))
    return [(par[v], v) for v in order]


def _next_edge(left: np.ndarray, root: int, k: int, level: dict, sets: "_SetTest | None"):
    """The shallowest arc leaving the tree (grown from ``level``) after which the unused links
    still satisfy Lovász's condition (:func:`_paths_ok`, or all at once by ``sets``) for this
    tree and ``k - 1`` more."""
    n = len(left)
    arcs = [(u, v) for u in sorted(level, key=level.get)
            for v in sorted(range(n), key=lambda v: -left[u, v])
            if v not in level and left[u, v] > 0]
    if sets is not None:
        passing = np.flatnonzero(sets.passing(left, k, level, arcs))
        return arcs[passing[0]] if len(passing) else None
    for u, v in arcs:
        left[u, v] -= 1
        ok = _paths_ok(left, root, k, set(level) | {v})
        left[u, v] += 1
        if ok:
            return u, v
    return None


class _SetTest:
    """Lovász's condition over every vertex set at once: ``k - 1`` unit paths from the root
    to every GPU is every set without the root entered ``k - 1`` times, and ``k`` from the
    tree to every GPU outside it is every set that misses the tree entered ``k`` times. With
    the ``2^(n-1) - 1`` sets as rows of one matrix, every candidate arc is tested in a few
    vector operations instead of ``2 (n - 1)`` max-flows each (31 trees of 8 GPUs: a few ms
    instead of 0.6 s). Up to :data:`MOST_SET_VERTICES` GPUs."""

    def __init__(self, n: int, root: int):
        self.n = n
        self.inside = inside = sets_without(n, root)                      # sets x vertices
        self.enters = (inside[:, None, :] & ~inside[:, :, None]).reshape(len(inside), n * n) \
            .astype(np.int64)

    @classmethod
    def of(cls, n: int, root: int) -> "_SetTest | None":
        """The cached test of ``n`` GPUs, or None past :data:`MOST_SET_VERTICES` (read on each
        call, not cached with the test)."""
        return _set_test(n, root) if n <= MOST_SET_VERTICES else None

    def passing(self, left: np.ndarray, k: int, level: dict, arcs: list) -> np.ndarray:
        """Whether each of ``arcs`` keeps the condition once taken (bool per arc)."""
        if not arcs:
            return np.zeros(0, dtype=bool)
        n = self.n
        ids = [u * n + v for u, v in arcs]
        after = (self.enters @ left.ravel())[:, None] - self.enters[:, ids]   # sets x arcs
        misses = ~self.inside[:, list(level)].any(axis=1)
        heads = [v for _, v in arcs]
        missed = misses[:, None] & ~self.inside[:, heads]
        return (after >= k - 1).all(axis=0) & ((after >= k) | ~missed).all(axis=0)


MOST_SET_VERTICES = 12   # 2047 vertex sets, a row each


@lru_cache(maxsize=None)
def sets_without(n: int, root: int) -> np.ndarray:
    """Every nonempty set of ``range(n)`` without ``root``, a row of membership flags each.

    >>> sets_without(3, 0).astype(int).tolist()
    [[0, 1, 0], [0, 0, 1], [0, 1, 1]]
    """
    masks = np.array([s for s in range(1, 1 << n) if not (s >> root) & 1], dtype=np.int64)
    return ((masks[:, None] >> np.arange(n)[None, :]) & 1).astype(bool)


@lru_cache(maxsize=None)
def _set_test(n: int, root: int) -> _SetTest:
    return _SetTest(n, root)


def pack_unit_trees(index, gpus, root, routes: dict, rate: float) -> Packing | None:
    """Edge-disjoint unit-rate out-trees from ``root`` (see the module doc) when they reach
    ``rate`` (the LP's), else None: links that are not whole multiples of one unit, GPU pairs
    joined only through switches, or too few trees."""
    gpus = tuple(gpus)
    found = lane_counts(index, gpus, routes)
    if found is None:
        return None
    unit, mult, direct = found
    k = int(np.floor(rate / unit + UNIT_TOL))
    if k < 1 or k * unit < rate * (1 - 1e-9):
        return None
    trees = disjoint_arborescences(mult, gpus.index(root), k)
    if trees is None:
        return None
    out = []
    for edges in trees:
        named = tuple((gpus[p], gpus[c]) for p, c in edges)
        paths = tuple(((direct[e], 1.0),) for e in edges)
        out.append(Tree(root, root, named, paths, unit))
    return Packing(rate=unit * k, trees=tuple(out), rounds=1, columns=tuple(out), balanced=True)


def spanning_unit_trees(mult: np.ndarray, k: int, roots) -> list | None:
    """``k`` spanning trees used both ways (reduce up, broadcast down), together crossing each
    GPU pair ``{u, v}`` at most ``mult[u, v]`` times, tree ``i`` grown from ``roots[i]``: each a
    list of top-down ``(parent, child)`` pairs, or None when the greedy runs out of links.

    Greedy, not exact (the exact test is a matroid union): each tree grows breadth-first over
    the pairs with the most unused lanes, so the trees stay shallow and the lanes even.
    """
    n = len(mult)
    left = np.minimum(mult, mult.T).astype(np.int64)
    trees = []
    for i in range(k):
        root = roots[i % len(roots)]
        level = {root: 0}
        edges: list = []
        while len(level) < n:
            best = None
            for u in level:
                for v in range(n):
                    if v in level or left[u, v] <= 0:
                        continue
                    key = (-left[u, v], level[u], u, v)
                    if best is None or key < best:
                        best = key
            if best is None:
                return None
            _, _, u, v = best
            left[u, v] -= 1
            left[v, u] -= 1
            level[v] = level[u] + 1
            edges.append((u, v))
        trees.append(edges)
    return trees


def depth_balanced_counts(trees, nchunks: int) -> list:
    """``[(tree, chunks)]`` for equal-rate trees so that every tree ends together.

    A tree of depth ``d`` with ``m`` chunks finishes after about ``m + d - 1`` chunk times
    (its pipeline fills one level per chunk time), so equal shares leave the deepest tree
    last; giving each tree ``M - d`` chunks evens out the ends.
    """
    depth = [t.depth() for t in trees]
    k = len(trees)
    level = (nchunks + sum(depth)) / k
    want = [max(1.0, level - d) for d in depth]
    scale = nchunks / sum(want)
    counts = [max(1, int(w * scale)) for w in want]
    order = sorted(range(k), key=lambda i: want[i] * scale - counts[i], reverse=True)
    i = 0
    while sum(counts) < nchunks:          # largest remainders first
        counts[order[i % k]] += 1
        i += 1
    while sum(counts) > nchunks:          # only when the floors of 1 overshoot
        j = max(range(k), key=lambda t: counts[t])
        counts[j] -= 1
    return [(t, c) for t, c in zip(trees, counts)]


def pack_unit_spanning_trees(G, ranks) -> Packing | None:
    """As many unit-rate spanning trees used both ways (Blink allreduce) as
    :func:`spanning_unit_trees` finds, each grown from another GPU, priced by simulator routes;
    None when the direct links are not whole lanes or no tree fits."""
    from ..topology.view import LinkIndex, simulator_routes
    index = LinkIndex.of(G)
    routes = simulator_routes(G, index, ranks)
    gpus = tuple(ranks)
    found = lane_counts(index, gpus, routes)
    if found is None:
        return None
    unit, mult, direct = found
    both = np.minimum(mult, mult.T)
    if any((b, a) not in direct for a, b in direct):
        return None
    n = len(gpus)
    most = int(both.sum() // 2) // max(n - 1, 1)
    for k in range(most, 0, -1):
        trees = spanning_unit_trees(both, k, list(range(n)))
        if trees is not None:
            break
    else:
        return None
    out = []
    for edges in trees:
        named = tuple((gpus[p], gpus[c]) for p, c in edges)
        paths = tuple(((direct[e], 1.0), (direct[e[::-1]], 1.0)) for e in edges)
        out.append(Tree(0, named[0][0], named, paths, unit))
    return Packing(rate=unit * k, trees=tuple(out), rounds=1, columns=tuple(out), balanced=True)
