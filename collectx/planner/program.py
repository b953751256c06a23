"""The packing program: equal-rate trees for every collective that moves data over trees.

A *group* is one root's data moving one way: down its out-trees (broadcast, allgather), up them
(reduce, reduce-scatter), or both (allreduce: one group over spanning trees used both ways, or
an up and a down group per GPU, pipelined chunk by chunk). A tree *arc* between two GPUs is
carried in one of a few *ways*, each loading a multiset of links: as the hardware routes a peer
copy (:func:`~collectx.topology.view.simulator_routes`), or staged through the sender's host
memory over PCIe (:func:`~collectx.topology.view.host_routes`). 1. **LP** (:func:`fractional`):
column generation packs every group's arborescences at one rate, its optimum bounding any mix
of such trees. 2. **Rounding** (:class:`Rounding`): an integer program counts ``K`` trees per
group, arc by arc and way by way, minimising the busiest link's load; Edmonds' rows make the
counts trees. 3. **Split** (:meth:`Rounding.trees`): Lovász's construction deals the counted
arcs into ``K`` arborescences. Which ``K``, and the lowering to chunks and lanes, is
:mod:`.trees`' choice; docs/planner.md ("The packing program") has the whole argument."""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array, csr_matrix, hstack as stacked, identity, vstack

from ..schedule.ir import GPU_LANES, MAX_LANES
from ..topology.flows import max_flow
from ..topology.routes import fingerprint
from ..topology.view import (LinkIndex, host_routes, host_uploads, job_graph, require_connected,
                             route_waits, simulator_routes)
from .._concurrent import concurrently
from ._build import remembered, weighted_shares
from .cost_tables import FILL, NOISE
from .integral_trees import disjoint_arborescences
from .treepack import (Packing, Tree, centre, column_generation, min_arborescence, orient,
                       room_left, top_down, usage)

DOWN, UP, BOTH = "down", "up", "both"
MODES = {"broadcast": DOWN, "allgather": DOWN, "reduce": UP, "reduce_scatter": UP,
         "allreduce": BOTH}
PER_ROOT = ("allgather", "reduce_scatter")
STAGED_ONLY = "only"   # ``host`` value: routes staged through host memory and no peer route

NODES = 5            # branch-and-bound nodes per integer program (one per tree count tried):
                     # a fixed budget, not a time limit, so that every rank plans the same
                     # trees. HiGHS finds its roundings at the root or the first nodes: 20 and
                     # 100 found no better ones; at the root alone some fall short of Edmonds'
                     # rows and cost a program more
# HiGHS proves a rounding within FILL of the best (no pipeline gets closer to its packing's
# rate); its feasibility jump took a third of the time and found no better roundings
MILP_OPTIONS = {"node_limit": NODES, "mip_rel_gap": FILL, "disp": False,
                "mip_heuristic_run_feasibility_jump": False}
warnings.filterwarnings("ignore", ".*mip_heuristic_run_feasibility_jump")   # scipy: passed on
# presolve takes a third of these LPs' time and proves nothing they do not (936 of the
# slowest 8-GPU plans' LPs: the same answers)
SHORT_OPTIONS = {"presolve": False}
BATCH = 4            # tree counts rounded at once (on threads): fixed, so all ranks agree
BUILT = 3            # tree counts built into trees: the depth their arcs allow misjudges some
ROOM = 0.05          # of a link kept free where the rate allows: fair shares let branches that
                     # run ahead take the rate's links unless others have room (docs/planner.md)
PROGRAM_ROWS = 256   # Edmonds rows written out up front (2^(n-1) - 1 per group): past a few
                     # hundred, every branch-and-bound node's LP pays for them all, and
                     # finding the few that bind (lazily, by max-flow) is faster


@dataclass(frozen=True)
class Way:
    """One way to carry a tree arc: the links it loads (``(link, share)``), whether its
    down / up transfer is staged through host memory, and the longest route latency a
    transfer over it waits before its first byte moves (us)."""

    load: tuple
    down: bool = False
    up: bool = False
    wait_us: float = 0.0


@dataclass(frozen=True)
class Problem:
    """What to pack: the GPUs, the groups as ``(root index, mode)``, the ways of every arc
    ``(a, b)`` (GPU indices) per mode, and the link capacities (GB/s) the loads index."""

    gpus: tuple
    groups: tuple
    ways: dict
    caps: tuple
    uploads: dict = None   # GPU index -> load of its copy into its host memory (staging)
    lanes: int = GPU_LANES   # per rank: MAX_LANES with host routes (CPU executor's, schedule.ir)

    def modes(self) -> dict:
        """Each group's mode, by group index (what lowering and the lane counts take)."""
        return {g: m for g, (_, m) in enumerate(self.groups)}

    def way(self, tree: Tree, i: int) -> Way:
        """The way edge ``i`` of ``tree`` (a tree of this problem) takes."""
        e = tree.edges[i]
        options = self.ways[self.groups[tree.group][1]][e]
        return options[way_index(options, tree.paths[i], i in tree.staged, i in tree.staged_up)]


def problem(G, gpus, collective: str, root: int = 0, host: bool | str = False,
            forest: bool = False) -> Problem:
    """The packing problem of ``collective`` on job graph ``G``: peer routes as the simulator
    takes them, plus routes staged through the sender's host memory with ``host`` (only those
    with :data:`STAGED_ONLY`, the layer beside a peer plan, :mod:`.layers`). ``forest``
    (allreduce): one up and one down group per GPU instead of one group used both ways.

    >>> from collectx.topology import ring
    >>> from collectx.topology.view import job_graph
    >>> gpus = ("GPU0", "GPU1", "GPU2", "GPU3")
    >>> p = problem(job_graph(ring(4), gpus), gpus, "allgather")
    >>> p.groups[:2], sorted(p.ways["down"])[:3], p.ways["down"][0, 1][0].load
    (((0, 'down'), (1, 'down')), [(0, 1), (0, 3), (1, 0)], ((0, 1.0),))
    """
    index = LinkIndex.of(G)
    peer = simulator_routes(G, index, gpus) if host != STAGED_ONLY else {}
    staged = host_routes(G, index, gpus) if host else {}
    n = len(gpus)
    modes = (UP, DOWN) if forest else (MODES[collective],)
    groups = (tuple((r, m) for m in modes for r in range(n)) if forest or collective in PER_ROOT
              else ((root, modes[0]),))
    waits = route_waits(G, gpus)
    uploads = host_uploads(G, index, gpus) if host else {}
    return Problem(tuple(gpus), groups, {m: _ways(gpus, peer, staged, waits, m) for m in modes},
                   index.caps, {i: uploads[g] for i, g in enumerate(gpus) if g in uploads},
                   MAX_LANES if host else GPU_LANES)


