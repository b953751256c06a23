"""Edmonds' disjoint arborescences, built by Lovász's construction: counted tree arcs dealt
into ``k`` out-trees from a root.

Why
---
The packing program (:mod:`.program`) counts how many arcs of each GPU pair ``k`` equal trees
of one root use; Edmonds' branching theorem says the counts hold ``k`` arc-disjoint arborescences
exactly when every GPU set without the root is entered ``k`` times. This module finds them.

How it works
------------
Lovász's constructive proof: trees are grown one edge at a time, and edge ``(u, v)`` joins the
tree being grown only if afterwards the unused arcs still hold ``k - 1`` paths from the root
to every GPU, and ``k`` from the tree to every GPU outside it (max-flows per GPU, or one test
over every vertex set at once for small ``n``). The theorem says some edge always passes.
Among passing edges the one nearest the root is taken, so the trees stay shallow and their
pipelines fill sooner; local moves that keep every arc's count then shorten the deepest trees
(:func:`_shallower`).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from .._native import compiled_helper
from ..topology.flows import max_flow


def _paths_ok(mult: np.ndarray, root: int, k: int, inside: set) -> bool:
    """Lovász's condition for completing the tree spanning ``inside`` (root included) and
    ``k - 1`` more from the links ``mult`` leaves: ``k - 1`` unit paths from the root to every
    GPU, and ``k`` from the tree (taken as one source) to every GPU outside it. In C where
    ``collectx._fastpath`` is built: the loop cost more than its max-flows."""
    n, native = len(mult), compiled_helper("paths_ok")
    if native is not None:
        return native(np.ascontiguousarray(mult, dtype=np.float64), int(root), int(k),
                      bytes(v in inside for v in range(n)))
    big = mult.copy()
    for t in inside:
        if t != root:
            big[root, t] = n * int(mult.max() + 1) * max(k, 1)
    for v in range(n):
        if v == root:
            continue
        if v not in inside and max_flow(big, root, v, k)[0] < k:
            return False
        if k > 1 and max_flow(mult, root, v, k - 1)[0] < k - 1:
            return False
    return True


def disjoint_arborescences(mult: np.ndarray, root: int, k: int) -> list | None:
    """``k`` out-trees from ``root`` spanning every GPU, together using arc ``(u, v)`` at most
    ``mult[u, v]`` times: each a list of top-down ``(parent, child)`` pairs, the deepest then
    shortened by local moves (:func:`_shallower`). None if some GPU has under ``k`` paths."""
    n = len(mult)
    left = mult.copy()
    if not _paths_ok(left, root, k, {root}):
        return None
    sets = _SetTest.of(n, root)
    if sets is not None:
        trees = _grown_together(left, root, k, sets)
        return None if trees is None else _shallower(trees, left, root)
    trees = []
    for i in range(k, 0, -1):
        level = {root: 0}
        edges: list = []
        while len(level) < n:
            edge = _next_edge(left, root, i, level)
            if edge is None:      # cannot happen when the theorem's condition holds
                return None
            u, v = edge
            left[u, v] -= 1
            level[v] = level[u] + 1
            edges.append(edge)
        trees.append(edges)
    return _shallower(trees, left, root)


def _grown_together(left: np.ndarray, root: int, k: int, sets: "_SetTest") -> list:
    """The ``k`` trees grown at once, level by level: the next arc goes to the tree whose
    shallowest open arc is shallowest (the smallest tree on ties), so no tree gets the deep
    leftovers of the others. ``left`` loses the arcs taken (in C when built: the same arcs).

    Edmonds' theorem with root sets says which arcs may be taken: partial trees ``T_i`` can
    all be completed from the unused arcs exactly when every vertex set ``X`` is entered at
    least as often as there are trees that miss it (a set holding the root misses none)."""
    native = compiled_helper("grown_together")
    if native is not None:
        work = np.ascontiguousarray(left, dtype=np.float64)
        trees = native(work, int(root), int(k))   # takes the arcs from work
        left[...] = work
        return trees
    n = len(left)
    inside, enters = sets.inside, sets.enters
    entering = enters @ left.ravel()                       # per set, unused arcs entering it
    touched = np.zeros((k, len(inside)), dtype=bool)       # tree i meets set X
    missing = np.full(len(inside), k, dtype=np.int64)      # trees that miss set X
    level = [{root: 0} for _ in range(k)]
    edges: list = [[] for _ in range(k)]

    def shallowest_open(lv: dict) -> int:
        if len(lv) == n:
            return n + 1
        return min((lv[u] for u in lv for v in range(n) if v not in lv and left[u, v] > 0),
                   default=n)

    # Per tree, updated only when it can change: the tree grew, or an arc out of it ran out.
    open_level = [shallowest_open(lv) for lv in level]
    for _ in range(k * (n - 1)):
        i = min(range(k), key=lambda t: (open_level[t], len(level[t])))
        lv = level[i]
        arcs = [(u, v) for u in sorted(lv, key=lv.get)
                for v in sorted(range(n), key=lambda v: -left[u, v])
                if v not in lv and left[u, v] > 0]
        ids = [u * n + v for u, v in arcs]
        heads = [v for _, v in arcs]
        after = entering[:, None] - enters[:, ids]
        still = missing[:, None] - (inside[:, heads] & ~touched[i][:, None])
        passing = np.flatnonzero((after >= still).all(axis=0))
        if not len(passing):      # cannot happen when the theorem's condition holds
            return None
        u, v = arcs[passing[0]]
        left[u, v] -= 1
        entering -= enters[:, u * n + v]
        fresh = inside[:, v] & ~touched[i]
        touched[i] |= fresh
        missing -= fresh
        lv[v] = lv[u] + 1
        edges[i].append((u, v))
        open_level[i] = shallowest_open(lv)
        if not left[u, v]:
            for t, other in enumerate(level):
                if u in other and v not in other:
                    open_level[t] = shallowest_open(other)
    return edges


def _shallower(trees: list, left: np.ndarray, root: int) -> list:
    """The trees after local moves that keep every link's use and shorten the pipelines (in C
    when built: the same moves, order and result). Lovász's construction completes one tree
    before the next, and later trees get the leftovers, ~13 levels deep on mi250_16gcd. Two
    moves keep the packing valid: a GPU swaps its parents in two trees (each link keeps its
    count) or takes its parent in one over a link with an unused lane. A move is kept when it
    lowers (deepest tree, sum of depths, sum of all levels) and leaves both trees acyclic."""
    native = compiled_helper("shallower")
    if native is not None:
        return native(np.ascontiguousarray(left, dtype=np.float64), int(root), trees)
    par = [_parents(edges, root, len(left)) for edges in trees]
    left = left.copy()
    levels = [_levels_of(p, root) for p in par]
    stats = _Shape([(max(lv), sum(lv)) for lv in levels])
    score = stats.score()
    improved = True
    while improved:   # every kept move lowers the score, so this ends
        improved = False
        for v in range(len(left)):
            if v == root:
                continue
            for move in _moves(par, left, v):
                if _no_rise(move, par, levels, v):
                    continue   # no level falls, so neither does the score: not worth a try
                undo = _apply(par, left, v, move)
                if undo is None:
                    continue
                touched = {i: _levels_of(par[i], root) for i in
                           ((move[1], move[2]) if move[0] == "swap" else (move[1],))}
                before = {i: stats[i] for i in touched}
                for i, lv in touched.items():
                    stats[i] = max(lv), sum(lv)
                new = stats.score()
                if new < score:
                    score, improved = new, True
                    for i, lv in touched.items():
                        levels[i] = lv
                else:
                    _apply(par, left, v, undo)
                    for i, kept in before.items():
                        stats[i] = kept
    return [_top_down_pairs(p, root) for p in par]


def _no_rise(move, par: list, levels: list, v: int) -> bool:
    """Whether ``move`` at ``v`` gives it no shallower parent in any tree it changes (a new
    parent inside ``v``'s subtree, a cycle, :func:`_apply` refuses anyway)."""
    kind, a, x = move
    if kind == "swap":
        return (levels[a][par[x][v]] >= levels[a][par[a][v]] and
                levels[x][par[a][v]] >= levels[x][par[x][v]])
    return levels[a][x] >= levels[a][par[a][v]]


class _Shape:
    """Every tree's (depth, sum of levels), and their score kept from tallies as a move
    changes one or two of up to :data:`~.schedule.ir.MAX_LANES` trees (not summed again).

    >>> s = _Shape([(2, 5), (3, 6)]); s.score()
    (3, 5, 11)
    >>> s[1] = (2, 4); s.score()
    (2, 4, 9)
    """

    def __init__(self, stats: list):
        self._stats = list(stats)
        self._depths = Counter(d for d, _ in stats)
        self._sums = [sum(d for d, _ in stats), sum(s for _, s in stats)]

    def __getitem__(self, i: int) -> tuple:
        return self._stats[i]

    def __setitem__(self, i: int, new: tuple) -> None:
        old = self._stats[i]
        self._depths[old[0]] -= 1
        self._depths[new[0]] += 1
        self._sums[0] += new[0] - old[0]
        self._sums[1] += new[1] - old[1]
        self._stats[i] = new

    def score(self) -> tuple:
        """(deepest tree, sum of the trees' depths, sum of all levels): lower is shallower."""
        return (max(d for d, c in self._depths.items() if c), *self._sums)


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


def _next_edge(left: np.ndarray, root: int, k: int, level: dict):
    """The shallowest arc leaving the tree (grown from ``level``) after which the unused links
    still satisfy Lovász's condition (:func:`_paths_ok`) for this tree and ``k - 1`` more."""
    n = len(left)
    rows = {u: left[u].tolist() for u in level}   # not numpy scalars, one per arc
    arcs = [(u, v) for u in sorted(level, key=level.get)
            for v in sorted(range(n), key=lambda v: -rows[u][v])
            if v not in level and rows[u][v] > 0]
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
    tree to every GPU outside it is every set that misses the tree entered ``k`` times. The
    ``2^(n-1) - 1`` sets (up to :data:`SET_ROWS`) as rows of one matrix test an arc in a few
    vector operations, not ``2 (n - 1)`` max-flows (31 trees of 8 GPUs: a few ms, not 0.6 s)."""

    def __init__(self, n: int, root: int):
        self.n = n
        self.inside = inside = sets_without(n, root)                      # sets x vertices
        self.enters = (inside[:, None, :] & ~inside[:, :, None]).reshape(len(inside), n * n) \
            .astype(np.int64)

    @classmethod
    def of(cls, n: int, root: int) -> "_SetTest | None":
        """The cached test of ``n`` GPUs, or None past :data:`SET_ROWS` sets (read on each
        call, not cached with the test)."""
        return _set_test(n, root) if 1 << (n - 1) <= SET_ROWS else None


# Vertex sets are written out, a row each, while there are at most this many (2^(n-1) - 1
# per root: 12 GPUs); past it max-flows find the sets that matter, one flow at a time.
SET_ROWS = 2048


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
