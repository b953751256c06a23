"""Fractional packing of GPU trees into link capacities (LP with column generation).

How it works
------------
A *column* is one GPU tree: an out-arborescence from a root GPU, or a spanning tree used both
ways. Each tree edge is a path over links, so a column uses a multiset of directed links.
Columns are grouped (one group per root's data); the LP is

    maximize x   s.t.   sum_{k in group g} lam_k = x  (every g),   sum_k lam_k * use_k(e) <= cap(e)

HiGHS solves the restricted LP; its duals price the links, and a caller's pricing function
turns prices into the most improving column of each group (a minimum-cost arborescence,
Chu–Liu/Edmonds, or spanning tree, Prim). Columns are added until none improves: the exact LP
optimum (Edmonds' branching theorem / Nash-Williams–Tutte make it equal the cut values). A
basic optimal solution has at most one nonzero column per link, so packings stay small.

Rates are GB/s; ``x`` is the rate at which *each* group delivers its data."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from .._native import compiled_helper
from ..errors import NoFeasiblePlan, PlanError
from ..topology.view import LinkIndex, relay_search

_MAX_ROUNDS = 400
VARIANTS = 3         # extra pricing passes per LP solve
_INF = float("inf")


@dataclass(frozen=True)
class Tree:
    """One packed tree: ``edges`` are ``(parent, child)`` GPU pairs, top-down.

    ``paths[i]`` holds the ``(link id, share)`` pairs edge ``i`` loads (for undirected trees: both
    directions); ``rate`` is the GB/s the packing gives it; ``staged`` the indices of edges whose
    path is the route staged through host memory that the packing was offered for their pair (for
    trees used both ways, :func:`pack_undirected_trees`: their downward transfer, and ``staged_up``
    those whose upward one is)."""

    group: object
    root: object
    edges: tuple
    paths: tuple
    rate: float
    staged: tuple = ()
    staged_up: tuple = ()

    def depth(self) -> int:
        """Hops from the root to the deepest node; a staged edge is two (up to host memory,
        then down), as a chunk's pipeline sees it."""
        return max(self.levels(staged_twice=True).values())

    def levels(self, staged_twice: bool = False) -> dict:
        """Node -> hops from the root (a staged edge two with ``staged_twice``)."""
        level = {self.root: 0}
        staged = set(self.staged) | set(self.staged_up) if staged_twice else ()
        for i, (p, c) in enumerate(self.edges):
            level[c] = level[p] + (2 if i in staged else 1)
        return level


@dataclass(frozen=True)
class Packing:
    """Result of a packing: ``rate`` per group (GB/s) and the trees with ``rate > 0``.

    ``columns`` holds every tree the column generation produced (rates 0 included): the
    candidates an integral rounding may pick from."""

    rate: float
    trees: tuple
    columns: tuple = ()

    @property
    def staged(self) -> bool:
        """Whether some tree moves an edge through host memory (``Tree.staged``, ``staged_up``)."""
        return any(t.staged or t.staged_up for t in self.trees)


def min_arborescence(W: np.ndarray, root: int) -> list[int] | None:
    """Parent of each node in a minimum-cost spanning arborescence rooted at ``root``.

    ``W[u, v]`` is the cost of arc ``u -> v`` (``inf`` = no arc). Returns ``None`` if some node
    is unreachable. Chu–Liu/Edmonds with contraction, O(n^3) for the small dense graphs here.

    >>> W = np.array([[np.inf, 1, 5], [np.inf, np.inf, 1], [np.inf, 1, np.inf]])
    >>> min_arborescence(W, 0)
    [-1, 0, 1]
    """
    # Pricing calls this thousands of times on matrices of 8 to 16 nodes: in C where
    # collectx._fastpath is built (native/python/cx_arborescence.c, ties broken as here).
    native = compiled_helper("min_arborescence")
    if native is not None:
        return native(np.ascontiguousarray(W, dtype=np.float64), int(root))
    return _arborescence(np.asarray(W, dtype=float).tolist(), root)


def _arborescence(W: list, root: int) -> list[int] | None:
    n = len(W)
    W = [row[:] for row in W]
    for i, row in enumerate(W):
        row[i] = row[root] = _INF
    parent = [-1] * n
    for v in range(n):
        if v != root:
            parent[v] = p = int(np.argmin([row[v] for row in W]))
            if W[p][v] == _INF:
                return None
    cycle = _find_cycle(parent, root)
    return parent if cycle is None else _contract_and_solve(W, root, parent, cycle)


