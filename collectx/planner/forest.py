"""Throughput-optimal allgather / reduce-scatter / allreduce forests (ForestColl-style).

How it works
------------
Allgather: every GPU ``r`` roots a few out-trees spanning the job's GPUs; together the trees of
one root carry that root's unit at a rate ``x`` common to all roots. One LP packs all the trees
into the link capacities (:func:`~.treepack.pack_out_trees`); without routing limits its
optimum is the ForestColl cut bound, ``busbw = (N-1) x``. Each root's unit is cut into
``nchunks`` chunks shared among its trees in proportion to their rates and pipelined down them.

Reduce-scatter runs in-trees: the packing is done on the reversed graph, and every tree reduces
its chunks of unit ``r`` bottom-up into rank ``r``'s output. Allreduce is reduce-scatter then
allgather over the same unit: root ``r`` owns an ``nchunks / N`` shard of it, reduces that shard
along its in-trees, then broadcasts it along its out-trees, chunk by chunk (the allgather of
chunk ``j`` waits only for the reduction of chunk ``j``).

Tree edges are priced by the route the simulator gives each GPU pair (one widest path, see
:func:`collectx.topology.view.simulator_routes`), so the schedule's predicted rate is the packing's.
"""

from __future__ import annotations

import networkx as nx

from ..errors import PlanError
from ..schedule.builder import ScheduleBuilder
from ..schedule.ir import Ref, Schedule
from ..schedule.metrics import unit_bytes
from ._build import check_args, faster, rate_kept, simulated
from ..topology.view import job_graph, require_connected
from .switch_trees import tree_shaped
from .chunking import (chunk_counts, equal_unit_mixes, instruction_budget, largest_remainder,
                       most_kept, runs_by_group, whole_per_tree)
from .treepack import shallowest
from .treesched import (SUBLANES, Share, TreeEmitter, chunk_refs, pack_rooted,
                        pack_rooted_mirrored)

SUPPORTED = ("allgather", "reduce_scatter", "allreduce")
MIN_CHUNK_BYTES = 64 << 10     # below this per-chunk latency outweighs finer pipelining
MAX_INSTRUCTIONS = 4096        # at 8 ranks, growing with n^2 (see chunking.instruction_budget);
                               # 1 GiB at 8 GPUs keeps ~95% of 4x the chunks' simulated busbw
CANDIDATE_CHUNKS = (8, 16, 32, 64, 128, 256)
# Allgather trees with host edges pipeline each chunk through two PCIe copies: the budget
# leaves 7 and 8 ranks 64 chunks, whose fill costs 7-GPU DGX-1 allocations about 0.04 of the
# bound; they may take this many (6 ranks get it within the budget).
HOST_CHUNKS = 128
# Allreduce forests with host edges on up to 4 ranks: four instruction budgets (up to 512
# chunks per root). On the four 4-GPU DGX-1V allocations that take them, 128 -> 512 chunks
# per root lift allreduce from 0.91 to 0.96 of the reference, at 0.1-0.5 s more planning.
HOST_WIDE_UP_TO = 4
HOST_WIDE_SCALE = 4
# Lanes per link of each root in the per-root layouts of an allgather forest: on 16-GCD MI250
# two beat one (0.950 against 0.940 of the bound at 128 chunks).
ROOT_SUBLANES = (1, 2)
# Past 8 ranks (the planning-time target is 5 s there, not 1 s), forests that lag their packing
# rate also try this many times the budget's chunks (see _finer_or).
FINER_FROM = 9
FINER_SCALE = {"allgather": 2, "reduce_scatter": 4, "allreduce": 8}
# ... with reductions on this many lanes per link: a reduction's lanes are keyed by the
# children it pulls from, so every root whose in-trees share them at a node queues there.
# MI250 allreduce, its broadcasts on one lane per link and root: 0.939 of the reference with
# two lanes for broadcasts and reductions, 0.975 with three for reductions (two or four:
# 0.967, 0.972). Reduce-scatter runs half as long, so its lanes must chain fewer steps (3.4 us
# each in the cost model): 0.878 of the bound with three lanes, 0.940 with four.
FINER_UP_SUBLANES = {"reduce_scatter": 4, "allreduce": 3}
NEAR_RATE = 0.97               # an allreduce this close to its packing rate needs no rival
UNIT_TREES = range(4, 9)       # equal trees per root tried for allgather with host edges
# ... and, where that plan stays below MIXES_BELOW of its packing rate, the WIDE_MIXES mixes of
# up to MANY_TREES trees per root that keep the most rate, on WIDE_CHUNKS chunks per root and
# WIDE_SUBLANES lanes per root and link
MANY_TREES = range(2, 25)
WIDE_BELOW = 0.95   # forests below this of their packing rate try more (see _lags)
MIXES_BELOW = 0.96
WIDE_MIXES = 2
WIDE_CHUNKS = 256
WIDE_SUBLANES = 3
WIDE_UP_TO = 7   # ranks: the full DGX-1s gained nothing from them and planned in 1.0 s, not 0.7
# The equal-tree mix of an allgather with host edges moves runs of this many chunks, out of
# step from tree to tree (TreeEmitter's stagger), on as many times the chunks: of the 392
# DGX-1 allgathers with host edges 82 got faster and 7 slower (by 0.009 at most); the three
# below 0.95 rose by 0.003-0.006. Staggering the wider mixes on lanes per root lost more
# than it won.
MIX_STAGGER = 2