def solved(topo, gpus, collective: str, root: int = 0, host: bool = False,
           forest: bool = False) -> tuple[Problem, Packing]:
    """:func:`problem` on the job graph of ``gpus`` in ``topo``, and its LP (:func:`fractional`),
    solved once per routing content (:func:`~._build.remembered`): an allocation's bound and
    its plans ask for the same LP, and so does every size class the runtime plans."""
    def solve():
        G = job_graph(topo, gpus)
        require_connected(G, gpus)
        p = problem(G, tuple(gpus), collective, root=root, host=host, forest=forest)
        return p, fractional(p)
    return remembered(("solved", fingerprint(topo), tuple(gpus), collective, root, host,
                       forest), solve)


def roomy(topo, gpus, collective: str, root: int = 0, host: bool = False,
          forest: bool = False) -> tuple[Problem, Packing]:
    """:func:`solved` with each link's capacity less the most room (up to :data:`ROOM`) a packing
    at the LP's rate can leave it (:func:`~.treepack.room_left`), and the LP over those (a
    broadcast on a ring of three needs its root's links, not the one between the others):

    >>> from collectx.topology import ring
    >>> gpus = ("GPU0", "GPU1", "GPU2")
    >>> (p, lp), (q, lq) = solved(ring(3), gpus, "broadcast"), roomy(ring(3), gpus, "broadcast")
    >>> round(lp.rate, 6) == round(lq.rate, 6), sum(a > b for a, b in zip(p.caps, q.caps))
    (True, 2)
    """
    def solve():
        p, lp = solved(topo, gpus, collective, root=root, host=host, forest=forest)
        room = room_left(p.caps, [(t.group, t, use_of(p, t)) for t in lp.columns], lp.rate, ROOM)
        q = replace(p, caps=tuple(float(c * (1 - r)) for c, r in zip(p.caps, room))) \
            if room is not None and room.any() else None
        return (q, packed) if q and (packed := fractional(q)).rate >= lp.rate * (1 - 1e-6) \
            else (p, lp)
    return remembered(("roomy", fingerprint(topo), tuple(gpus), collective, root, host, forest),
                      solve)


def _ways(gpus, peer: dict, staged: dict, waits: dict, mode: str) -> dict:
    def one(a, b):   # (load, staged, wait) of each way a transfer from GPU a to GPU b takes
        pair = (gpus[a], gpus[b])
        return [(route[pair], s, waits[pair][s]) for route, s in ((peer, False), (staged, True))
                if pair in route]

    table = {}
    for a, b in itertools.permutations(range(len(gpus)), 2):
        if mode == DOWN:
            found = [Way(load, down=s, wait_us=w) for load, s, w in one(a, b)]
        elif mode == UP:
            found = [Way(load, up=s, wait_us=w) for load, s, w in one(b, a)]
        else:
            found = [Way(tuple(sorted(usage((ld, lu)).items())), down=sd, up=su,
                         wait_us=max(wd, wu))
                     for ld, sd, wd in one(a, b) for lu, su, wu in one(b, a)]
        if found:
            table[a, b] = tuple(found)
    return table


def way_index(options: tuple, load, down: bool, up: bool) -> int:
    """Which of ``options`` loads ``load`` with these staging flags."""
    for k, way in enumerate(options):
        if way.load == load and way.down == down and way.up == up:
            return k
    raise ValueError("a tree names a way its problem does not offer")


# -- 1. the LP ----------------------------------------------------------------------------------
def fractional(p: Problem) -> Packing:
    """The LP optimum over every group's arborescences (step 1); tree groups are indices into
    ``p.groups``, ``rate`` is each group's (GB/s)."""
    n, rows = len(p.gpus), {mode: _way_rows(ways, len(p.caps)) for mode, ways in p.ways.items()}

    def price(y, exact):
        cols = []
        for mode, ways in p.ways.items():
            W, best = np.full((n, n), np.inf), {}
            loads, hops, spans = rows[mode]
            costs = (loads @ y + hops).tolist()   # a way's price, the fewer links the cheaper
            for e, (lo, hi) in zip(ways, spans):
                best[e] = k = min(range(hi - lo), key=lambda i: costs[lo + i])
                W[e] = costs[lo + k]
            for g, (r, m) in enumerate(p.groups):
                parent = min_arborescence(W, r) if m == mode else None
                if parent is not None:
                    edges = top_down(tuple(range(n)), parent, r)
                    tree = tree_of(p, g, edges, [best[e] for e in edges])
                    cols.append((g, tree, use_of(p, tree)))
                if m == mode == DOWN:
                    cols += [(g, t, use_of(p, t)) for t in host_stars(p, g, best)]
        return cols

    seed = [(g, t, use_of(p, t)) for g in range(len(p.groups)) for staged in (False, True)
            if (t := _star(p, g, staged))]
    return column_generation(p.caps, tuple(range(len(p.groups))), price, seed, _levels_of)


def _levels_of(tree: Tree) -> float:
    """Its GPUs' levels summed (staged hops two): each level is a chunk time of fill."""
    return float(sum(tree.levels(staged_twice=True).values()))


def _star(p: Problem, g: int, staged: bool) -> Tree | None:
    """Group ``g``'s star, each arc over its way through the fewest links, staged through host
    memory or not (None where some arc has no such way): the shallowest trees, which pricing by
    link duals alone rarely proposes where every tree loads as many links (a full mesh)."""
    root, mode = p.groups[g]
    edges = [(root, v) for v in range(len(p.gpus)) if v != root]
    options = [[(len(w.load), k) for k, w in enumerate(p.ways[mode].get(e, ()))
                if (w.down or w.up) == staged] for e in edges]
    return tree_of(p, g, edges, [min(o)[1] for o in options]) if all(options) else None


