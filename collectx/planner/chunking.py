"""From fractional tree rates to whole chunks: how many chunks, and which trees get them.

How it works
------------
A packing LP gives each tree a real rate; a schedule gives each tree a whole number of the
``Q`` chunks of its group. Largest-remainder rounding of many small rates overloads some links
and leaves trees with one or two chunks (whose pipelines never fill). Instead a small integer
program picks the counts directly from every tree the column generation produced:

    minimize  z / z_lp + sum_k w * depth_k * used_k
    s.t.      sum_{k in g} n_k = Q            (every group)
              sum_k n_k * use_k(e) / cap(e) <= z  (every link)
              n_k <= Q * used_k,   n_k integer, used_k binary

``z`` is the busiest link's time, so ``z_lp / z`` is the rate kept; the second term prefers few,
shallow trees (each costs ``w`` per level of pipeline fill). HiGHS gets a node budget, not a time
limit (:data:`MIP_NODES`): a plan must not depend on how busy the machine is, since every rank of
a communicator plans the same collective on its own and all must get the same schedule. If the
budget finds no integer point, the largest-remainder rounding of the LP rates is used.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from fractions import Fraction

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds as LPBounds
from scipy.optimize import LinearConstraint, milp

TREE_PENALTY = 0.003     # rate fraction one extra tree level must buy to be worth it
MIP_NODES = 0           # presolve and root heuristics only: on dgx1v allocations, as good as
                        # a 0.1 s time limit (mean efficiency within 2e-4) and deterministic
KEEP = 0.98              # accept the smallest chunk count that keeps this fraction of the rate


def instruction_budget(n: int, at_8: int) -> int:
    """Instructions a tree schedule of ``n`` ranks may hold: ``at_8`` up to 8 ranks, then
    growing with ``n ** 3``. Instructions per chunk grow with ``n`` (tree edges) or ``n ** 2``
    (a forest's trees), and the trees' depth grows with ``n`` too, so keeping the pipeline
    fill (depth / chunks) of 8 ranks takes ``n`` times more chunks. On 16-GCD MI250, whose
    trees are ~10 levels deep, ``n ** 2`` left allgather 64 chunks per root (0.89 of the
    bound) and allreduce 512 chunks (0.82 of the reference); ``n ** 3`` gives 128 and 1024
    (0.93 and 0.87) and planning time stays within 2 s.

    >>> instruction_budget(8, 4096), instruction_budget(16, 4096)
    (4096, 32768)
    """
    return max(at_8, at_8 * n ** 3 // 512)


def split_chunks(first: int, count: int, rates) -> list[tuple]:
    """Cut chunks ``first .. first+count-1`` into consecutive runs proportional to ``rates``.

    Largest-remainder rounding, so every run differs from its exact share by less than one.

    >>> split_chunks(0, 10, [2.0, 1.0, 1.0])
    [(0, 1, 2, 3, 4), (5, 6, 7), (8, 9)]
    """
    total = float(sum(rates))
    exact = [count * r / total for r in rates]
    sizes = [int(x) for x in exact]
    order = sorted(range(len(rates)), key=lambda i: (sizes[i] - exact[i], i))
    for i in order[:count - sum(sizes)]:
        sizes[i] += 1
    runs, at = [], first
    for s in sizes:
        runs.append(tuple(range(at, at + s)))
        at += s
    return runs


def chunk_counts(packing, caps, candidates, passes: int = 1,
                 memo: dict | None = None, latency: float | None = None) -> tuple[int, list]:
    """Chunks per group ``Q`` and ``[(tree, n)]`` with ``n > 0``, grouped as the packing's trees.

    Screens the candidate counts in increasing order with the cheap largest-remainder rounding
    and takes the first that retains :data:`KEEP` of the packing's rate (else the largest),
    counting the pipeline fill of each tree (``passes`` = 2 when a tree reduces up and
    broadcasts down); only that count gets the integer program (a node-limited MIP), whose
    counts are kept when they do better. ``memo`` (one dict per packing) keeps the final
    counts by ``Q`` across calls.

    ``latency`` (the wait before each chunk of one tree edge, as a fraction of the time the
    packing needs for the whole payload) switches to the count with the best estimated time:
    each tree edge then pulls its chunks one after the other, so more chunks shorten the
    pipeline fill but add waits (see :func:`_timed`).
    """
    memo = {} if memo is None else memo
    order = sorted(candidates)
    q = order[-1]
    if latency is not None:
        q = max(order, key=lambda c: (_timed(largest_remainder(packing, c), caps, packing.rate,
                                             c, passes, latency), -c))
        order = []
    for c in order[:-1]:
        if _score(largest_remainder(packing, c), caps, packing.rate, c, passes) >= KEEP:
            q = c
            break
    if q not in memo:
        rough = largest_remainder(packing, q)
        fine = _solved(packing, caps, q)
        memo[q] = max((rough, fine), key=lambda n: _score(n, caps, packing.rate, q, passes))
    return q, memo[q]


def _score(counts, caps, rate, q, passes) -> float:
    return _kept(counts, caps, rate, q) / (1 + _fill(counts, passes))


def _timed(counts, caps, rate, q, passes, latency) -> float:
    """Rate fraction kept with the fill and one ``latency`` per chunk of the busiest tree:
    ``1 / ((1 + fill) / kept + max_k n_k * latency)``."""
    kept = _kept(counts, caps, rate, q)
    return 1.0 / ((1 + _fill(counts, passes)) / kept + max(n for _, n in counts) * latency)


def _fill(counts, passes) -> float:
    """Pipeline fill of the latest tree: a depth-``d`` tree with ``n`` chunks ends
    ``(passes * d - 1) / n`` of its run late."""
    return max((passes * t.depth() - 1) / n for t, n in counts)


def _kept(counts, caps, rate, q) -> float:
    """Fraction of ``rate`` the counts keep: the LP's busiest-link time over theirs."""
    load: dict = {}
    for tree, n in counts:
        for path in tree.paths:
            for link, w in path:
                load[link] = load.get(link, 0.0) + n * w / caps[link]
    z = max(load.values())
    return (q / rate) / z


_SOLVED: dict = {}
_SOLVED_LIMIT = 64


def _solved(packing, caps, q) -> list:
    """:func:`_solve_counts`, once per packing object, capacities and ``Q``.

    Forest allreduce hands the same packing to both phases on symmetric machines, and the MIP
    costs up to tens of milliseconds on 8-GPU packings, so a second solve would double that.
    """
    key = (id(packing), tuple(caps), q)
    hit = _SOLVED.get(key)
    if hit is not None and hit[0] is packing:   # the entry keeps its packing alive: ids stay unique
        return hit[1]
    if len(_SOLVED) >= _SOLVED_LIMIT:
        _SOLVED.clear()
    counts = _solve_counts(packing, caps, q)
    _SOLVED[key] = (packing, counts)
    return counts


def _solve_counts(packing, caps, q) -> list:
    """The integer program of the module doc for ``Q = q``, over the LP's own trees (a basic
    solution: at most one tree per link)."""
    loads = _CopyLoads.of(packing, caps, packing.trees)
    cols, k, m = loads.cols, len(loads.cols), len(caps)
    # variables: n_0..n_{k-1}, used_0..used_{k-1}, z
    cost = np.zeros(2 * k + 1)
    cost[k:2 * k] = loads.penalty
    cost[-1] = 1.0 / (q / packing.rate)   # 1 / z_lp
    per_link = np.zeros((m, k))
    per_link[loads.links] = loads.load.T
    link_rows = sp.hstack([sp.csr_matrix(per_link), sp.csr_matrix((m, k)), -np.ones((m, 1))])
    groups = sp.csr_matrix((np.ones(k), (loads.group, np.arange(k))),
                           shape=(loads.group.max() + 1, 2 * k + 1))
    eye = sp.identity(k, format="csr")
    link_used = sp.hstack([eye, -q * eye, sp.csr_matrix((k, 1))])
    rows = [LinearConstraint(link_rows.tocsr(), -np.inf, 0.0), LinearConstraint(groups, q, q),
            LinearConstraint(link_used.tocsr(), -np.inf, 0.0)]
    integrality = np.r_[np.ones(2 * k), 0]
    bounds = LPBounds(np.zeros(2 * k + 1), np.r_[np.full(k, q), np.ones(k), np.inf])
    res = milp(cost, constraints=rows, integrality=integrality, bounds=bounds,
               options={"node_limit": MIP_NODES, "presolve": True})
    if res.x is None:
        return largest_remainder(packing, q)
    n = np.rint(res.x[:k]).astype(int)
    return [(t, int(c)) for t, c in zip(cols, n) if c > 0]


def equal_units(packing, caps, k: int, loads: "_CopyLoads | None" = None,
                priced: bool = True):
    """``k`` trees of one equal rate per group, picked (some more than once) from every tree
    the column generation produced for ``packing`` (:attr:`~.treepack.Packing.columns`), each
    copy at ``1/k`` of the rate those copies keep (:func:`_copy_counts`; ``priced``: with
    its price per tree level). Returns a :class:`~.treepack.Packing`, or None when fewer than
    two copies are left.

    Why: links share their bandwidth equally among the transfers on them, so trees planned at
    unequal rates do not get them where they meet, and the run drifts from the LP's steady
    state; equal trees on lanes of their own get exactly their planned shares. The LP's mix of
    host-staged and NVLink trees on DGX-1V GPUs 0, 1, 3, 4, 6, 7 (11 trees at 1.6-21.8 GB/s)
    reaches 0.81 of the allreduce reference, five equal copies of four of them 0.94.

    >>> from collectx.topology import line
    >>> from collectx.topology.view import job_graph
    >>> from collectx.planner.treesched import pack_both_ways
    >>> gpus = ("GPU0", "GPU1", "GPU2")
    >>> packing, caps = pack_both_ways(job_graph(line(3, bw=100.0), gpus), gpus)
    >>> units = equal_units(packing, caps, 2)
    >>> units.rate, [t.rate for t in units.trees]
    (100.0, [50.0, 50.0])
    """
    from .treepack import Packing
    loads = loads or _CopyLoads.of(packing, caps)
    counts = _copy_counts(loads, k, priced)
    if sum(c for _, c in counts) < 2:
        return None
    rate = packing.rate * _kept(counts, caps, packing.rate, k)
    trees = tuple(replace(t, rate=rate / k) for t, c in counts for _ in range(c))
    return Packing(rate=rate, trees=trees, rounds=packing.rounds, columns=packing.columns)


class _CopyLoads:
    """What the integer program and :func:`_copy_counts` choose among: trees (by default the
    packing's columns, every tree the column generation produced, rate 0 included: an
    integral mix may want trees the LP's vertex left out), the load each puts on every link it
    uses per unit of rate (``w / cap``; ``links``: those link ids), their groups (numbered
    in name order), LP rates and depth penalties, and the packing's rate per group."""

    def __init__(self, cols, links, load, group, rate, penalty, lp_rate):
        self.cols, self.links, self.load, self.group, self.rate = cols, links, load, group, rate
        self.penalty, self.lp_rate = penalty, lp_rate

    @classmethod
    def of(cls, packing, caps, cols=None) -> "_CopyLoads":
        cols = list(cols if cols is not None else packing.columns or packing.trees)
        links = sorted({link for t in cols for path in t.paths for link, _ in path})
        at = {link: i for i, link in enumerate(links)}
        load = np.zeros((len(cols), len(links)))
        for j, t in enumerate(cols):
            for path in t.paths:
                for link, w in path:
                    load[j, at[link]] += w / caps[link]
        names = {g: i for i, g in enumerate(sorted({t.group for t in cols}, key=str))}
        return cls(cols, links, load, np.array([names[t.group] for t in cols]),
                   np.array([t.rate for t in cols]),
                   np.array([TREE_PENALTY * max(t.depth(), 1) for t in cols]), packing.rate)


def _copy_counts(loads: _CopyLoads, k: int, priced: bool = True) -> list:
    """``[(tree, copies)]``: ``k`` copies per group, chosen for the integer program's objective
    (module doc, ``Q = k``): the busiest link's load over the LP's, plus (``priced``) a small
    price per level of every tree used.

    Starts from the LP's rates rounded to ``k`` copies (largest remainder) and moves one copy
    at a time to another tree of its group while that lowers the objective, or keeps it and
    leaves fewer links as busy as the busiest. On the 87 DGX-1 allreduce packings then below
    0.95 of the reference, over ``k`` = 3..28, the node-limited program over the LP's own
    trees kept 0.954 of the LP's rate at the best ``k`` in the mean, this search over every
    column 0.975 without the price (never less for any packing and ``k``), in a fifth of the
    time (0.94 s against 4.99 s for all of them, one process).
    """
    n = np.zeros(len(loads.cols), dtype=int)
    members = [np.flatnonzero(loads.group == g) for g in np.unique(loads.group)]
    for mine in members:
        rates = np.maximum(loads.rate[mine], 0.0)
        exact = k * rates / rates.sum() if rates.sum() > 0 else np.full(len(mine), k / len(mine))
        n[mine] = np.floor(exact).astype(int)
        short = k - n[mine].sum()
        n[mine[np.argsort(n[mine] - exact, kind="stable")[:short]]] += 1
    weight = loads.lp_rate / k        # 1 / the LP's busiest-link load for k copies
    price = loads.penalty if priced else np.zeros(len(loads.cols))
    for _ in range(MOVES):
        if not _move_one(loads.load, members, price, n, weight):
            break
    return [(t, int(c)) for t, c in zip(loads.cols, n) if c > 0]


MOVES = 400   # local-search steps at most; a few dozen suffice for the DGX-1 packings


def _move_one(A, members, pen, n, weight: float) -> bool:
    """Move one copy (in place in ``n``) that lowers the objective of :func:`_copy_counts`
    (``pen``: each tree's price; ``members``: the column indices of each group), or keeps it
    and makes fewer links as busy as the busiest; False when no move does. Without a price
    only copies on a busiest link can do either."""
    load = n @ A
    top = load.max()
    hot = load >= top * (1 - 1e-9)
    best, pick, level = 0.0, None, []
    for mine in members:
        held = n[mine]
        donors = mine[(held > 0) & ((pen[mine] > 0) | (A[mine][:, hot].max(axis=1) > 0))]
        if not len(donors):
            continue
        after = load + A[mine][None, :, :] - A[donors][:, None, :]   # donor x receiver x link
        peak = after.max(axis=2)
        change = np.round(weight * (peak - top) + (pen[mine] * (held == 0))[None, :]
                          - (pen[donors] * (n[donors] == 1))[:, None], 9)
        change[donors[:, None] == mine[None, :]] = np.inf   # a copy moved onto its own tree
        i = int(change.argmin())
        if change.flat[i] < best:
            d, r = np.unravel_index(i, change.shape)
            best, pick = change.flat[i], (donors[d], mine[r])
        elif change.flat[i] == 0:
            level.append((mine, donors, after, peak, change == 0))
    if pick is None:   # no move lowers the objective: one that leaves fewer busiest links?
        fewest = int(hot.sum())
        for mine, donors, after, peak, even in level:
            ties = np.where(even, (after >= peak[:, :, None] * (1 - 1e-9)).sum(axis=2), fewest)
            i = int(ties.argmin())
            if ties.flat[i] < fewest:
                d, r = np.unravel_index(i, ties.shape)
                fewest, pick = int(ties.flat[i]), (donors[d], mine[r])
    if pick is None:
        return False
    n[pick[0]] -= 1
    n[pick[1]] += 1
    return True


def equal_unit_mixes(packing, caps, ks, priced=(True, False)) -> list:
    """``[(k, units)]``: :func:`equal_units` for each ``k`` of ``ks`` that has them, with and
    without the price per tree level (``priced``: which), each mix of trees once (``k = 10``
    may repeat ``k = 5``'s mix, with more pipeline fill). Neither search wins everywhere: over
    the 247 allocations of each DGX-1, the blink allreduce plans below 0.95 of the reference
    were 22 / 23 (DGX-1V / DGX-1P) with the price, 23 / 23 without and 21 / 21 with both
    (mixes of up to 28 trees, 7-rank mixes on 512 chunks).

    >>> from collectx.topology import line
    >>> from collectx.topology.view import job_graph
    >>> from collectx.planner.treesched import pack_both_ways
    >>> gpus = ("GPU0", "GPU1", "GPU2")
    >>> packing, caps = pack_both_ways(job_graph(line(3, bw=100.0), gpus), gpus)
    >>> [(k, len(units.trees)) for k, units in equal_unit_mixes(packing, caps, range(2, 5))]
    [(2, 2)]
    """
    seen, out = set(), []
    loads = _CopyLoads.of(packing, caps)
    for k, price in ((k, price) for k in ks for price in priced):
        units = equal_units(packing, caps, k, loads, price)
        if units is None:
            continue
        mix = frozenset((replace(t, rate=0.0), Fraction(m, k))   # copies of k differ in rate
                        for t, m in Counter(units.trees).items())
        if mix not in seen:
            seen.add(mix)
            out.append((k, units))
    return out


def most_kept(mixes) -> list:
    """``mixes`` (:func:`equal_unit_mixes`) by the rate they keep, the fewest trees first among
    equals: the order in which planners try them.

    >>> from types import SimpleNamespace as NS
    >>> [k for k, _ in most_kept([(4, NS(rate=1.0)), (6, NS(rate=2.0)), (3, NS(rate=2.0))])]
    [3, 6, 4]
    """
    return sorted(mixes, key=lambda m: (-m[1].rate, m[0]))


def whole_per_tree(units, k: int, at_least: int) -> tuple[int, list]:
    """``(q, counts)``: ``q`` chunks per group, ``at_least`` rounded up to a multiple of the
    ``k`` equal trees of ``units`` (so every tree carries the same number), and their counts
    (:func:`largest_remainder`)."""
    q = k * -(-at_least // k)
    return q, largest_remainder(units, q)


def largest_remainder(packing, q) -> list:
    """``[(tree, n)]`` with ``n > 0``: ``q`` chunks per group in proportion to the trees' rates
    (as :func:`split_chunks` cuts them); exact for equal trees (:func:`equal_units`)."""
    by_group: dict = {}
    for t in packing.trees:
        by_group.setdefault(t.group, []).append(t)
    out = []
    for trees in by_group.values():
        for t, run in zip(trees, split_chunks(0, q, [t.rate for t in trees])):
            if run:
                out.append((t, len(run)))
    return out


def runs_by_group(counts, first_of) -> dict:
    """Consecutive chunk runs per tree: ``{group: [(tree, run), ...]}``.

    ``first_of(group)`` is the first chunk index of that group's range.
    """
    out: dict = {}
    at: dict = {}
    for tree, n in counts:
        start = at.get(tree.group, first_of(tree.group))
        out.setdefault(tree.group, []).append((tree, tuple(range(start, start + n))))
        at[tree.group] = start + n
    return out
