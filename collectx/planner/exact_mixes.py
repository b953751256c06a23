"""Equal trees counted edge by edge by an integer program: spanning trees for Blink allreduce,
out-trees from the root for Blink broadcast.

Why
---
:func:`~.chunking.equal_units` picks ``k`` equal trees among the trees the column generation
produced. Where the LP adds host-staged edges in trees as light as 1/127 of its rate (DGX-1V
GPUs 0, 1, 3, 4, 5, 6, 7), no mix of up to 31 of those trees keeps more than 0.935 of the
LP's rate, though 16 other equal trees keep 0.997. Whether ``k`` equal trees exist depends
only on how many tree edges each GPU pair carries (Nash-Williams–Tutte): a multigraph of
``(n - 1) k`` edges splits into ``k`` spanning trees exactly when every partition of the GPUs
into ``p`` parts is crossed by at least ``k (p - 1)`` of its edges.

How it works
------------
The edge *kinds* are the GPU pairs with the routes the column generation gave them (a pair
may go over NVLink, or be staged through host memory one way or both). An integer program
counts the tree edges of each kind::

    minimize  z
    s.t.      sum_e y_e * use_e(l) / cap(l) <= z          (every link l)
              sum_{e crossing P} y_e >= k (|P| - 1)       (every partition P, Bell(n) - 1 rows)
              sum_e y_e = k (n - 1),   y_e integer >= 0

``z`` is the busiest link's load for one unit of rate per tree, so ``k / z`` is the rate the
``k`` trees keep. Tree counts ``k`` are tried where a tree's rate divides the smallest direct
link's (``k = floor(m R / unit)``), in turn, and the first that keeps :data:`KEEP` of the LP's
rate ``R`` is taken: few trees fill their pipelines sooner. The edges are then dealt into
``k`` spanning trees by Edmonds' matroid partition (shortest augmenting paths), and each tree
is rooted at its centre. Out-trees from a root take Edmonds' rows instead of the partitions
(every GPU set without the root entered by ``k`` tree edges), and Lovász's construction grows
them (:func:`~.integral_trees.disjoint_arborescences`).

Partitions are enumerated (876 at 7 GPUs), so this serves up to :data:`MOST_RANKS` GPUs, but
the program starts from the few that bind most often (every GPU apart, one GPU cut from the
rest) and adds the ones its solution falls short of, first for the linear relaxation, then
for the integers: DGX-1V GPUs 0, 1, 3, 4, 5, 6, 7 solve in 0.03 s instead of 0.15 s with every
row. A link whose kinds all load it alike carries a whole number of tree edges, so its bound
is rounded down to one; the relaxation then rules out most tree counts that miss
:data:`KEEP` before any branching. HiGHS gets a node budget, not a time limit, so every rank
plans the same.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from .integral_trees import disjoint_arborescences, sets_without
from .tree_split import partition_forests
from .treepack import Packing, Tree, _centre, _orient

KEEP = 0.97          # the smallest tree count that keeps this much of the LP's rate is taken
MOST_RANKS = 7       # partitions: 876 at 7 GPUs, 4139 at 8 (full DGX-1 allreduce is at 0.977)
MOST_ROOTED_RANKS = 8   # vertex sets without the root: 127 rows at 8 GPUs, 2047 at 12
MOST_TREES = 36      # as many lanes as the mixes of chunking.equal_unit_mixes may take
NODES = 200          # branch-and-bound nodes per tree count (deterministic, unlike a time limit)
GAP = 0.01           # stop once within this of the relaxation: its optimum keeps all the rate


def exact_equal_mixes(packing: Packing, caps, gpus, at_least: float = 0.0) -> list:
    """``[(k, units)]``: at most one packing of ``k`` equal spanning trees that keeps
    :data:`KEEP` of ``packing``'s rate (module doc) and ``at_least`` GB/s, or ``[]``.

    >>> from collectx.topology import line
    >>> from collectx.topology.view import job_graph
    >>> from collectx.planner.treesched import pack_both_ways
    >>> gpus = ("GPU0", "GPU1", "GPU2")
    >>> packing, caps = pack_both_ways(job_graph(line(3, bw=100.0), gpus), gpus)
    >>> [(k, units.rate, len(units.trees)) for k, units in exact_equal_mixes(packing, caps, gpus)]
    [(2, 100.0, 2)]
    """
    n = len(gpus)
    if not 2 <= n <= MOST_RANKS or not packing.columns or packing.rate <= 0:
        return []
    kinds = _edge_kinds(packing, caps, gpus, directed=False)
    return _search(packing, kinds, _Program(kinds, n, *_partition_rows(kinds, n)),
                   lambda counts, k: _deal(kinds, counts, k, gpus), at_least)


def exact_rooted_mix(packing: Packing, caps, gpus, root: int) -> list:
    """``[(k, units)]``: at most one packing of ``k`` equal out-trees from ``gpus[root]``
    that keeps :data:`KEEP` of ``packing``'s rate, or ``[]``: the program of the module doc
    with Edmonds' rows (every GPU set without the root entered by ``k`` tree edges, one row
    per set: 127 at 8 GPUs) in place of the partitions, the trees grown by
    :func:`~.integral_trees.disjoint_arborescences`.

    >>> from collectx.topology import line
    >>> from collectx.topology.view import job_graph
    >>> from collectx.planner.treesched import pack_rooted
    >>> gpus = ("GPU0", "GPU1", "GPU2")
    >>> packing, caps = pack_rooted(job_graph(line(3, bw=100.0), gpus), gpus, ["GPU1"], False)
    >>> [(k, units.rate, len(units.trees)) for k, units in exact_rooted_mix(packing, caps, gpus, 1)]
    [(2, 100.0, 2)]
    """
    n = len(gpus)
    if not 2 <= n <= MOST_ROOTED_RANKS or not packing.columns or packing.rate <= 0:
        return []
    kinds = [kind for kind in _edge_kinds(packing, caps, gpus, directed=True)
             if kind.b != root]
    group = packing.columns[0].group
    return _search(packing, kinds, _Program(kinds, n, *_entry_rows(kinds, n, root)),
                   lambda counts, k: _grow(kinds, counts, k, gpus, root, group))


def _search(packing: Packing, kinds: list, program: "_Program", build,
            at_least: float = 0.0) -> list:
    """The first tree count of :func:`tree_counts` whose program keeps :data:`KEEP`, as
    ``[(k, packing of build(counts, k))]``, or ``[]`` (also where that keeps less than
    ``at_least`` GB/s: the trees are not built)."""
    unit = min((cap for kind in kinds if kind.direct for cap in kind.caps), default=None)
    if unit is None:
        return []
    for k in tree_counts(packing.rate, unit):
        found = program.solve(k, packing.rate)
        if found is None:
            continue
        kept, counts = found
        rate = kept * packing.rate
        if rate < at_least:
            return []
        trees = build(counts, k)
        if trees is None:
            return []
        trees = tuple(replace(t, rate=rate / k) for t in trees)
        return [(k, Packing(rate=rate, trees=trees, rounds=packing.rounds,
                            columns=packing.columns))]
    return []


def tree_counts(rate: float, unit: float) -> list[int]:
    """Tree counts ``k = floor(m * rate / unit)``, ``m = 1, 2, ...``: ``k`` trees at about
    ``rate / k`` each fill a link of ``unit`` GB/s with ``m`` of them.

    >>> tree_counts(80.25, 25.0)[:6]
    [3, 6, 9, 12, 16, 19]
    """
    out = []
    for m in range(1, MOST_TREES + 1):
        k = int(m * rate / unit + 1e-9)
        if k > MOST_TREES:
            break
        if k >= 2 and k not in out:
            out.append(k)
    return out


class _Kind:
    """One way to carry a tree edge: GPU pair ``(a, b)`` (indices) over ``path`` (the
    ``(link, share)`` pairs it loads: both directions for trees used both ways), staged through
    host memory from ``a`` down to ``b`` (``down``) and / or back up (``up``); ``load`` maps
    link -> share / capacity; ``direct``: one link each way, not staged."""

    def __init__(self, a, b, path, down, up, load, caps, ways):
        self.a, self.b, self.path, self.down, self.up, self.load = a, b, path, down, up, load
        self.caps = caps
        self.direct = len(path) == ways and not (down or up)


def _edge_kinds(packing: Packing, caps, gpus, directed: bool) -> list[_Kind]:
    """Every distinct (pair, link load) among the edges of the packing's columns; the pairs
    are ordered where ``directed``."""
    at = {g: i for i, g in enumerate(gpus)}
    kinds: dict = {}
    for tree in packing.columns:
        for i, ((p, c), path) in enumerate(zip(tree.edges, tree.paths)):
            load: dict = {}
            for link, w in path:
                load[link] = load.get(link, 0.0) + w / caps[link]
            pair = (p, c) if directed else frozenset((p, c))
            key = (pair, tuple(sorted((l, round(v, 12)) for l, v in load.items())))
            if key not in kinds:
                kinds[key] = _Kind(at[p], at[c], path, i in tree.staged, i in tree.staged_up,
                                   load, [caps[link] for link, _ in path],
                                   1 if directed else 2)
    return list(kinds.values())


@lru_cache(maxsize=None)
def _partition_labels(n: int) -> np.ndarray:
    """Every partition of ``range(n)`` into two or more parts, one row of block labels each
    (restricted growth strings)."""
    rows, label = [], [0] * n

    def grow(i, blocks):
        if i == n:
            if blocks > 1:
                rows.append(tuple(label))
            return
        for b in range(blocks + 1):
            label[i] = b
            grow(i + 1, max(blocks, b + 1))

    grow(1, 1)
    return np.array(rows, dtype=np.int8)


def _partition_rows(kinds: list[_Kind], n: int) -> tuple:
    """Nash-Williams–Tutte: (partitions x kinds, 1 where the kind crosses; parts - 1 each;
    the rows to start from: every GPU apart, and each GPU cut from the rest)."""
    labels = _partition_labels(n)
    cross = np.zeros((len(labels), len(kinds)))
    for j, kind in enumerate(kinds):
        cross[:, j] = labels[:, kind.a] != labels[:, kind.b]
    parts = labels.max(axis=1).astype(float)
    alone = np.isin((labels == labels[:, :1]).sum(axis=1), (1, n - 1))
    return cross, parts, np.flatnonzero((parts == n - 1) | ((parts == 1) & alone))


def _entry_rows(kinds: list[_Kind], n: int, root: int) -> tuple:
    """Edmonds: (vertex sets without the root x kinds, 1 where the kind enters the set; 1
    each; the rows to start from: each GPU alone, and all but the root)."""
    inside = sets_without(n, root)
    enters = np.zeros((len(inside), len(kinds)))
    for j, kind in enumerate(kinds):
        enters[:, j] = inside[:, kind.b] & ~inside[:, kind.a]
    size = inside.sum(axis=1)
    return enters, np.ones(len(inside)), np.flatnonzero((size == 1) | (size == n - 1))


class _Program:
    """The integer program of the module doc over ``kinds``, built once for every ``k``:
    ``cuts`` (rows x kinds) must carry ``k * needs`` tree edges each; the search starts from
    the rows ``first``."""

    def __init__(self, kinds: list[_Kind], n: int, cuts, needs, first):
        links = sorted({link for kind in kinds for link in kind.load})
        at = {link: i for i, link in enumerate(links)}
        m = len(kinds)
        self.load = np.zeros((len(links), m + 1))
        for j, kind in enumerate(kinds):
            for link, v in kind.load.items():
                self.load[at[link], j] += v
        self.load[:, m] = -1.0
        self.step = np.array([_common(row[:m]) for row in self.load])
        self.cross = np.hstack([cuts, np.zeros((len(cuts), 1))])
        self.parts, self.first = needs, first
        self.n, self.m = n, m

    def solve(self, k: int, rate: float):
        """``(fraction of rate kept, counts)`` for ``k`` trees that keep at least :data:`KEEP`
        of ``rate``, or None (module doc: rounded link bounds, partition rows added as the
        relaxation's and then the integer solution's fall short of them)."""
        m, most = self.m, k / (KEEP * rate)
        whole = np.where(self.step > 0, np.floor(most / np.where(self.step > 0, self.step, 1.0)
                                                 + 1e-9) * self.step, most)
        total = np.ones((1, m + 1))
        total[0, m] = 0.0
        fixed = [LinearConstraint(self.load, -np.inf, 0.0),
                 LinearConstraint(np.hstack([self.load[:, :m], np.zeros((len(whole), 1))]),
                                  -np.inf, whole),
                 LinearConstraint(total, (self.n - 1) * k, (self.n - 1) * k)]
        cost = np.zeros(m + 1)
        cost[m] = 1.0
        upper = np.full(m + 1, np.inf)
        upper[m] = most
        active = self.first
        for integral in (np.zeros(m + 1), np.r_[np.ones(m), 0.0]):
            while True:
                rows = fixed + [LinearConstraint(self.cross[active], k * self.parts[active],
                                                 np.inf)]
                res = milp(cost, constraints=rows, integrality=integral,
                           bounds=Bounds(0.0, upper),
                           options={"node_limit": NODES, "mip_rel_gap": GAP, "disp": False})
                if res.x is None:
                    return None
                short = np.setdiff1d(np.flatnonzero(self.cross @ res.x < k * self.parts - 1e-6),
                                     active)
                if not len(short):
                    break
                active = np.union1d(active, short)
        counts = np.round(res.x[:m]).astype(int)
        z = float(np.max(self.load[:, :m] @ counts))
        return (k / (z * rate), counts) if z > 0 else None


def _common(row) -> float:
    """The one load every kind on a link puts on it, or 0 where they differ."""
    used = row[row > 0]
    return float(used[0]) if len(used) and np.allclose(used, used[0], rtol=1e-9) else 0.0


def _deal(kinds: list[_Kind], counts, k: int, gpus) -> list[Tree] | None:
    """The ``counts[j]`` edges of each kind dealt into ``k`` spanning trees, each rooted at
    its centre; None if they do not split (they always do where the program's rows hold)."""
    edges = [j for j, c in enumerate(counts) for _ in range(c)]
    ends = [(kinds[j].a, kinds[j].b) for j in edges]
    forests = partition_forests(ends, k)
    n = len(gpus)
    if forests is None or any(len(f) != n - 1 for f in forests):
        return None
    return [_centred(forest, [kinds[edges[e]] for e in sorted(forest)], gpus)
            for forest in forests]


def _centred(forest, kinds: list[_Kind], gpus) -> Tree:
    """The tree of one forest's edge kinds, oriented from its centre down; an edge that runs
    against its kind's pair swaps which way is staged."""
    und = [(kind.a, kind.b) for kind in kinds]
    root = _centre(len(gpus), und)
    edges = _orient(gpus, und, root)
    left = {}
    for kind in kinds:
        left.setdefault(frozenset((kind.a, kind.b)), []).append(kind)
    at = {g: i for i, g in enumerate(gpus)}
    paths, down, up = [], [], []
    for i, (p, c) in enumerate(edges):
        kind = left[frozenset((at[p], at[c]))].pop()
        same = kind.a == at[p]
        paths.append(kind.path)
        if kind.down if same else kind.up:
            down.append(i)
        if kind.up if same else kind.down:
            up.append(i)
    return Tree(0, gpus[root], edges, tuple(paths), 0.0, tuple(down), tuple(up))


def _grow(kinds: list[_Kind], counts, k: int, gpus, root: int, group) -> list[Tree] | None:
    """The ``counts[j]`` arcs of each kind grown into ``k`` out-trees from ``gpus[root]``;
    None if they do not split (they always do where the program's rows hold)."""
    n = len(gpus)
    mult = np.zeros((n, n), dtype=np.int64)
    pool: dict = {}
    for kind, c in zip(kinds, counts):
        mult[kind.a, kind.b] += c
        pool.setdefault((kind.a, kind.b), []).extend([kind] * int(c))
    grown = disjoint_arborescences(mult, root, k)
    if grown is None:
        return None
    trees = []
    for edges in grown:
        taken = [pool[arc].pop() for arc in edges]
        trees.append(Tree(group, gpus[root], tuple((gpus[p], gpus[c]) for p, c in edges),
                          tuple(kind.path for kind in taken), 0.0,
                          tuple(i for i, kind in enumerate(taken) if kind.down)))
    return trees
