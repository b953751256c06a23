"""Fractional packing of GPU trees into link capacities (LP with column generation).

How it works
------------
A *column* is one GPU tree: an out-arborescence from a root GPU (broadcast, allgather forests), or
an undirected spanning tree used both ways (Blink allreduce: reduce up, broadcast down). Each tree
edge is a relay path (see :mod:`collectx.topology.view`), so a column uses a multiset of
directed links. Columns are grouped (one group per root for ForestColl forests); the LP is

    maximize x   s.t.   sum_{k in group g} lam_k = x  (every g),   sum_k lam_k * use_k(e) <= cap(e)

HiGHS solves the restricted LP; its duals price the links, and the most improving column of each
group is a minimum-cost arborescence (Chu–Liu/Edmonds) or minimum spanning tree (Prim) over the
cheapest relay-path costs between GPUs. Columns are added until none improves, which is the exact
LP optimum (Edmonds' branching theorem / Nash-Williams–Tutte make it equal the cut values). A
basic optimal solution has at most one nonzero column per link, so packings stay small.

Rates are GB/s; ``x`` is the rate at which *each* group delivers its data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from ..errors import NoFeasiblePlan, PlanError
from ..topology.view import LinkIndex, relay_paths

_MAX_ROUNDS = 400
VARIANTS = 3         # extra pricing passes per LP solve
SHALLOW_BIAS = 0.05   # per hop from the root, as a fraction of a typical edge price
_INF = float("inf")


@dataclass(frozen=True)
class Tree:
    """One packed tree: ``edges`` are ``(parent, child)`` GPU pairs, top-down.

    ``paths[i]`` holds the ``(link id, share)`` pairs edge ``i`` loads (for undirected trees:
    both directions);
    ``rate`` is the GB/s the packing gives it; ``staged`` the indices of edges whose path is
    the route staged through host memory that the packing was offered for their pair (for
    trees used both ways, :func:`pack_undirected_trees`: their downward transfer, and
    ``staged_up`` those whose upward one is).
    """

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
        level = {self.root: 0}
        staged = set(self.staged) | set(self.staged_up)
        for i, (p, c) in enumerate(self.edges):
            level[c] = level[p] + (2 if i in staged else 1)
        return max(level.values())


@dataclass(frozen=True)
class Packing:
    """Result of a packing: ``rate`` per group (GB/s) and the trees with ``rate > 0``.

    ``columns`` holds every tree the column generation produced (rates 0 included): the
    candidates an integral rounding may pick from. ``balanced``: one tree per group, all at
    the same rate (:func:`pack_balanced_trees`).
    """

    rate: float
    trees: tuple
    rounds: int
    columns: tuple = ()
    balanced: bool = False

    @property
    def staged(self) -> bool:
        """Whether some tree moves an edge through host memory (``Tree.staged``,
        ``staged_up``)."""
        return any(t.staged or t.staged_up for t in self.trees)


def min_arborescence(W: np.ndarray, root: int) -> list[int] | None:
    """Parent of each node in a minimum-cost spanning arborescence rooted at ``root``.

    ``W[u, v]`` is the cost of arc ``u -> v`` (``inf`` = no arc). Returns ``None`` if some node
    is unreachable. Chu–Liu/Edmonds with contraction, O(n^3) for the small dense graphs here.

    >>> W = np.array([[np.inf, 1, 5], [np.inf, np.inf, 1], [np.inf, 1, np.inf]])
    >>> min_arborescence(W, 0)
    [-1, 0, 1]
    """
    # On Python lists: pricing calls this thousands of times on matrices of 8 to 16 nodes,
    # where numpy's per-call overhead was most of the planning time of 16-GPU forests. The
    # arithmetic and the tie-breaking (first minimum, first NaN) are numpy's argmin's.
    return _arborescence(np.asarray(W, dtype=float).tolist(), root)


def _arborescence(W: list, root: int) -> list[int] | None:
    n = len(W)
    W = [row[:] for row in W]
    for i, row in enumerate(W):
        row[i] = _INF
        row[root] = _INF
    parent = [-1] * n
    for v in range(n):
        if v != root:
            parent[v] = p = _argmin([row[v] for row in W])
            if W[p][v] == _INF:
                return None
    cycle = _find_cycle(parent, root)
    if cycle is None:
        return parent
    return _contract_and_solve(W, root, parent, cycle)


def _argmin(xs: list) -> int:
    """``numpy.argmin`` on a list: the first minimum, or the first NaN if there is one."""
    at, best = 0, xs[0]
    if best != best:
        return 0
    for i in range(1, len(xs)):
        x = xs[i]
        if x < best:
            at, best = i, x
        elif x != x:
            return i
    return at


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
        k = _argmin(gains)
        W2[pos[u]][c], enter[pos[u]] = gains[k], cycle[k]
        outs = [W[v][u] for v in cycle]
        k = _argmin(outs)
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


def pack_out_trees(index: LinkIndex, gpus, roots, routes: dict | None = None,
                   alternatives: dict | None = None, lean: bool = False) -> Packing:
    """Pack out-arborescences spanning ``gpus`` from every root in ``roots`` at a common rate.

    One root gives Blink's broadcast packing (rate = min over v of maxflow(root -> v)); all
    GPUs as roots give a ForestColl allgather forest (rate = the cut bound). ``routes`` fixes
    the links of each GPU pair (see :func:`collectx.topology.view.simulator_routes`); by default each tree
    edge takes the cheapest relay path. ``alternatives`` offers second routes for some pairs
    (see :func:`_edge_costs`). ``lean``: of the optimal packings over the trees found, the one
    that loads the links least (see :func:`_lean`).
    """
    gpus = tuple(gpus)
    at = {g: i for i, g in enumerate(gpus)}
    hops = _hop_matrix(index, gpus, routes)

    def price(y, exact):
        cost, path = _edge_costs(index, gpus, y, routes, alternatives)
        W = _cost_matrix(gpus, cost)
        # Until the exact rounds, charge a parent for its distance from the root: among
        # (nearly) equally good trees this picks shallow ones, whose pipelines fill sooner.
        bias = 0.0 if exact else SHALLOW_BIAS * float(np.median(W[np.isfinite(W)]))
        cols = []
        for r in roots:
            away = hops[at[r]] + (np.arange(len(gpus)) != at[r])   # relays, plus one per GPU
            parent = min_arborescence(W + bias * away[:, None], at[r])
            if parent is None:
                raise NoFeasiblePlan(f"{r} cannot reach every GPU of {gpus}; no tree exists")
            edges = _top_down(gpus, parent, at[r])
            paths = tuple(path[e] for e in edges)
            staged = _took_alternative(edges, path, alternatives)
            cols.append((r, Tree(r, r, edges, paths, 0.0, staged), _usage(paths)))
        return cols

    return _column_generation(index, tuple(roots), price, lean=lean)


def pack_undirected_trees(index: LinkIndex, gpus, routes: dict | None = None,
                          either_way: bool = False, alternatives: dict | None = None,
                          lean: bool = False) -> Packing:
    """Pack spanning trees each used in both directions (reduce up, broadcast down).

    The tree of each column is rooted at its centre to keep pipelines short. Without
    ``routes`` a tree edge takes a relay path and its reverse (with ``either_way``, the
    cheapest path each way, which need not be reverses: a split PCIe switch climbs through its
    upward half and descends through its downward one, :mod:`collectx.topology.view`); with ``routes``
    edge ``{u, t}`` uses ``routes[u, t]`` one way and ``routes[t, u]`` the other, or each way
    the cheaper of that and its ``alternatives`` route (see :func:`_edge_costs`).
    """
    gpus = tuple(gpus)

    def price(y, exact):
        if routes is None and either_way:
            one, way = relay_paths(index, gpus, y)
            path = {(u, t): p + way[t, u] for (u, t), p in way.items() if (t, u) in way}
            cost = {e: one[e] + one[e[1], e[0]] for e in path}
        elif routes is None:
            y2 = [y[e] + y[r] if r >= 0 else _INF for e, r in enumerate(index.rev)]
            cost, path = relay_paths(index, gpus, y2)
            path = {e: p + tuple((index.rev[x], w) for x, w in reversed(p))
                    for e, p in path.items()}
        else:
            cost, way = _edge_costs(index, gpus, y, routes, alternatives)
            path = {(u, t): p + way[t, u] for (u, t), p in way.items() if (t, u) in way}
            cost = {e: _cost(_usage([p]), y) for e, p in path.items()}
        C = np.minimum(W := _cost_matrix(gpus, cost), W.T)
        und = min_spanning_tree(C)
        if und is None:
            raise NoFeasiblePlan(f"GPUs {gpus} are not connected both ways; no spanning tree")
        directed = [(u, v) if W[u, v] <= W[v, u] else (v, u) for u, v in und]
        root = _centre(len(gpus), directed)
        edges = _orient(gpus, directed, root)
        paths = tuple(path[e] if e in path else path[e[1], e[0]] for e in edges)
        if not alternatives or routes is None:
            return [(0, Tree(0, gpus[root], edges, paths, 0.0), _usage(paths))]
        down = _took_alternative(edges, way, alternatives)
        up = _took_alternative([(c, p) for p, c in edges], way, alternatives)
        return [(0, Tree(0, gpus[root], edges, paths, 0.0, down, up), _usage(paths))]

    return _column_generation(index, (0,), price, lean=lean)


def _hop_matrix(index, gpus, routes) -> np.ndarray:
    """Links crossed from GPU ``i`` to GPU ``j`` (by ``routes``, else fewest relay hops)."""
    if routes is None:
        routes = relay_paths(index, gpus, [1.0] * len(index.links))[1]
    n = len(gpus)
    H = np.zeros((n, n))
    for i, u in enumerate(gpus):
        for j, t in enumerate(gpus):
            H[i, j] = sum(w for _, w in routes.get((u, t), ())) if i != j else 0.0
    return H


def _took_alternative(edges, path: dict, alternatives: dict | None) -> tuple:
    """Indices of ``edges`` whose chosen path is the one ``alternatives`` offered."""
    if not alternatives:
        return ()
    return tuple(i for i, e in enumerate(edges) if path[e] is alternatives.get(e))


def _edge_costs(index, gpus, y, routes, alternatives=None) -> tuple[dict, dict]:
    """Price of every tree edge under link prices ``y``, and the path it takes: its route, or
    where ``alternatives`` offers a second route for the pair (staged through host memory,
    :func:`collectx.topology.view.host_routes`), the cheaper of the two. Trees record the path each
    edge took, so different trees may move one pair's data by different routes."""
    if routes is None:
        return relay_paths(index, gpus, y)
    cost = {e: _cost(_usage([p]), y) + 1e-9 * len(p) for e, p in routes.items()}
    if not alternatives:
        return cost, routes
    path = dict(routes)
    for e, p in alternatives.items():
        c = _cost(_usage([p]), y) + 1e-9 * len(p)
        if c < cost.get(e, _INF):
            cost[e], path[e] = c, p
    return cost, path