def plan_forest(topo: nx.DiGraph, ranks: tuple, collective: str, nbytes: int, *, root: int = 0,
                inplace: bool = False, nchunks: int | None = None,
                host: bool | str = False, lean: bool = True) -> Schedule:
    """Plan allgather, reduce_scatter or allreduce as per-root packed tree forests.

    Parameters
    ----------
    topo : nx.DiGraph
        The topology (not modified). GPUs outside ``ranks`` are not used as relays.
    ranks : tuple of str
        GPU node ids; schedule rank ``i`` is ``ranks[i]``.
    collective : str
        allgather, reduce_scatter or allreduce.
    nbytes : int
        Message size (nccl-tests convention); bounds the chunk count from above.
    root : int
        Unused (no rooted collective is served); accepted for the common signature.
    inplace : bool
        Build for aliased input/output.
    host : bool
        Also let tree edges between GPUs joined by a direct link move through host memory
        over PCIe (:func:`~.treesched.pack_rooted`), staged with ``host`` buffers: the
        packing then reaches the cut bounds that count PCIe beside NVLink. Only for
        executors with host buffers (:mod:`.host_relay` decides). ``host="any"`` offers
        every GPU pair that route, directly linked or not. ``lean`` (with ``host``): the
        least loaded of the optimal packings, else the LP's vertex
        (:func:`~.treesched.pack_rooted`).
    nchunks : int, optional
        Chunks per payload unit; default the smallest count whose integral shares keep 98%
        of the packing's rate with the pipeline fill counted, within :data:`MIN_CHUNK_BYTES`
        per chunk and about ``instruction_budget(n)`` per schedule (see :mod:`~.chunking`).
        Allreduce rounds it up to a multiple of N (every root reduces and broadcasts
        ``nchunks / N`` chunks).

    Returns
    -------
    Schedule
        ``meta["trees"]`` lists ``[phase, root rank, edges, first chunk, nchunk]`` per tree.

    Raises
    ------
    PlanError
        Unsupported collective; NoFeasiblePlan if the GPUs are not connected.

    Examples
    --------
    >>> from collectx.topology import line
    >>> from collectx.schedule import verify
    >>> s = plan_forest(line(3), ("GPU0", "GPU1", "GPU2"), "allgather", 1 << 20, nchunks=4)
    >>> verify(s).instructions > 0, s.algorithm
    (True, 'forest')
    """
    n = len(ranks)
    check_args(collective, n, root, nchunks)
    if collective not in SUPPORTED:
        raise PlanError(f"forest plans {', '.join(SUPPORTED)}, not {collective}; use blink or "
                        f"direct for rooted collectives")
    ranks = tuple(ranks)
    if n == 1:
        return _single(collective, inplace)
    G = job_graph(topo, ranks)
    require_connected(G, ranks)
    if host:
        packed = (_pack_allreduce(G, ranks, host=host, lean=lean) if collective == "allreduce"
                  else {collective: pack_rooted(G, ranks, ranks, collective == "reduce_scatter",
                                                host=host, lean=lean)})
        if collective == "allgather":   # on 30 sampled DGX-1 allocations per-root lanes
            # won 14 (up to +0.07 of the bound), lanes per link the rest
            s = _faster_layout(packed, collective, nbytes, ranks, inplace, nchunks, topo)
            if not lean:
                s, packed = _shallow_or(s, packed, nbytes, ranks, inplace, nchunks, topo)
            return _equal_units_or(s, packed[collective], ranks, inplace, nchunks, topo, nbytes,
                                   wide=lean)
        return _schedule(packed, collective, nbytes, ranks, inplace, nchunks)
    if collective == "allreduce":
        packed = _pack_allreduce(G, ranks)
        s = _schedule(packed, collective, nbytes, ranks, inplace, nchunks)
        if all(p.balanced for p, _ in packed.values()) and tree_shaped(G, ranks):
            # Switch-hierarchy trees lose to the LP's forest in the simulator on some uneven
            # PCIe allocations (3 + 2 GPUs over two sockets): keep the faster of the two.
            rate = min(p.rate for p, _ in packed.values())
            s = _unless_lp_faster(s, rate, G, topo, nbytes, ranks, inplace, nchunks)
        return s if nchunks else _finer_or(s, packed, collective, nbytes, ranks, inplace, topo,
                                           True, 1)
    packed = {collective: _pack(G, ranks, reverse=collective == "reduce_scatter")}
    if collective == "allgather" and not packed[collective][0].balanced:
        # Unequal LP trees: whether a root's trees do better on one lane of their own per
        # link (the links' equal sharing then goes per root, not per transfer) depends on
        # the fabric: +12% on mi250_16gcd, up to -7% on DGX-1 allocations.
        return _faster_layout(packed, collective, nbytes, ranks, inplace, nchunks, topo)
    s = _schedule(packed, collective, nbytes, ranks, inplace, nchunks)
    return s if nchunks else _finer_or(s, packed, collective, nbytes, ranks, inplace, topo,
                                       False, SUBLANES)