def _way_rows(ways: dict, nlinks: int) -> tuple:
    """``(loads, hops, spans)``: each way of ``ways`` a sparse row of its loads in their order
    (its price sums as a loop over them would), 1e-9 per link, and each arc's span of rows."""
    every = [way.load for options in ways.values() for way in options]
    flat = np.array([pair for load in every for pair in load], dtype=float).reshape(-1, 2)
    ends = np.cumsum([0] + [len(load) for load in every])
    loads = csr_matrix((flat[:, 1], flat[:, 0].astype(np.int64), ends), (len(every), nlinks))
    cuts = np.cumsum([0] + [len(options) for options in ways.values()]).tolist()
    return loads, 1e-9 * np.diff(ends), list(zip(cuts, cuts[1:]))


def tree_of(p: Problem, g: int, edges, picks, rate: float = 0.0) -> Tree:
    """Group ``g``'s :class:`~.treepack.Tree` over GPU indices; ``picks[i]``: ``edges[i]``'s way."""
    root, mode = p.groups[g]
    ways = [p.ways[mode][e][k] for e, k in zip(edges, picks)]
    return Tree(g, root, tuple(edges), tuple(w.load for w in ways), rate,
                tuple(i for i, w in enumerate(ways) if w.down),
                tuple(i for i, w in enumerate(ways) if w.up))


def use_of(p: Problem, tree: Tree) -> dict:
    """``{link: load}`` of ``tree`` at unit rate: its edges' ways, but a GPU that stages the
    same chunk for several children copies it into its host memory once (the emitter shares
    that copy), so its upload counts once."""
    use = usage(tree.paths)
    for parent, extra in _staged_children(p, tree).items():
        for link, w in p.uploads.get(parent, ()):
            use[link] -= (extra - 1) * w
    return use


def shares_uploads(p: Problem, tree: Tree) -> bool:
    """Whether some GPU of ``tree`` stages one chunk for several of its children."""
    return any(k > 1 for k in _staged_children(p, tree).values())


def _staged_children(p: Problem, tree: Tree) -> dict:
    """``parent -> children staged down from it``, where one group moves data down alone
    (broadcast): a reduction's children stage different partial results, and with a group per
    root the rounding's box (:meth:`Rounding.solve_all`) cuts shared copies into fractions of
    trees that round to none, and misses the roundings without them."""
    return dict(Counter(tree.edges[i][0] for i in tree.staged)) if _shared_copies(
        p, tree.group) else {}


def _shared_copies(p: Problem, g: int) -> bool:
    return len(p.groups) == 1 and p.groups[g][1] == DOWN and bool(p.uploads)


def host_stars(p: Problem, g: int, best: dict) -> list:
    """Group ``g``'s trees that fan out through host memory: for each GPU ``v``, the root feeds
    ``v`` (its cheapest way, ``best``) and ``v`` stages every chunk once for all the others (or
    the root for all), where such copies count (:func:`_staged_children`): the arc-by-arc
    pricing never proposes them, as it charges a shared upload once per child."""
    root, mode = p.groups[g]
    n = len(p.gpus)
    stars = []
    if not _shared_copies(p, g):
        return stars
    for v in range(n):
        if v != root and (root, v) not in best:
            continue
        edges, picks = ([], []) if v == root else ([(root, v)], [best[root, v]])
        for w in range(n):
            if w in (root, v):
                continue
            staged = [k for k, way in enumerate(p.ways[mode].get((v, w), ())) if way.down]
            if not staged:
                break
            edges.append((v, w))
            picks.append(staged[0])
        else:
            stars.append(tree_of(p, g, tuple(edges), picks))
    return stars