def _cost_matrix(gpus, cost) -> np.ndarray:
    n = len(gpus)
    W = np.full((n, n), _INF)
    for i, u in enumerate(gpus):
        for j, t in enumerate(gpus):
            if (u, t) in cost:
                W[i, j] = cost[u, t]
    return W


def _top_down(gpus, parent, root) -> tuple:
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


def _centre(n, edges) -> int:
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


def _orient(gpus, und, root) -> tuple:
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
    return _top_down(gpus, parent, root)


def _usage(paths) -> dict:
    use: dict = {}
    for p in paths:
        for link, w in p:
            use[link] = use.get(link, 0.0) + w
    return use


def _column_generation(index: LinkIndex, groups: tuple, price, lean: bool = False) -> Packing:
    """Solve the packing LP over the columns ``price`` proposes until none improves."""
    caps = np.asarray(index.caps, dtype=float)
    gid = {g: i for i, g in enumerate(groups)}
    cols: list = []
    lp = _Rows()
    seen: set = set()
    y = 1.0 / caps                       # start from short, fat paths
    mu = None                            # no duals before the first solve: take every column
    exact = False
    for rounds in range(1, _MAX_ROUNDS + 1):
        fresh = [c for c in price(y, exact) if (c[0], c[1].edges, c[1].paths) not in seen
                 and (mu is None or _cost(c[2], y) < mu[gid[c[0]]] * (1 - 1e-9) - 1e-12)]
        if not fresh:
            if exact:
                break
            exact = True          # biased pricing converged; finish at the exact optimum
            continue
        for c in fresh + _variants(price, y, fresh, exact, seen):
            key = (c[0], c[1].edges, c[1].paths)
            if key not in seen:
                seen.add(key)
                cols.append(c)
                lp.add(gid[c[0]], c[2])
        x, lam, y, mu = _solve(caps, len(gid), lp)
    else:
        raise PlanError(f"tree packing did not converge in {_MAX_ROUNDS} rounds on "
                        f"{len(index.links)} links; report this topology")
    if lean:
        lam = _lean(caps, len(gid), lp, float(x), lam)
    every = tuple(replace(t, rate=max(float(v), 0.0))
                  for (g, t, _), v in zip(cols, lam))
    trees = tuple(t for t in every if t.rate > 1e-9 * max(x, 1e-300))
    return Packing(rate=float(x), trees=trees, rounds=rounds, columns=every)