def _pack_allreduce(G, ranks, balanced: bool = True, host: bool | str = False,
                    lean: bool = True) -> dict:
    both = pack_rooted_mirrored(G, ranks, ranks, balanced=balanced, host=host, lean=lean)
    return {"allgather": both[False], "reduce_scatter": both[True]}


def _faster_layout(packed: dict, collective: str, nbytes: int, ranks: tuple, inplace: bool,
                   nchunks, topo) -> Schedule:
    """The forest on lanes per link or on lanes per root and link (:data:`ROOT_SUBLANES`),
    whichever the simulator finishes first; all share one chunk count. Past 8 ranks the
    winner's layout may also take more chunks (:func:`_finer_or`)."""
    n = len(ranks)
    layouts = [(False, SUBLANES)] + [(True, k) for k in ROOT_SUBLANES]
    counted = _counts(packed, collective, nbytes, n, nchunks)
    best = None
    for per_tree, sublanes in layouts:
        s = _schedule(packed, collective, nbytes, ranks, inplace, nchunks, per_tree=per_tree,
                      sublanes=sublanes, counted=counted)
        if best is None or faster(best[0], s, topo, nbytes, ranks) is s:
            best = s, per_tree, sublanes
    s, per_tree, sublanes = best
    return s if nchunks else _finer_or(s, packed, collective, nbytes, ranks, inplace, topo,
                                       per_tree, sublanes)