# -- 2. rounding and 3. split -------------------------------------------------------------------
class Rounding:
    """The integer program of step 2 over the arc ways each group's LP columns use.

    Variables: a count per (group, arc, way); its uses past the first; a count per *whole* LP
    column (a tree whose GPU stages one chunk into its host memory for several children: that
    copy is shared, which arc counts cannot express); then the busiest link's load ``z`` (in
    link capacities, for trees of unit rate). Rows: links (load <= z), each group's arc total
    (``K (n - 1)``, a whole tree counting its ``n - 1``), Edmonds' rows (a whole tree enters
    every set once), and each count at most one more than its repeats. ``level_cost`` charges
    every arc for how far its tail is from the root, and every repeat of an arc as one level
    more (in the units of ``z``): shallow trees fill sooner; an arc many trees take chains them."""

    def __init__(self, p: Problem, lp: Packing, level_cost: float = 0.0):
        self.p, self.n = p, len(p.gpus)
        used = {(t.group, t.edges[i], p.way(t, i)) for t in lp.columns for i in range(len(t.edges))}
        self.cols = sorted({(g, e, p.ways[p.groups[g][1]][e].index(w)) for g, e, w in used})
        self.wholes = [t for t in lp.columns if shares_uploads(p, t)]
        C, H = len(self.cols), len(self.wholes)
        self.arcs = [np.array([(c, a, b) for c, (h, (a, b), _) in enumerate(self.cols) if h == g],
                              dtype=np.int64).reshape(-1, 3).T for g in range(len(p.groups))]
        uses = [dict(self._way(g, e, k).load) for g, e, k in self.cols]
        uses += [use_of(p, t) for t in self.wholes]
        links = sorted({link for use in uses for link in use})
        at = {link: i for i, link in enumerate(links)}
        arcs = np.zeros((len(links), C + H))
        for c, use in enumerate(uses):
            for link, w in use.items():
                arcs[at[link], c] += w / p.caps[link]
        # column blocks: arc counts x (C), repeats y (C), whole trees h (H), z (1)
        self.load = np.hstack([arcs[:, :C], np.zeros((len(links), C)), arcs[:, C:],
                               -np.ones((len(links), 1))])
        self.caps = np.array([p.caps[link] for link in links])
        self.weights = self.load * self.caps[:, None] * np.r_[np.ones(2 * C + H), 0.0]
        self.whole = np.all(np.abs(self.weights - np.round(self.weights)) < 1e-9, axis=1)
        self.total = np.zeros((len(p.groups), 2 * C + H + 1))
        self.total[[g for g, _, _ in self.cols], range(C)] = 1.0
        self.total[[t.group for t in self.wholes], range(2 * C, 2 * C + H)] = self.n - 1
        self.repeats = stacked([identity(C), -identity(C), csr_matrix((C, H + 1))], "csr")
        # as the solver's rows: converted once, not per program (a third of their setup)
        self.rows = {m: csr_array(getattr(self, m)) for m in ("load", "total", "weights")}
        self.col_at = {c: i for i, c in enumerate(self.cols)}
        self.lp_trees = [(t.group, t.rate / lp.rate, self._counts(t)) for t in lp.trees]
        self.scaled = sum((share * x for _, share, x in self.lp_trees), np.zeros(C + H))  # per tree
        tree_levels = [sum(t.levels()[a] for a, _ in t.edges) for t in self.wholes]
        self.cost = np.r_[level_cost * self._levels(), np.full(C, level_cost),
                          level_cost * np.array(tree_levels, dtype=float), 1.0]
        self.enumerated = len(p.groups) << (self.n - 1) <= PROGRAM_ROWS
        self.sets = self._first_sets()
        self._rows_for, self._rows = -1, None   # Edmonds' rows, built for that many sets
        self._shorts: list = []   # per-tree limits and box of counts found short (_short)
        self._fitted: list = []   # and of counts that fit, with the rows they fit
        self._short_rows: dict = {}   # their LPs' rows, per number of Edmonds rows

    def _counts(self, t: Tree) -> np.ndarray:
        """Tree ``t`` as counts: its whole column where it is one, else one per arc's way."""
        x, C = np.zeros(len(self.cols) + len(self.wholes), dtype=np.int64), len(self.cols)
        whole = [C + i for i, w in enumerate(self.wholes)
                 if (w.group, w.edges, w.paths) == (t.group, t.edges, t.paths)]
        ways = self.p.ways[self.p.groups[t.group][1]]
        for c in whole[:1] or [self.col_at[t.group, e, ways[e].index(self.p.way(t, i))]
                               for i, e in enumerate(t.edges)]:
            x[c] += 1
        return x

    def seeded(self, K: int) -> np.ndarray:
        """Counts of ``K`` trees per group drawn from the LP's own, each group's ``K`` dealt
        in proportion to their rates (largest remainders first): whole trees, so they split
        without a program, and what the programs for tree counts must beat."""
        x = np.zeros(len(self.cols) + len(self.wholes), dtype=np.int64)
        for g in range(len(self.p.groups)):
            mine = [(share, counts) for h, share, counts in self.lp_trees if h == g]
            for c, (_, counts) in zip(weighted_shares(K, [s for s, _ in mine]), mine):
                x += c * counts
        return x

    def _way(self, g, e, k) -> Way:
        return self.p.ways[self.p.groups[g][1]][e][k]

    def _levels(self) -> np.ndarray:
        """Each column's arc tail's distance (in arcs) from its group's root."""
        dist = {}
        for g, (r, _) in enumerate(self.p.groups):
            arcs = {e for h, e, _ in self.cols if h == g}
            level, frontier, depth = {r: 0}, {r}, 0
            while frontier:
                depth += 1
                frontier = {b for a, b in arcs if a in frontier and b not in level}
                level.update(dict.fromkeys(frontier, depth))
            dist[g] = level
        return np.array([dist[g].get(a, self.n) for g, (a, _), _ in self.cols], dtype=float)

    def _first_sets(self) -> list:
        """``(group, vertex set)`` rows to start from: every set while they number at most
        :data:`PROGRAM_ROWS`, else each GPU alone and all but the root."""
        out = []
        for g, (r, _) in enumerate(self.p.groups):
            others = [v for v in range(self.n) if v != r]
            if self.enumerated:
                out += [(g, frozenset(s)) for k in range(1, self.n)
                        for s in itertools.combinations(others, k)]
            else:
                out += [(g, frozenset([v])) for v in others] + [(g, frozenset(others))]
        return out

    def solve_all(self, asks: list) -> list:
        """Per ``(K, most)`` of ``asks``, on threads: counts of ``K`` trees per group (arc
        counts, then whole trees) whose busiest link carries at most ``most`` capacities, the
        least such load within the node budget, or None; with several groups each within one
        of the LP's own scaled to ``K``. Edmonds' rows found join those known, in order: where
        rows are still to find, the relaxations find most cheaply, and the rows of every count's
        serve every count's integer program (a 16-GPU forest's programs: 14 -> 9)."""
        out = dict.fromkeys(asks, True)
        for integral in ([False] if not self.enumerated else []) + [True]:
            live = [ask for ask in asks if out[ask] is not None]
            solved = concurrently([lambda K=K, most=most: self._solved(K, most, integral)
                                   for K, most in live])
            for ask, (x, found) in zip(live, solved):
                out[ask] = x
                self.sets += [row for row in found if row not in self.sets]
        return list(out.values())

    def _solved(self, K: int, most: float, integral: bool) -> tuple:
        """``(counts or None, Edmonds rows it found)``: one ask of :meth:`solve_all`, or its
        relaxation (counts not rounded)."""
        C, H = len(self.cols), len(self.wholes)
        low, high = ((np.floor(self.scaled * K + 1e-9), np.ceil(self.scaled * K - 1e-9))
                     if len(self.p.groups) > 1 else (np.zeros(C + H), np.full(C + H, K)))
        bounds = Bounds(np.r_[low[:C], np.zeros(C), low[C:], 0.0],
                        np.r_[high[:C], np.full(C, K), high[C:], most])
        if np.isfinite(most) and self._short(K, most, bounds, self.sets):
            return None, []
        sets, total = self.sets, K * (self.n - 1)
        whole = np.r_[np.ones(C), np.zeros(C), np.ones(H), 0.0] * integral
        while True:   # every round adds a row the counts fell short of: this ends
            rows = self._rows_of(sets, [(self.rows["load"], -np.inf, 0.0),
                                        (self.rows["total"], total, total),
                                        (None, K, np.inf), (self.repeats, -np.inf, 1.0)])
            res = milp(self.cost, constraints=rows, integrality=whole, bounds=bounds,
                       options=dict(MILP_OPTIONS))   # scipy pops from it
            if res.x is None:
                return None, sets[len(self.sets):]
            x = np.r_[res.x[:C], res.x[2 * C:2 * C + H]]
            short = [s for s in self._short_sets(x, K) if s not in sets]
            if not short:
                return np.round(x).astype(np.int64), sets[len(self.sets):]
            sets = sets + short

    def _short(self, K: int, most: float, bounds: Bounds, sets: list) -> bool:
        """Whether even fractional counts fall short once each link whose loads are whole
        transfers takes at most ``floor(most * capacity)`` (+1e-5, HiGHS's tolerance) of them
        (a Chvatal-Gomory cut): most counts fail so in one LP, where HiGHS's root cuts took
        ~18 ms each. Over the Edmonds' rows found so far (what fewer rows refuse is short)."""
        most_load = np.where(self.whole, np.floor(most * self.caps + 1e-5), most * self.caps)
        # Per tree (x / K) only these limits and the box differ between tree counts: limits no
        # looser within a box no wider than a count's found short are short too, and limits no
        # tighter than a count's that fit (over as many rows or more) fit too, without an LP.
        per_tree = np.r_[most_load, -bounds.lb, bounds.ub] / K
        if any(np.all(per_tree <= seen + 1e-12) for seen in list(self._shorts)):
            return True
        if any(rows >= len(sets) and np.all(per_tree >= seen - 1e-12)
               for seen, rows in list(self._fitted)):
            return False
        total = K * (self.n - 1)
        blocks = [(self.rows["weights"], -np.inf, most_load), (self.rows["total"], total, total),
                  (None, K, np.inf)]
        # only the limits differ from count to count, over the rows found so far (which grow)
        matrix = self._short_rows.get(len(sets))
        if matrix is None:
            matrix = self._short_rows[len(sets)] = self._stacked(sets, blocks)
        short = milp(np.zeros(len(self.cost)), bounds=bounds, options=dict(SHORT_OPTIONS),
                     constraints=self._rows_of(sets, blocks, matrix)).status == 2
        if short:
            self._shorts.append(per_tree)
        else:
            self._fitted.append((per_tree, len(sets)))
        return short

    def _rows_of(self, sets: list, blocks: list, matrix=None) -> LinearConstraint:
        """``blocks`` of rows (``(matrix, lower, upper)``, the matrix None for Edmonds' rows
        over ``sets``) as one sparse constraint: scipy checks a list or a dense block where
        every warning on every thread is an error (:data:`MILP_OPTIONS`' warns). ``matrix``:
        the blocks already stacked (:meth:`_stacked`)."""
        heights = [len(sets) if m is None else m.shape[0] for m, _, _ in blocks]
        lower, upper = (np.concatenate([np.broadcast_to(np.asarray(b[i], dtype=float), (h,))
                                        for b, h in zip(blocks, heights)]) for i in (1, 2))
        return LinearConstraint(self._stacked(sets, blocks) if matrix is None else matrix,
                                lower, upper)

    def _stacked(self, sets: list, blocks: list):
        """The matrices of ``blocks`` (:meth:`_rows_of`) stacked, as the solver takes them."""
        mats = [self._entering(sets) if m is None else m for m, _, _ in blocks]
        return vstack([csr_array(m) for m in mats], format="csr").tocsc()   # CSR: without COO

    def _entering(self, sets: list) -> csr_matrix:
        """Edmonds' rows: per (group, set) of ``sets``, the columns whose arcs enter it (a
        whole tree once). Every solve's sets start with ``self.sets``: their rows are
        remembered, and only those found since are built."""
        if self._rows_for != len(self.sets):
            self._rows, self._rows_for = self._entering_rows(self.sets), len(self.sets)
        known = self._rows_for
        return self._rows if len(sets) == known else \
            vstack([self._rows, self._entering_rows(sets[known:])], format="csr")

    def _entering_rows(self, sets: list) -> csr_matrix:
        C, H = len(self.cols), len(self.wholes)
        member = np.zeros((len(sets), self.n), dtype=bool)
        for i, (_, inside) in enumerate(sets):
            member[i, list(inside)] = True
        owner = np.array([g for g, _ in sets])
        group, tails, heads = (np.array(v) for v in
                               zip(*[(g, a, b) for g, (a, b), _ in self.cols]))
        A = (owner[:, None] == group[None, :]) & member[:, heads] & ~member[:, tails]
        W = owner[:, None] == np.array([t.group for t in self.wholes], dtype=int)[None, :]
        return stacked([csr_matrix(A, dtype=float), csr_matrix((len(sets), C)),
                        csr_matrix(W.reshape(len(sets), H), dtype=float),
                        csr_matrix((len(sets), 1))], "csr")

    def _short_sets(self, x, K: int) -> list:
        """``(group, set)`` pairs entered fewer than ``K`` times by the counts ``x``: the sink
        sides of the minimum cuts of the max-flows that fall short."""
        found = []
        for g, (r, _) in enumerate(self.p.groups):
            mult = self.multiplicity(x, g)
            need = K - self.whole_count(x, g) - 1e-6
            for v in range(self.n):
                if v != r and need > 0:
                    flow, reached = max_flow(mult, r, v, need)
                    if flow < need:
                        found.append((g, frozenset(range(self.n)) - reached))
        return list(dict.fromkeys(found))

    def whole_count(self, x, g: int) -> int:
        """Group ``g``'s whole trees in the counts ``x``."""
        C = len(self.cols)
        return sum(int(round(x[C + i])) for i, t in enumerate(self.wholes) if t.group == g)

    def multiplicity(self, x, g: int) -> np.ndarray:
        """Group ``g``'s arc counts as an ``n x n`` matrix (whole trees apart)."""
        x = np.asarray(x)
        mult = np.zeros((self.n, self.n), dtype=x.dtype)
        c, tails, heads = self.arcs[g]   # np.add.at adds in this order, as a loop would
        np.add.at(mult, (tails, heads), x[c])
        return mult

    def depth(self, x) -> int:
        """The farthest any GPU lies from its group's root over the counted arcs (a staged
        arc counts two, as :meth:`~.treepack.Tree.depth` counts it): the least depth of the
        deepest tree the counts split into, or of the whole trees counted."""
        C = len(self.cols)
        deepest = max((t.depth() for i, t in enumerate(self.wholes) if x[C + i]), default=0)
        for g, (r, _) in enumerate(self.p.groups):
            arcs = {}
            for c, (h, (a, b), k) in enumerate(self.cols):
                if h == g and x[c]:
                    way = self._way(g, (a, b), k)
                    hop = 2 if way.down or way.up else 1
                    arcs[a, b] = min(arcs.get((a, b), hop), hop)
            dist = {r: 0}
            for _ in range(self.n):   # Bellman-Ford: few nodes, unit and double hops
                for (a, b), hop in arcs.items():
                    if a in dist and dist[a] + hop < dist.get(b, np.inf):
                        dist[b] = dist[a] + hop
            if arcs:
                deepest = max(deepest, max(dist.values()))
        return deepest

    def least_depth(self) -> int:
        """The least :meth:`depth` of any counts: all arcs counted, or the shallowest whole tree."""
        C, H = len(self.cols), len(self.wholes)
        arcs = self.depth(np.r_[np.ones(C), np.zeros(H)]) if C else np.inf
        return min([arcs] + [t.depth() for t in self.wholes])

    def star_rate(self) -> float:
        """At least the most rate per group trees one level deep carry: a group's only such tree
        is its root's star over unstaged ways, each arc loading a link at least as its lightest
        way does, so counts at a higher rate have a deeper tree."""
        if any(t.depth() < 2 for t in self.wholes):
            return np.inf
        least = {}
        for c, (g, (a, b), k) in enumerate(self.cols):
            if a == self.p.groups[g][0] and not (w := self._way(g, (a, b), k)).down and not w.up:
                least[g, b] = np.minimum(least.get((g, b), np.inf), self.load[:, c])
        if len(least) < len(self.p.groups) * (self.n - 1):
            return 0.0
        return 1.0 / max(np.max(sum(least.values())), 1e-300)

    def rate(self, x, K: int) -> float:
        """The rate per group (GB/s) of counts ``x``: ``K`` trees, their busiest link full."""
        C, H = len(self.cols), len(self.wholes)
        load = self.load[:, :C] @ x[:C] + self.load[:, 2 * C:2 * C + H] @ x[C:]
        return K / float(np.max(load))

    def trees(self, x, K: int) -> tuple | None:
        """Every group's ``K`` arborescences (step 3), at ``rate / K`` each: its whole trees,
        and its arc counts split into the rest; None if some group's counts do not split
        (they always do once Edmonds' rows hold)."""
        each = self.rate(x, K) / K
        C = len(self.cols)
        out = []
        for g, (r, _) in enumerate(self.p.groups):
            out += [replace(t, rate=each) for i, t in enumerate(self.wholes)
                    if t.group == g for _ in range(int(x[C + i]))]
            rest = K - self.whole_count(x, g)
            if not rest:
                continue
            pool: dict = {}
            for c, (h, e, k) in enumerate(self.cols):
                if h == g:
                    pool.setdefault(e, []).extend([k] * int(x[c]))
            grown = disjoint_arborescences(self.multiplicity(x, g), r, rest)
            if grown is None:
                return None
            out += [tree_of(self.p, g, tuple(edges), [pool[e].pop() for e in edges], each)
                    for edges in grown]
        return tuple(out)