def _find_cycle(parent: list[int], root: int) -> list[int] | None:
    color = [0] * len(parent)   # 0 new, 1 on current walk, 2 done
    for start in range(len(parent)):
        walk, v = [], start
        while v != -1 and v != root and color[v] == 0:
            color[v] = 1
            walk.append(v)
            v = parent[v]
        if v != -1 and v != root and color[v] == 1:
            return walk[walk.index(v):]
        for w in walk:
            color[w] = 2
    return None


def _contract_and_solve(W, root, parent, cycle):
    n = len(W)
    in_cycle = set(cycle)
    rest = [v for v in range(n) if v not in in_cycle]
    c = len(rest)                       # index of the contracted node
    pos = {v: i for i, v in enumerate(rest)}
    W2 = [[W[u][v] for v in rest] + [_INF] for u in rest] + [[_INF] * (c + 1)]
    enter, leave = {}, {}
    for u in rest:
        gains = [W[u][v] - W[parent[v]][v] for v in cycle]
        k = int(np.argmin(gains))
        W2[pos[u]][c], enter[pos[u]] = gains[k], cycle[k]
        outs = [W[v][u] for v in cycle]
        k = int(np.argmin(outs))
        W2[c][pos[u]], leave[pos[u]] = outs[k], cycle[k]
    sub = _arborescence(W2, pos[root])
    if sub is None:
        return None
    result = list(parent)
    for u in rest:
        p = sub[pos[u]]
        if p == -1:
            continue
        result[u] = leave[pos[u]] if p == c else rest[p]
    entry_from = sub[c]
    v_in = enter[entry_from]
    result[v_in] = rest[entry_from]
    return result


def min_spanning_tree(C: np.ndarray) -> list[tuple[int, int]] | None:
    """Edges ``(u, v)`` of a minimum spanning tree of the symmetric cost matrix ``C`` (Prim).

    >>> C = np.array([[0, 1, 4], [1, 0, 2], [4, 2, 0]], dtype=float)
    >>> min_spanning_tree(C)
    [(0, 1), (1, 2)]
    """
    n = len(C)
    best = C[0].astype(float).copy()
    link = [0] * n
    done = np.zeros(n, dtype=bool)
    done[0] = True
    best[0] = _INF
    edges = []
    for _ in range(n - 1):
        v = int(np.argmin(np.where(done, _INF, best)))
        if done[v] or best[v] == _INF:
            return None
        done[v] = True
        edges.append((link[v], v))
        closer = (~done) & (C[v] < best)
        best[closer] = C[v][closer]
        for u in np.flatnonzero(closer):
            link[u] = v
    return edges


def pack_undirected_trees(index: LinkIndex, gpus, either_way: bool = False, turns=None) -> Packing:
    """Pack spanning trees each used in both directions (reduce up, broadcast down), every tree
    edge over its cheapest relay path and the path's reverse (with ``either_way``, the cheapest
    path each way, which need not be reverses: a split PCIe switch climbs through its upward half
    and descends through its downward one, :mod:`collectx.topology.view`). The tree optimum of the
    allreduce bound (:mod:`.bounds`); each tree is rooted at its centre. ``turns``
    (:func:`~collectx.topology.view.turn_rule`) keeps linked GPU pairs from turning at the switches
    it names."""
    gpus, search = tuple(gpus), relay_search(index, tuple(gpus), turns)

    def price(y, exact):
        if either_way:
            one, way = search(y)
            path = {(u, t): p + way[t, u] for (u, t), p in way.items() if (t, u) in way}
            cost = {e: one[e] + one[e[1], e[0]] for e in path}
        else:
            y2 = [y[e] + y[r] if r >= 0 else _INF for e, r in enumerate(index.rev)]
            cost, path = search(y2)
            path = {e: p + tuple((index.rev[x], w) for x, w in reversed(p))
                    for e, p in path.items()}
        W = np.full((len(gpus), len(gpus)), _INF)
        for (u, t), c in cost.items():
            W[gpus.index(u), gpus.index(t)] = c
        C = np.minimum(W, W.T)
        und = min_spanning_tree(C)
        if und is None:
            raise NoFeasiblePlan(f"GPUs {gpus} are not connected both ways; no spanning tree")
        directed = [(u, v) if W[u, v] <= W[v, u] else (v, u) for u, v in und]
        root = centre(len(gpus), directed)
        edges = orient(gpus, directed, root)
        paths = tuple(path[e] if e in path else path[e[1], e[0]] for e in edges)
        return [(0, Tree(0, gpus[root], edges, paths, 0.0), usage(paths))]

    return column_generation(index.caps, (0,), price)