def _lean(caps, ng: int, lp: "_Rows", x: float, lam):
    """Rates of the same columns that give every group rate ``x`` with the least total link
    load (each link's load relative to its capacity); ``lam`` if that LP fails.

    The packing LP is degenerate where PCIe routes through host memory join NVLink (DGX-1):
    many tree mixes reach the optimum, and the simulator's vertex may route data over host
    paths it does not need, whose transfers then share links with the ones that must take
    them. The least loaded mix keeps every link it need not fill idle (DGX-1V GPUs 0, 1, 3,
    4, 6, 7 allgather: 0.83 -> 0.96 of the bound)."""
    A_ub = _link_rows(caps, lp)
    cost = np.asarray(A_ub.multiply(1.0 / caps[:, None]).sum(axis=0)).ravel()
    return _cheapest_optimum(cost, A_ub, caps, ng, lp, x, lam)


def shallowest(packing: Packing, caps) -> Packing:
    """``packing`` with its columns' rates re-solved for the least rate-weighted tree depth at
    the same rate per group; ``packing`` itself where that LP fails or keeps the same mix.

    A chunk crosses a tree one level per chunk time, so a deep tree's links wait longer for
    their first chunk and idle longer after their last. The packing LP is degenerate, and its
    vertex picks among equally good trees blindly: on 16-GCD MI250, whose trees run 5 to 13
    levels deep, the shallowest optimum over the same columns lifts the allgather forest from
    0.93 to 0.95 of the bound.

    >>> from collectx.topology import line
    >>> from collectx.topology.view import job_graph, simulator_routes
    >>> gpus = ("GPU0", "GPU1", "GPU2")
    >>> G = job_graph(line(3, bw=100.0), gpus)
    >>> index = LinkIndex.of(G)
    >>> packing = pack_out_trees(index, gpus, gpus, routes=simulator_routes(G, index, gpus))
    >>> shallow = shallowest(packing, index.caps)
    >>> shallow.rate == packing.rate, max(t.depth() for t in shallow.trees)
    (True, 2)
    """
    cols = packing.columns or packing.trees
    gid: dict = {}
    lp = _Rows()
    for t in cols:
        lp.add(gid.setdefault(t.group, len(gid)), _usage(t.paths))
    caps = np.asarray(caps, dtype=float)
    x = float(packing.rate)
    depths = np.asarray([t.depth() for t in cols], dtype=float)
    lam = _cheapest_optimum(depths, _link_rows(caps, lp), caps, len(gid), lp, x, None)
    if lam is None:
        return packing
    trees = tuple(replace(t, rate=float(v)) for t, v in zip(cols, lam) if v > 1e-9 * x)
    return packing if _same_rates(trees, packing.trees, 1e-6 * x) else replace(packing,
                                                                              trees=trees)