def _finer_or(s: Schedule, packed: dict, collective: str, nbytes: int, ranks: tuple,
              inplace: bool, topo, per_tree: bool, sublanes: int) -> Schedule:
    """``s``, or the forest on :data:`FINER_SCALE` times its chunks per root (at most as many
    as :data:`MIN_CHUNK_BYTES` allows) where ``s`` lags its packing's rate
    (:data:`WIDE_BELOW`) past 8 ranks (:data:`FINER_FROM`) and that simulates faster;
    ``per_tree`` and ``sublanes`` as in :func:`_schedule`, reductions on
    :data:`FINER_UP_SUBLANES` lanes per link.

    The LP's trees on 16-GCD MI250 run 5 to 13 levels deep, and their pipelines fill in a
    chunk time per level: allreduce, whose chunks climb in-trees and descend out-trees, went
    from 0.77 of the reference on the budget's 64 chunks per root to 0.975 on 512, with the
    broadcasts on a lane per link and root and the reductions on three lanes per link
    (1024 chunks gain nothing more, and their lanes chain more
    steps than the cost model's per-step latency lets finish in that time); allgather from
    0.947 on 128 to 0.957 on 256 (0.956 on 512, 0.942 on 1024); reduce-scatter from 0.850 on
    128 to 0.940 on 512 (0.908 on 256; 0.943 on 768 with six lanes: past 512 it needs more
    lanes to keep its step chains short)."""
    n = len(ranks)
    roots = n if collective == "allreduce" else 1   # allreduce's chunks are cut among roots
    most = int(unit_bytes(collective, nbytes, n) // roots // MIN_CHUNK_BYTES)
    per_root = min(FINER_SCALE[collective] * (s.nchunks // roots), most)
    rate = min(p.rate for p, _ in packed.values())
    if n < FINER_FROM or per_root <= s.nchunks // roots or \
            not _lags(s, rate, topo, nbytes, ranks):
        return s
    total = per_root * n if collective == "allreduce" else per_root
    finer = _schedule(packed, collective, nbytes, ranks, inplace, total, per_tree=per_tree,
                      sublanes=sublanes, up_sublanes=FINER_UP_SUBLANES.get(collective))
    return faster(s, finer, topo, nbytes, ranks)


def _lags(s: Schedule, rate: float, topo, nbytes: int, ranks, below: float = WIDE_BELOW) -> bool:
    """Whether ``s`` simulates below ``below`` of the busbw its packing plans, ``(N - 1)``
    times the per-root ``rate``: the test for trying more on a forest."""
    return rate_kept(s, topo, nbytes, ranks, (len(ranks) - 1) * rate) < below


def _shallow_or(s: Schedule, packed: dict, nbytes: int, ranks: tuple, inplace: bool, nchunks,
                topo) -> tuple[Schedule, dict]:
    """The allgather over the shallowest of the LP's optima (:func:`~.treepack.shallowest`)
    and that packing, where ``s`` lags its packing rate (:data:`WIDE_BELOW`) and the
    shallowest simulates faster; else ``(s, packed)``.

    The LP's vertex and its shallowest optimum each win on some DGX-1 allocations with host
    edges: of the 14 allgathers below 0.95 of the bound, trying both lifted 5 past it (DGX-1V
    GPUs 1, 2, 3, 5, 6, 7: 0.928 -> 0.960); the shallowest alone would have cost some 4-GPU
    DGX-1P ones up to 0.04."""
    packing, caps = packed["allgather"]
    if not _lags(s, packing.rate, topo, nbytes, ranks):
        return s, packed
    trees = shallowest(packing, caps)
    if trees is packing:
        return s, packed
    shallow = {"allgather": (trees, caps)}
    other = _faster_layout(shallow, "allgather", nbytes, ranks, inplace, nchunks, topo)
    return (other, shallow) if faster(s, other, topo, nbytes, ranks) is other else (s, packed)


def _schedule(packed: dict, collective: str, nbytes: int, ranks: tuple, inplace: bool,
              nchunks, per_tree: bool | None = None, sublanes: int = SUBLANES,
              counted: tuple | None = None, stagger: int = 1,
              up_sublanes: int | None = None) -> Schedule:
    """``counted``: :func:`_counts` of these arguments, when the caller has it already;
    ``sublanes`` and ``up_sublanes``: lanes per link of broadcasts and of reductions
    (default ``sublanes``), see :class:`~.treesched.TreeEmitter`."""
    n = len(ranks)
    at = {g: i for i, g in enumerate(ranks)}
    per_root, counts = counted or _counts(packed, collective, nbytes, n, nchunks)
    if stagger > 1:
        per_root = per_root * stagger
        counts = {k: [(t, c * stagger) for t, c in v] for k, v in counts.items()}
    ag, rs = (counts.get(k) for k in ("allgather", "reduce_scatter"))
    nch = per_root * n if collective == "allreduce" else per_root
    b = ScheduleBuilder(collective, n, nch, inplace=inplace, algorithm="forest")
    em = TreeEmitter(b, sublanes, stagger=stagger, up_sublanes=up_sublanes)
    trees_meta: list = []
    # Equal-rate allgather forests move each tree's transfers on their own lanes (see
    # TreeEmitter.broadcast). Allreduce keeps lanes per link: there each broadcast starts as
    # its chunk's reduction ends, and lanes shared in that order simulate 1-3% faster.
    if per_tree is None:
        per_tree = collective == "allgather" and packed["allgather"][0].balanced
    _EMIT[collective](b, em, at, ag, rs, trees_meta, per_tree)
    em.flush()
    b.meta("trees", trees_meta)
    b.meta("rate_gbps", {phase: p.rate for phase, (p, _) in packed.items()})
    return b.build()


def _equal_units_or(s: Schedule, packed: tuple, ranks, inplace, nchunks, topo,
                    nbytes, wide: bool = False) -> Schedule:
    """``s``, or the allgather over a few trees of one equal rate per root, where that
    simulates faster.

    The LP mixes a root's trees at unequal rates, but a link shares its bandwidth equally
    among the transfers on it, so where they meet they do not get their planned rates (as for
    Blink allreduce, see :func:`~.blink._equal_units_or`). :func:`~.chunking.equal_units`
    gives every root ``k`` equal copies of its trees; the mix of ``k`` in :data:`UNIT_TREES`
    that keeps the most rate (the fewest trees among equals) is simulated on lanes per link,
    with as many chunks per root as ``s`` rounded up to whole chunks per tree. On the 30
    DGX-1 allgathers below 0.95 of the bound, the host modes reached 0.95 on 11 with a search
    over k = 2..8, both lane layouts and two chunk counts (on 2 without equal trees), and on 8
    with this one simulation per plan; over all 247 allocations of each DGX-1 those below 0.95
    went from 14 to 12 (DGX-1V) and from 16 to 11 (DGX-1P).

    With ``wide`` (least loaded packings), where ``s`` still lags its packing rate
    (:data:`MIXES_BELOW`), mixes of up to :data:`MANY_TREES` trees per root are tried too: the
    :data:`WIDE_MIXES` that keep the most rate, each on :data:`WIDE_SUBLANES` lanes of its own
    per root and link, with :data:`WIDE_CHUNKS` chunks per root. On the 22 DGX-1 allgathers
    then below 0.95 of the bound a mix of up to 24 trees reached 0.95 on 14; the two best-kept
    mixes of each packing reach it on 7 at 256 chunks per root on lanes per root (on lanes per
    link: 3; at 128 or 512 chunks: 2 or 3).

    The gate sits above :data:`WIDE_BELOW` because a packing whose host routes serve only
    linked pairs plans less than the bound: DGX-1V GPUs 0, 2, 3, 5, 6, 7 kept 0.954 of that
    packing's rate but 0.925 of the bound. Three lanes per root and link, not one, then lift
    it from 0.935 to 0.954 and GPUs 0, 1, 3, 4, 5, 7 from 0.949 to 0.952; over the 494 DGX-1
    allgathers 20 got faster and 10 slower (by 0.013 at most: DGX-1V GPUs 1-7, 0.974 ->
    0.961). With one lane and the higher gate they stay at 0.946 / 0.949; trying one and
    three lanes leaves the first at 0.946, because the host modes and the finer cuts after
    them pick among plans by their simulated time before those cuts.
    """
    packing, caps = packed
    if len(packing.trees) <= len(ranks):
        return s   # one tree per root: nothing to even out
    def plan(units, q, counts, per_tree, sublanes=SUBLANES, stagger=1):
        return _schedule({"allgather": (units, caps)}, "allgather", nbytes, ranks, inplace, q,
                         per_tree=per_tree, sublanes=sublanes, counted=(q, {"allgather": counts}),
                         stagger=stagger)

    for k, units in most_kept(equal_unit_mixes(packing, caps, UNIT_TREES))[:1]:
        q, counts = (nchunks, largest_remainder(units, nchunks)) if nchunks else \
            whole_per_tree(units, k, s.nchunks // s.meta_dict().get("stagger", 1))
        s = faster(s, plan(units, q, counts, False, stagger=1 if nchunks else MIX_STAGGER),
                   topo, nbytes, ranks)
    if nchunks or not wide or len(ranks) > WIDE_UP_TO or \
            not _lags(s, packing.rate, topo, nbytes, ranks, MIXES_BELOW):
        return s
    # Without the price per tree level only: the rate kept decides here, and searching both
    # ways for 23 k per root took the slowest DGX-1 allgather to 1.0 s of planning.
    mixes = equal_unit_mixes(packing, caps, MANY_TREES, priced=(False,))
    for k, units in most_kept(mixes)[:WIDE_MIXES]:
        s = faster(s, plan(units, *whole_per_tree(units, k, WIDE_CHUNKS), True, WIDE_SUBLANES),
                   topo, nbytes, ranks)
    return s


def _unless_lp_faster(s: Schedule, rate: float, G, topo, nbytes: int, ranks, inplace,
                      nchunks) -> Schedule:
    """``s``, or the LP forest's allreduce if the simulator finishes that one first; the LP
    forest is not planned when ``s`` already reaches :data:`NEAR_RATE` of its packing
    ``rate`` (GB/s per root; busbw ``(N - 1) * rate``)."""
    mine = simulated(s, topo, nbytes, ranks)
    if mine is None or mine.busbw_GBps >= NEAR_RATE * (len(ranks) - 1) * rate:
        return s
    lp = _schedule(_pack_allreduce(G, ranks, balanced=False), "allreduce", nbytes, ranks,
                   inplace, nchunks)
    return faster(s, lp, topo, nbytes, ranks)   # s's simulation is cached: run once


plan_forest.collectives = SUPPORTED


def _pack(G: nx.DiGraph, ranks, reverse: bool) -> tuple:
    return pack_rooted(G, ranks, ranks, reverse)


def _shares(counts, at: dict, first_of, phase: str, meta: list) -> list:
    """Every root's trees as Shares of consecutive chunks from ``first_of(root rank)``."""
    out = []
    for g, runs in runs_by_group(counts, lambda g: first_of(at[g])).items():
        for t, run in runs:
            edges = tuple((at[p], at[c]) for p, c in t.edges)
            share = Share.of(t, at[g], edges, run, up=phase == "reduce_scatter")
            out.append(share)
            meta.append([phase, at[g], [list(e) for e in edges], run[0], len(run),
                         *share.host_record()])
    return out


def _emit_allgather(b, em, at, ag, rs, meta, per_tree=False):
    c = b.nchunks
    shares = _shares(ag, at, lambda r: 0, "allgather", meta)
    if not b.inplace:
        for r in range(b.nranks):
            for j in range(c):
                em.self_copy(r, Ref(r, "output", r * c + j), Ref(r, "input", j))
    em.broadcast(shares, src=chunk_refs("input"), dst=chunk_refs("output", c),
                 per_tree=per_tree)


def _emit_reduce_scatter(b, em, at, ag, rs, meta, per_tree=False):
    c = b.nchunks
    shares = _shares(rs, at, lambda r: 0, "reduce_scatter", meta)
    em.reduce(shares, contrib=chunk_refs("input", c), result=chunk_refs("output"))


def _emit_allreduce(b, em, at, ag, rs, meta, per_tree=False):
    per_root = b.nchunks // b.nranks
    span = lambda r: r * per_root  # noqa: E731
    here = chunk_refs("output")
    done = em.reduce(_shares(rs, at, span, "reduce_scatter", meta),
                     contrib=chunk_refs("input"), result=here)
    em.broadcast(_shares(ag, at, span, "allgather", meta), src=here, dst=here, after=done,
                 per_tree=per_tree)


_EMIT = {"allgather": _emit_allgather, "reduce_scatter": _emit_reduce_scatter,
         "allreduce": _emit_allreduce}


def _counts(packed: dict, collective: str, nbytes: int, n: int, nchunks) -> tuple[int, dict]:
    """Chunks per root and the integral tree counts of each phase.

    Allreduce gives every root ``nchunks / N`` chunks (rounded up) in both phases, so the two
    phases are solved for the same count.
    """
    if nchunks:
        cands = [-(-nchunks // n) if collective == "allreduce" else nchunks]
    else:
        unit = unit_bytes(collective, nbytes, n) / (n if collective == "allreduce" else 1)
        edges = len(packed) * n * (n - 1)       # one instruction per tree edge, chunk and phase
        budget = instruction_budget(n, MAX_INSTRUCTIONS) // edges
        sizes = CANDIDATE_CHUNKS
        if any(p.staged for p, _ in packed.values()):
            if collective == "allgather":
                budget = max(budget, HOST_CHUNKS)
            elif collective == "allreduce" and n <= HOST_WIDE_UP_TO:
                budget *= HOST_WIDE_SCALE
                sizes += (2 * sizes[-1],)
        most = max(1, min(int(unit // MIN_CHUNK_BYTES), budget))
        cands = [c for c in sizes if c <= most] or [1]
    memo: dict = {phase: {} for phase in packed}
    chosen = {phase: chunk_counts(p, caps, cands, memo=memo[phase])
              for phase, (p, caps) in packed.items()}
    q = max(c for c, _ in chosen.values())
    counts = {}
    for phase, (p, caps) in packed.items():
        counts[phase] = chunk_counts(p, caps, [q], memo=memo[phase])[1]
    return q, counts


def _single(collective: str, inplace: bool) -> Schedule:
    b = ScheduleBuilder(collective, 1, 1, inplace=inplace, algorithm="forest")
    if not inplace:
        b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    return b.build()