def top_down(gpus, parent, root) -> tuple:
    """The edges of the tree ``parent`` (an array; ``gpus`` names its nodes), top-down."""
    kids: dict = {}
    for v, p in enumerate(parent):
        if p >= 0:
            kids.setdefault(p, []).append(v)
    order, edges = [root], []
    for p in order:
        for c in kids.get(p, ()):
            edges.append((gpus[p], gpus[c]))
            order.append(c)
    return tuple(edges)


def centre(n, edges) -> int:
    """The node of least eccentricity of an ``n``-node tree given by ``edges``."""
    adj: dict = {i: [] for i in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)

    def ecc(s):
        seen, frontier, d = {s}, [s], 0
        while frontier:
            frontier = [w for x in frontier for w in adj[x] if w not in seen]
            seen.update(frontier)
            d += bool(frontier)
        return d
    return min(range(n), key=lambda s: (ecc(s), s))


def orient(gpus, und, root) -> tuple:
    """The undirected tree ``und`` (edges between ``gpus``' indices) as arcs away from
    ``root``, top-down (:func:`top_down`)."""
    parent = [-1] * len(gpus)
    adj: dict = {}
    for u, v in und:
        adj.setdefault(u, []).append(v)
        adj.setdefault(v, []).append(u)
    order = [root]
    seen = {root}
    for p in order:
        for c in adj.get(p, ()):
            if c not in seen:
                seen.add(c)
                parent[c] = p
                order.append(c)
    return top_down(gpus, parent, root)


def usage(paths) -> dict:
    """``{link: load}`` of paths of ``(link, share)`` pairs, summed."""
    use: dict = {}
    for p in paths:
        for link, w in p:
            use[link] = use.get(link, 0.0) + w
    return use


def column_generation(caps, groups: tuple, price, seed=(), cost=None) -> Packing:
    """The packing LP over the link capacities ``caps`` (GB/s per link id), solved over the columns
    ``price(y, exact)`` proposes until none improves.

    ``price`` returns ``[(group, Tree, {link id: uses})]``, the cheapest column of each group under
    link prices ``y``; ``exact`` is False while it may bias its choice among nearly equal columns
    (the loop then finishes with exact prices). ``cost(tree)``: among the packings at the
    optimal rate, the trees returned are those of least total ``cost`` (weighted by rate) over
    the columns found and the columns ``seed`` (of the same form)."""
    caps = np.asarray(caps, dtype=float)
    gid = {g: i for i, g in enumerate(groups)}
    cols: list = []
    lp = _Rows()
    seen: set = set()

    def take(columns):   # the new ones join the LP
        for c in columns:
            if _key(c) not in seen:
                seen.add(_key(c))
                cols.append(c)
                lp.add(gid[c[0]], c[2])
    y = 1.0 / caps                       # start from short, fat paths
    mu = None                            # no duals before the first solve: take every column
    exact = False
    for _ in range(_MAX_ROUNDS):
        fresh = [c for c in price(y, exact) if _key(c) not in seen and (mu is None or sum(
                 y[e] * k for e, k in c[2].items()) < mu[gid[c[0]]] * (1 - 1e-9) - 1e-12)]
        if not fresh:
            if exact:
                break
            exact = True          # biased pricing converged; finish at the exact optimum
            continue
        take(fresh + _variants(price, y, fresh, exact, seen))
        x, lam, y, mu = _solve(caps, len(gid), lp)
    else:
        raise PlanError(f"tree packing did not converge in {_MAX_ROUNDS} rounds on "
                        f"{len(caps)} links; report this topology")
    if not cols:
        raise PlanError(f"no tree over these routes spans the GPUs of every one of {len(gid)} "
                        f"groups; expected routes that connect them")
    if cost is not None:   # the seeds join last: the optimum over every column is x already
        take(seed)
        lam = _least_cost(caps, len(gid), lp, x, [cost(t) for _, t, _ in cols],
                          np.r_[lam, np.zeros(len(cols) - len(lam))])
    every = tuple(replace(t, rate=max(float(v), 0.0))
                  for (g, t, _), v in zip(cols, lam))
    trees = tuple(t for t in every if t.rate > 1e-9 * max(x, 1e-300))
    return Packing(rate=float(x), trees=trees, columns=every)