def _same_rates(a, b, tol: float) -> bool:
    """Whether tree tuples ``a`` and ``b`` hold the same trees at rates within ``tol``."""
    rates = lambda ts: {(t.group, t.edges, t.paths): t.rate for t in ts}  # noqa: E731
    ra, rb = rates(a), rates(b)
    return ra.keys() == rb.keys() and all(abs(ra[k] - rb[k]) <= tol for k in ra)


def _link_rows(caps, lp: "_Rows"):
    return sp.csr_matrix((lp.vals, (lp.rows, lp.cix)), shape=(len(caps), len(lp.group)))


def _cheapest_optimum(cost, A_ub, caps, ng: int, lp: "_Rows", x: float, lam):
    """Column rates giving every group rate ``x`` within ``caps`` (link rows ``A_ub``, as
    :func:`_link_rows` builds them) at the least ``cost``; ``lam`` if that LP fails."""
    k = len(lp.group)
    A_eq = sp.csr_matrix(([1.0] * k, (lp.group, list(range(k)))), shape=(ng, k))
    res = linprog(cost, A_ub=A_ub, b_ub=caps, A_eq=A_eq, b_eq=np.full(ng, x),
                  bounds=(0, None), method="highs")
    return res.x if res.status == 0 else lam


def _variants(price, y, fresh, exact, seen) -> list:
    """A few more candidate columns per LP solve (multiplicative weights on the new trees' links).

    Degenerate packings (full meshes, rings) otherwise need one LP solve per basic column.
    """
    y = np.array(y, dtype=float)
    scale = float(np.mean(y[y > 0])) if np.any(y > 0) else 1.0
    out = []
    batch = fresh
    for _ in range(VARIANTS):
        for _, _, use in batch:
            for e, k in use.items():
                y[e] = y[e] * 1.5 + 0.5 * scale * k
        batch = [c for c in price(y, exact) if (c[0], c[1].edges, c[1].paths) not in seen]
        out += batch
    return out