def lifted(p: Problem, trees: tuple) -> tuple:
    """``trees`` with GPUs moved closer to their roots wherever the arc that moves them fits
    in what the busiest link leaves every link (its utilisation times the link's capacity):
    the rate stays, the pipelines shorten (each level cut is a chunk time less to wait).

    The rounding counts arcs, not levels: on a one-hop fabric a chain carries a broadcast as
    fast as a shallow tree. Deepest GPUs first, each to the shallowest parent that fits, a move
    per tree in turn, until none moves; a tree that found none waits until another's move frees
    a link that stopped it. Trees that share a staged copy (:func:`use_of`) stay."""
    caps = np.asarray(p.caps, dtype=float)
    load = np.zeros(len(caps))
    for t in trees:
        for link, w in use_of(p, t).items():
            load[link] += w * t.rate
    limit = caps * float(np.max(load / caps)) * (1 + 1e-9)
    out = [t if shares_uploads(p, t) else _Growing(p, t) for t in trees]
    growing = [t for t in out if isinstance(t, _Growing)]
    moved = True
    while moved:   # every move shortens a path to the root: this ends
        moved = False
        for tree in growing:
            if tree.blocked is not None:
                continue
            freed = tree.lift(load, limit)
            moved = moved or freed is not None
            for other in growing if freed else ():
                if other.blocked and other.blocked & freed:
                    other.blocked = None
    return tuple(t.frozen() if isinstance(t, _Growing) else t for t in out)