def _variants(price, y, fresh, exact, seen) -> list:
    """A few more candidate columns per LP solve (multiplicative weights on the new trees' links).

    Degenerate packings (full meshes, rings) otherwise need one LP solve per basic column."""
    y = np.array(y, dtype=float)
    scale = float(np.mean(y[y > 0])) if np.any(y > 0) else 1.0
    out = []
    batch = fresh
    for _ in range(VARIANTS):
        for _, _, use in batch:
            for e, k in use.items():
                y[e] = y[e] * 1.5 + 0.5 * scale * k
        batch = [c for c in price(y, exact) if _key(c) not in seen]
        out += batch
    return out


def _key(column) -> tuple:
    """What makes a column new: its group, arcs and routes."""
    return column[0], column[1].edges, column[1].paths


class _Rows:
    """The packing LP's coefficients, extended column by column as columns arrive.

    Column generation re-solves the LP after every batch; keeping the coordinate lists saves
    rebuilding them from every column's link usage each time (hundreds of columns on 16 GPUs)."""

    def __init__(self):
        self.rows, self.cix, self.vals = [], [], []   # A_ub: link uses per column
        self.group = []                               # A_eq: each column's group row

    def add(self, group: int, use: dict) -> None:
        j = len(self.group)
        self.group.append(group)
        for e, cnt in use.items():
            self.rows.append(e)
            self.cix.append(j)
            self.vals.append(cnt)


def _least_cost(caps, ng: int, lp: _Rows, rate: float, cost: list, lam):
    """Column rates of least ``cost`` that still give every group ``rate`` (less a hair for
    the solver's tolerance) within ``caps``; ``lam`` where that LP fails."""
    m, k = len(caps), len(lp.group)
    A_ub = sp.csr_matrix((lp.vals, (lp.rows, lp.cix)), shape=(m, k))
    A_eq = sp.csr_matrix(([1.0] * k, (lp.group, list(range(k)))), shape=(ng, k))
    res = linprog(np.asarray(cost, dtype=float), A_ub=A_ub, b_ub=caps, A_eq=A_eq,
                  b_eq=np.full(ng, rate * (1 - 1e-9)), bounds=(0, None), method="highs")
    return res.x if res.status == 0 else lam


def room_left(caps, columns: list, rate: float, most: float) -> np.ndarray | None:
    """Per link, the share of its capacity (at most ``most``) that a packing of ``columns``
    (``(group index, tree, {link id: uses})``) giving every group ``rate`` (less a hair for the
    solver) leaves unused, the most in all over the links they use; None where none can."""
    lp, m, k = _Rows(), len(caps), len(columns)
    for g, _, use in columns:
        lp.add(g, use)
    uses = sp.csr_matrix((lp.vals, (lp.rows, lp.cix)), shape=(m, k))
    used, ng = np.asarray(uses.sum(axis=1)).ravel() > 0, max(lp.group) + 1
    groups = sp.csr_matrix(([1.0] * k, (lp.group, list(range(k)))), shape=(ng, k))
    # the columns' rates, then each link's room as a share of its capacity
    res = linprog(-np.r_[np.zeros(k), used], A_ub=sp.hstack([uses, sp.diags(caps)]), b_ub=caps,
                  A_eq=sp.hstack([groups, sp.csr_matrix((ng, m))]),
                  b_eq=np.full(ng, rate * (1 - 1e-9)), bounds=[(0, None)] * k + [(0, most)] * m,
                  method="highs")
    return np.clip(res.x[k:], 0.0, most) * used if res.status == 0 else None


def _solve(caps, ng: int, lp: _Rows):
    m, k = len(caps), len(lp.group)
    A_ub = sp.csr_matrix((lp.vals, (lp.rows, lp.cix)), shape=(m, k + 1))
    # Each column in its group's row, and -x in every row: sum of a group's rates = x.
    A_eq = sp.csr_matrix(([1.0] * k + [-1.0] * ng, (lp.group + list(range(ng)),
                                                     list(range(k)) + [k] * ng)), shape=(ng, k + 1))
    c = np.zeros(k + 1)
    c[k] = -1.0
    res = linprog(c, A_ub=A_ub, b_ub=caps, A_eq=A_eq, b_eq=np.zeros(ng),
                  bounds=(0, None), method="highs")
    if res.status != 0:
        raise PlanError(f"packing LP failed: {res.message}")
    y = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
    mu = np.asarray(res.eqlin.marginals)
    return res.x[k], res.x[:k], y, mu