def _cost(use: dict, y) -> float:
    return float(sum(y[e] * k for e, k in use.items()))


class _Rows:
    """The packing LP's coefficients, extended column by column as columns arrive.

    Column generation re-solves the LP after every batch; keeping the coordinate lists saves
    rebuilding them from every column's link usage each time (hundreds of columns on 16 GPUs).
    """

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


def _solve(caps, ng: int, lp: _Rows):
    m, k = len(caps), len(lp.group)
    A_ub = sp.csr_matrix((lp.vals, (lp.rows, lp.cix)), shape=(m, k + 1))
    # Each column in its group's row, and -x in every row: sum of a group's rates = x.
    A_eq = sp.csr_matrix(([1.0] * k + [-1.0] * ng, (lp.group + list(range(ng)),
                                                     list(range(k)) + [k] * ng)),
                         shape=(ng, k + 1))
    c = np.zeros(k + 1)
    c[k] = -1.0
    res = linprog(c, A_ub=A_ub, b_ub=caps, A_eq=A_eq, b_eq=np.zeros(ng),
                  bounds=(0, None), method="highs")
    if res.status != 0:
        raise PlanError(f"packing LP failed: {res.message}")
    y = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
    mu = np.asarray(res.eqlin.marginals)
    return res.x[k], res.x[:k], y, mu