class _Growing:
    """A tree being shortened: parents, the way of each GPU's arc, and its depth levels;
    ``blocked``: once a search found no move, the links that stopped each try (else None)."""

    def __init__(self, p: Problem, tree: Tree):
        self.p, self.tree = p, tree
        self.options = p.ways[p.groups[tree.group][1]]
        self.parent = {c: a for a, c in tree.edges}
        self.way = {c: p.way(tree, i) for i, (_, c) in enumerate(tree.edges)}
        self.blocked: set | None = None

    def levels(self) -> dict:
        level = {self.tree.root: 0}
        while len(level) < len(self.parent) + 1:
            for c, a in self.parent.items():
                if a in level and c not in level:
                    level[c] = level[a] + (2 if self.way[c].down or self.way[c].up else 1)
        return level

    def below(self, v) -> set:
        out = {v}
        while grown := {c for c, a in self.parent.items() if a in out and c not in out}:
            out |= grown
        return out

    def lift(self, load, limit) -> set | None:
        """Move one GPU (the deepest that can) to a shallower parent: the links its old way
        leaves lighter, or None where none moved (:attr:`blocked` then says what stopped it)."""
        level = self.levels()
        shallow_first = sorted(level, key=level.get)
        blocked = set()
        for v in sorted(self.parent, key=lambda c: -level[c]):
            banned, old = self.below(v), dict(self.way[v].load)
            for u in shallow_first:
                if u in banned or level[u] + 1 >= level[v]:
                    continue
                for way in self.options.get((u, v), ()):
                    hop = 2 if way.down or way.up else 1
                    if level[u] + hop >= level[v]:
                        continue
                    over = self._over(way, old, load, limit)
                    if over is None:
                        return self._moved(v, u, way, load)
                    blocked.add(over)
        self.blocked = blocked
        return None

    def _over(self, way: Way, old: dict, load, limit):
        """The first link of ``way`` that would exceed ``limit`` with an arc moved onto it from
        its ``old`` way (that load taken off first), or None if it fits."""
        rate = self.tree.rate
        for link, w in way.load:
            base = load[link] - old[link] * rate if link in old else load[link]
            if base + w * rate > limit[link]:
                return link
        return None

    def _moved(self, v, u, way: Way, load) -> set:
        rate, old = self.tree.rate, self.way[v]
        for link, w in old.load:
            load[link] -= w * rate
        for link, w in way.load:
            load[link] += w * rate
        self.parent[v], self.way[v] = u, way
        return {link for link, _ in old.load}

    def frozen(self) -> Tree:
        parent = [self.parent.get(v, -1) for v in range(len(self.p.gpus))]
        edges = top_down(tuple(range(len(parent))), parent, self.tree.root)
        picks = [self.options[e].index(self.way[e[1]]) for e in edges]
        return tree_of(self.p, self.tree.group, edges, picks, self.tree.rate)