def pack_relay_trees(index: LinkIndex, gpus, root, routes: dict) -> Packing | None:
    """Pack the ``N - 1`` two-level trees of ``root``: tree ``k`` is ``root -> k`` and
    ``k -> v`` for every other GPU ``v`` (scatter, then every GPU forwards its piece).

    On fabrics where every GPU reaches every other one at full rate (NVSwitch, full xGMI
    meshes) these trees alone reach the broadcast optimum, at equal rates. That matters beyond
    the LP value: the column generation returns some optimal vertex, typically a few trees of
    very different rates, and a link shared max-min fairly between the trees' transfers gives
    them equal rates, not the LP's; equal trees of depth 2 also fill their pipelines soonest.
    The trees get equal rates (the largest every link admits), so the rate is below the
    optimum where the fabric is uneven and the caller keeps its LP packing. Returns None when
    some GPU pair has no route.
    """
    gpus = tuple(gpus)
    cols = []
    for k in gpus:
        if k == root:
            continue
        edges = ((root, k),) + tuple((k, v) for v in gpus if v not in (root, k))
        if any(e not in routes for e in edges):
            return None
        paths = tuple(routes[e] for e in edges)
        cols.append((root, Tree(root, root, edges, paths, 0.0), _usage(paths)))
    if not cols:
        return None
    total: dict = {}
    for _, _, use in cols:
        for e, k in use.items():
            total[e] = total.get(e, 0.0) + k
    each = min(index.caps[e] / k for e, k in total.items() if k > 0)
    trees = tuple(Tree(t.group, t.root, t.edges, t.paths, each) for _, t, _ in cols)
    return Packing(rate=each * len(trees), trees=trees, rounds=1, columns=trees)


BALANCE_POWER = 8      # the search minimises sum of cap * (load / cap)^p: the max, but smooth
BALANCE_SWEEPS = 40    # hill-climbing passes over every (tree, node, new parent) move
DEPTH_WEIGHT = 3e-3    # per hop below the root, relative to one fully loaded link


def pack_balanced_trees(index: LinkIndex, gpus, roots, routes: dict,
                        start: Packing | None = None) -> Packing | None:
    """One out-tree per root, all at one rate: the largest every link admits.

    Why: the LP's optimum is typically a vertex with a few trees per root at very different
    rates, while the simulator (and the hardware) shares a link equally among the transfers
    crossing it, so unequal trees never get their planned rates and the run ends with a tail.
    With one tree per root and equal chunk counts, a link crossed by ``k`` tree edges carries
    ``k`` equal transfers: equal sharing *is* the planned sharing. On tree-shaped fabrics
    (PCIe switches under CPU sockets) such trees reach the cut bound, each GPU link carrying
    exactly the ``N - 1`` pieces it must; elsewhere they fall short and the caller keeps the
    LP packing.

    The trees are found by hill climbing over "re-parent node v in the tree of root r" moves,
    minimising a smooth stand-in for the busiest link's load over capacity (plus a small
    charge per hop of depth, for the pipeline fill), from shortest-route stars. Returns None
    when some GPU pair has no route.
    """
    gpus = tuple(gpus)
    n = len(gpus)
    at = {g: i for i, g in enumerate(gpus)}
    pairs = {}
    for a in gpus:
        for b in gpus:
            if a != b:
                if (a, b) not in routes:
                    return None
                pairs[at[a], at[b]] = routes[a, b]
    caps = np.asarray(index.caps, dtype=float)
    parent = {at[r]: _star(n, at[r]) for r in roots}
    if start is not None:
        for t in sorted(start.trees, key=lambda t: t.rate):   # each root's widest tree last
            par = [-1] * n
            for p, c in t.edges:
                par[at[c]] = at[p]
            parent[at[t.root]] = par
    load = np.zeros(len(caps))
    for r, par in parent.items():
        for v, p in enumerate(par):
            if p >= 0:
                _add_route(load, pairs[p, v], 1.0)
    for _ in range(BALANCE_SWEEPS):
        if not _improve(parent, load, caps, pairs, n):
            break
    limit = caps * float(np.max(load / caps)) * (1 + 1e-9)
    for _ in range(BALANCE_SWEEPS):
        if not _shallower(parent, load, limit, pairs, n):
            break
    each = float(min(caps[e] / k for e, k in enumerate(load) if k > 1e-12))
    trees = []
    for r in roots:
        edges = _top_down(gpus, parent[at[r]], at[r])
        paths = tuple(routes[e] for e in edges)
        trees.append(Tree(r, r, edges, paths, each))
    return Packing(rate=each, trees=tuple(trees), rounds=1, columns=tuple(trees), balanced=True)


def _star(n: int, root: int) -> list:
    return [-1 if v == root else root for v in range(n)]


def _add_route(load, route, k: float) -> None:
    for link, w in route:
        load[link] += k * w


def _penalty(load, caps, links, ref: float) -> float:
    u = load[links] / (caps[links] * ref)
    return float(np.sum(caps[links] * u ** BALANCE_POWER))


def _levels(par: list, root: int) -> list:
    level = [-1] * len(par)
    level[root] = 0
    changed = True
    while changed:
        changed = False
        for v, p in enumerate(par):
            if p >= 0 and level[v] < 0 and level[p] >= 0:
                level[v] = level[p] + 1
                changed = True
    return level


def _below(par: list, v: int) -> set:
    """``v`` and its descendants."""
    out = {v}
    grew = True
    while grew:
        grew = False
        for u, p in enumerate(par):
            if p in out and u not in out:
                out.add(u)
                grew = True
    return out


def _improve(parent: dict, load, caps, pairs: dict, n: int) -> bool:
    """One pass of first-improvement moves; whether any move was made."""
    ref = float(np.max(load / caps))   # the busiest link now weighs one capacity
    charge = DEPTH_WEIGHT * float(np.mean(caps))
    moved = False
    for r, par in parent.items():
        for v in range(n):
            if v == r:
                continue
            sub = _below(par, v)
            level = _levels(par, r)
            old = par[v]
            best, best_p = 0.0, None
            for p in range(n):
                if p in sub or p == old:
                    continue
                links = np.unique([e for e, _ in pairs[old, v]] + [e for e, _ in pairs[p, v]])
                before = _penalty(load, caps, links, ref)
                _add_route(load, pairs[old, v], -1.0)
                _add_route(load, pairs[p, v], 1.0)
                after = _penalty(load, caps, links, ref)
                _add_route(load, pairs[p, v], -1.0)
                _add_route(load, pairs[old, v], 1.0)
                gain = before - after + charge * (level[old] - level[p]) * len(sub)
                if gain > best + 1e-12 * charge:
                    best, best_p = gain, p
            if best_p is not None:
                _add_route(load, pairs[old, v], -1.0)
                _add_route(load, pairs[best_p, v], 1.0)
                par[v] = best_p
                moved = True
    return moved


def _shallower(parent: dict, load, limit, pairs: dict, n: int) -> bool:
    """One pass lifting nodes of each tree closer to its root without loading any link past
    ``limit``; whether any node moved. Shallow trees fill their pipelines sooner."""
    moved = False
    for r, par in parent.items():
        for v in sorted(range(n), key=lambda u: -_levels(par, r)[u]):   # deepest first
            level = _levels(par, r)
            sub = _below(par, v)
            old = par[v]
            for p in sorted(range(n), key=lambda u: level[u]):
                if p in sub or level[p] + 1 >= level[v]:
                    continue
                _add_route(load, pairs[old, v], -1.0)
                _add_route(load, pairs[p, v], 1.0)
                if np.all(load <= limit):
                    par[v] = p
                    moved = True
                    break
                _add_route(load, pairs[p, v], -1.0)
                _add_route(load, pairs[old, v], 1.0)
    return moved