def lanes_per_turn(trees, modes: dict) -> int:
    """The most lanes a rank takes per buffer turn of ``trees`` (the keys of
    :class:`~collectx.schedule.treesched.TreeEmitter`): down, one per edge it pulls over and one per tree it stages a chunk up in (shared
    by its staged children); up, one per tree it reduces in and one at each end of an edge
    staged up. Its own slot (broadcast, allgather) takes one more, once."""
    need: Counter = Counter()
    for t in trees:
        mode = modes[t.group]
        if mode in (DOWN, BOTH):
            need.update(b for _, b in t.edges)
            need.update({t.edges[i][0] for i in t.staged})
        if mode in (UP, BOTH):
            need.update({a for a, _ in t.edges})
            need.update(v for i in t.staged_up for v in t.edges[i])
    return max(need.values(), default=0)


def fits_twice(trees, modes: dict, lanes: int) -> bool:
    """Whether twice any rank's lanes for ``trees`` (lanes_per_turn), plus one, fit ``lanes``."""
    return 2 * lanes_per_turn(trees, modes) + 1 <= lanes


def most_trees(p: Problem) -> int:
    """Trees per group the plan's lanes hold: a rank gives every tree it does not root a
    lane (two for trees used both ways, one up and one down)."""
    return max(1, p.lanes // ((2 if BOTH in p.ways else 1) * len(p.groups)))


def equal_trees(p: Problem, lp: Packing, cost, level_cost: float = 0.0,
                keep: int = 1, beat: float | None = None, dealt: bool = True) -> list:
    """Steps 2-3: ``K`` equal trees per group for the ``keep`` counts ``K`` whose predicted times
    are least, best first; the LP's own trees where no rounding exists. ``cost``: a
    :class:`~.trees.Pipeline`. How well a count rounds the LP depends on how its rates divide
    (full DGX-1V allreduce: 14 trees keep 0.97 of the LP, 16 keep 0.89, 18 keep 0.998), so every
    count the lanes hold is tried, judged by the depth its arcs allow; the :data:`BUILT` best by
    each end of the model are built into trees (and shortened), judged by their own depth.
    ``beat``: a time another plan reaches, less the :data:`~.cost_tables.FILL` pipelines lose at
    least; counts that cannot beat it are not rounded, unless none can by the model. Without
    ``dealt``, every count is the program's: the LP's trees dealt out do not set the bar."""
    rounding = Rounding(p, lp, level_cost)
    if beat is None:
        kept = _rounded(p, lp, cost, rounding, keep, None, dealt=dealt) or [lp]
    else:
        kept = (_rounded(p, lp, cost, rounding, keep, beat, dealt=dealt)
                or _rounded(p, lp, cost, rounding, keep, beat * (1 + FILL), modelled=True,
                            dealt=dealt))
    return kept + _unrounded(p, lp, kept, cost, beat)


def _unrounded(p: Problem, lp: Packing, kept: list, cost, beat: float | None) -> list:
    """The LP's own trees, each dealt chunks by its rate (:func:`~.trees.lower`), where every
    rounding kept loses more than :data:`~.cost_tables.FILL` of the LP's rate, or none beats
    ``beat`` while the LP's trees do by the model's looser test (:func:`_rounded`'s
    ``modelled``), and the LP's trees fit the lanes: its trees of unequal rates share links
    fairly, not in the LP's proportions, but lose less than such a rounding does
    (docs/planner.md has cases measured both ways). Not for a forest allreduce: its two ways
    of a root must cut their chunks alike, each broadcast piece waiting for the reduction of
    the same piece, and the LP's up and down trees differ."""
    if any(k is lp for k in kept) or len(p.ways) > 1:
        return []
    if kept and max(k.rate for k in kept) >= lp.rate * (1 - FILL):
        return []
    if not kept:   # nothing rounded beats the time to beat: the LP's trees, if they may
        K, depth = max(1, len(lp.trees) // len(p.groups)), max(t.depth() for t in lp.trees)
        at = _modelled(cost, K, lp.rate, depth, lp)
        if beat is None or min(at.time, at.lockstep) >= beat * (1 + FILL):
            return []
    return [lp] if max(Counter(t.group for t in lp.trees).values()) <= most_trees(p) else []


def _rounded(p: Problem, lp: Packing, cost, rounding: "Rounding", keep: int,
             beat: float | None, modelled: bool = False, dealt: bool = True) -> list:
    """:func:`equal_trees` against one time to beat (None: any); ``modelled``: only roundings
    that beat it by the model's time (fill and waits included) at the better of its ends."""
    found = _found(p, lp, cost, rounding, beat, modelled, dealt)
    ranked = sorted(found, key=lambda f: (f.time, f.K))
    picks = ranked[:BUILT] + _buffered(p, ranked[:BUILT], ranked, keep)
    picks += _ended(picks, ranked, keep)

    def build(K, x):
        trees = rounding.trees(x, K)
        if trees is None:
            return None
        trees = lifted(p, trees)
        depth, rate = max(t.depth() for t in trees), rounding.rate(x, K)
        return _modelled(cost, K, rate, depth, Packing(rate=rate, trees=trees, columns=lp.columns))
    built = sorted((b for b in (build(f.K, f.trees) for f in picks) if b is not None),
                   key=lambda b: (b.time, b.K))
    kept = built[:keep] + _buffered(p, built[:keep], built[keep:], keep)
    kept += _ended(kept, built, keep)   # and each end's best once its BUILT best are built:
    more = [b for b in (build(f.K, f.trees) for f in _ended(picks, ranked, keep, BUILT)) if b]
    kept += _ended(kept, built + more, keep)
    if keep > 1:
        kept += _fitting(p, ranked, kept, {b.K: b for b in built + more}, build, rounding.rate)
    return [b.trees for b in kept]


def _found(p: Problem, lp: Packing, cost, rounding: "Rounding", beat: float | None,
           modelled: bool, dealt: bool = True) -> list:
    """The counts that beat ``beat`` (:class:`Rounded`), at most ``GPU_LANES`` (the CPU executor's
    further lanes are for many roots and a second lane per edge): per count the LP's trees dealt
    out (:meth:`Rounding.seeded`), or the program's where it beats all found before (:data:`BATCH`
    at once, each kept as if after them), one level deep only up to :meth:`Rounding.star_rate`;
    without ``dealt``, the program's alone."""
    counts = [K for K in range(1, min(most_trees(p), cost.most_trees(), GPU_LANES) + 1)
              if beat is None or cost.least_rate(K, beat) <= lp.rate]
    d = rounding.least_depth() if modelled else 1
    if modelled:   # not even the LP's rate in the shallowest trees wins by the model
        counts = [K for K in counts if min(cost.time(K, lp.rate, d), cost.time(
            K, lp.rate, d, lockstep=True)) < beat]
    to_beat = np.inf if beat is None else beat
    found: dict = {}
    # a kept count beats the best found one level deep (two past the star's rate) by more than
    # the simulator tells apart (each costs an integer program), and (modelled) ``beat`` d deep
    best = lambda: min([f.time * (1 - NOISE) for f in found.values()] + [to_beat])  # noqa: E731
    star = rounding.star_rate()

    def least(K):
        now = best()
        rate = max(cost.least_rate(K, now), cost.least_rate(K, to_beat, d))
        return max(rate, cost.least_rate(K, now, 2)) if rate > star else rate

    def keep(K, x):   # as if rounded after every count kept before it
        if x is not None and (rate := rounding.rate(x, K)) >= least(K) * (1 - 1e-9):
            found[K] = _modelled(cost, K, rate, rounding.depth(x), x)
    for K in counts if dealt else []:   # the dealt trees first: with the best of them to
        keep(K, rounding.seeded(K))      # beat, most programs are refused by the cheap LP
    for at in range(0, len(counts), BATCH):   # none that must beat the LP's rate: none can
        need = {K: least(K) for K in counts[at:at + BATCH]}
        batch = [K for K, rate in need.items() if rate <= lp.rate * (1 + 1e-6)]
        xs = rounding.solve_all([(K, K / need[K] if need[K] > 0 else np.inf) for K in batch])
        for K, x in zip(batch, xs):
            keep(K, x)
    found = list(found.values())
    return [f for f in found if min(f.time, f.lockstep) < beat] if modelled else found


def _fitting(p: Problem, ranked: list, kept: list, built: dict, build, rate) -> list:
    """A packing of ``ranked`` that fits twice (:func:`fits_twice`) in fewer trees than any of
    ``kept`` that does: the fewest within :data:`~.cost_tables.FILL` of the best kept rate (waits
    hide behind the second lane, fewer trees move larger pieces), or if none of ``kept`` fits,
    the best-ranked with at most half the trees the lanes hold (:data:`BUILT` tried)."""
    fit = lambda packing: fits_twice(packing.trees, p.modes(), p.lanes)  # noqa: E731
    fits = [b.K for b in kept if fit(b.trees)]
    best = max((b.trees.rate for b in kept), default=0.0)
    near = sorted((r for r in ranked if rate(r.trees, r.K) >= best * (1 - FILL)), key=lambda r: r.K)
    half = [] if fits else [r for r in ranked if r.K <= most_trees(p) // 2][:BUILT]
    for K, x in [(r.K, r.trees) for r in near[:1] + half]:
        b = built[K] if K in built else build(K, x)
        if b is not None and fit(b.trees) and all(K < k for k in fits):
            return [b]
    return []


class Rounded(NamedTuple):
    """``K`` trees per group the rounding found (``trees``: their counts, or once built their
    :class:`~.treepack.Packing`), timed at each end of the model (:class:`~.trees.Pipeline`): waits
    hidden (the ranking), waits paid in ``lockstep``, and fill ``shared`` by a group's trees."""

    time: float
    K: int
    trees: object
    lockstep: float
    shared: float


def _modelled(cost, K: int, rate: float, depth: int, trees) -> Rounded:
    return Rounded(cost.time(K, rate, depth), K, trees, cost.time(K, rate, depth, lockstep=True),
                   cost.time(K, rate, depth, shared=True))


def _ended(chosen: list, rest: list, keep: int, n: int = 1) -> list:
    """The ``n`` best of ``rest`` (:class:`Rounded`) by each other end, those not in ``chosen``,
    where more than one plan is kept: trees that wait together favour fewer, shallower trees;
    trees that share their fill, more trees at a higher rate."""
    if keep < 2 or not rest:
        return []
    out = []
    for end in ("lockstep", "shared"):
        for best in sorted(rest, key=lambda r: (getattr(r, end), r.K))[:n]:
            out += [] if any(c.K == best.K for c in chosen + out) else [best]
    return out


def _buffered(p: Problem, chosen: list, rest: list, keep: int) -> list:
    """The first of ``rest`` (:class:`Rounded`, best first) whose ``K`` trees per group leave
    the lanes two per tree edge, where none of ``chosen`` does and more than one plan is kept:
    two lanes per edge hide a tree's waits behind its own next chunk."""
    half = most_trees(p) // 2
    return [] if keep < 2 or any(c.K <= half for c in chosen) else [
        r for r in rest if r.K <= half][:1]


def centred(tree: Tree) -> Tree:
    """A tree used both ways, rooted at its centre (the shortest pipeline): an edge that runs
    against its arc swaps which of its transfers is staged."""
    n = max(max(e) for e in tree.edges) + 1
    root = centre(n, list(tree.edges))
    edges = orient(tuple(range(n)), tree.edges, root)
    where = {frozenset(e): i for i, e in enumerate(tree.edges)}
    paths, down, up = [], [], []
    for i, (a, b) in enumerate(edges):
        j = where[frozenset((a, b))]
        same = tree.edges[j] == (a, b)
        sd, su = j in tree.staged, j in tree.staged_up
        paths.append(tree.paths[j])
        if sd if same else su:
            down.append(i)
        if su if same else sd:
            up.append(i)
    return replace(tree, root=root, edges=edges, paths=tuple(paths), staged=tuple(down),
                   staged_up=tuple(up))
