"""Blink-style packed spanning trees: allreduce, broadcast and reduce on any allocation.

How it works
------------
Broadcast from ``root``: an LP packs out-arborescences rooted there into the link capacities
(:func:`~.treepack.pack_out_trees`; Edmonds: the optimum is ``min_v maxflow(root -> v)``). The
payload's ``nchunks`` chunks are shared among the trees in proportion to their rates and
pipelined down each tree. Reduce is the same on the reversed graph, chunks combined bottom-up.

Allreduce packs spanning trees that carry data both ways (Nash-Williams–Tutte packing,
:func:`~.treepack.pack_undirected_trees`): each tree reduces its share of the chunks up to its
centre and broadcasts the result back down, chunk by chunk, so reduction and broadcast overlap.
This reaches ``busbw = 2(N-1)/N * T`` for packing rate ``T``, beyond reduce-scatter + allgather
on sparse allocations (a line of three GPUs: 133 vs 100), and needs no ring, so it serves
allocations where none exists.

Tree edges are priced by the route the simulator gives each GPU pair
(:func:`collectx.topology.view.simulator_routes`), so the predicted rate is the packing's.

Where every direct GPU link is a whole number of lanes of one rate (xGMI, NVLink), the LP's
unequal trees are weighed against equal unit-rate trees (:mod:`~.integral_trees`), each on
lanes of its own: a link is shared equally among its transfers, so only equal trees get the
rates they were planned with. Broadcast / reduce take Edmonds' disjoint trees when they keep
the LP's rate; allreduce takes greedy unit spanning trees when the simulator finds them faster.
Where the mixes of the LP's own trees lose rate, equal trees counted edge by edge by an integer
program (:mod:`~.exact_mixes`) are simulated too.
"""

from __future__ import annotations

import networkx as nx

from ..errors import PlanError
from ..schedule.builder import ScheduleBuilder
from ..schedule.ir import Ref, Schedule
from ..schedule.metrics import unit_bytes
from ._build import check_args, faster, rate_kept, simulated
from ..topology.view import job_graph, require_connected
from .exact_mixes import exact_equal_mixes, exact_rooted_mix
from .integral_trees import depth_balanced_counts, pack_unit_spanning_trees
from .chunking import (chunk_counts, equal_unit_mixes, instruction_budget, largest_remainder,
                       most_kept, runs_by_group)
from .treesched import SUBLANES, Share, TreeEmitter, chunk_refs, pack_both_ways, pack_rooted

SUPPORTED = ("allreduce", "broadcast", "reduce")
MIN_CHUNK_BYTES = 64 << 10     # below this per-chunk latency outweighs finer pipelining
MAX_INSTRUCTIONS = 4096        # at 8 ranks, growing with n^2 (see chunking.instruction_budget)
CANDIDATE_CHUNKS = (16, 32, 64, 128, 256, 512)
# Past 8 ranks the instruction budget grows with n ** 3 (see chunking.instruction_budget) and
# trees ~10 levels deep need the chunks: 16-GCD MI250 allreduce 0.82 -> 0.87 of the reference
# with 1024. Up to 8 ranks 1024 chunks (host packings of 3-6 GPUs could take them) gained
# 0.4% on average on DGX-1 for half as much planning time again.
WIDE_CHUNKS = (1024,)
# Trees with host edges pipeline each chunk through PCIe copies, whose fill 256 chunks leave
# long: up to 6 ranks they may take twice the instruction budget, so up to 512 chunks (on
# sampled 6-GPU DGX-1 allocations +0.03 of the reference; past 6 ranks the planning time
# would pass 1 s).
HOST_CHUNKS_UP_TO = 6
# Equal-rate tree counts tried for broadcast (see _broadcast_units_or) and allreduce (see
# _equal_units_or) packings with host edges, and how many allreduce mixes, best estimated
# first, are simulated. Allreduce mixes of up to 36 trees lifted 23 DGX-1 plans (2 past 0.95)
# and lowered 2 by 0.003; broadcasts lost up to 0.015 with them (one fell below 0.95).
UNIT_TREES = range(3, 29)
ALLREDUCE_UNIT_TREES = range(3, 37)
UNITS_SIMULATED = 2
# ... and on 3 GPUs, whose plans take a quarter of a second, this many: DGX-1P GPUs 0, 1, 2 and
# its three mirror images 0.945 -> 0.956 of the reference, for 0.15 s more planning time.
UNITS_SIMULATED_3 = 6
# Where no mix of the column generation's trees keeps this much of the packing's rate, the
# fewest equal trees that keep exact_mixes.KEEP of it, counted edge by edge, are simulated too
# where they keep at least the best mix's rate, and taken where they finish in EXACT_LEAD of the
# best plan's time or less: taken wherever faster, 10 DGX-1 plans got slower, as pipelines cut
# finer (host_relay) gain less on them than on the plans they displaced. They take the place of
# one column mix in the simulations, of all where they keep EXACT_ALONE more of the rate than
# the best mix (simulated beside every mix they cost 6-7 GPU plans 0.2-0.4 s): the 72 DGX-1
# allocations of 6-7 GPUs plan in a median 0.80 / 0.70 s, slowest 0.97 / 0.90 s, against
# 0.83 / 0.68 s and 1.01 / 1.01 s before the program (DGX-1P / DGX-1V, 5667675 run beside).
EXACT_BELOW = 0.99
EXACT_LEAD = 0.99
EXACT_ALONE = 0.01
FILL_WEIGHT = 0.5
# ... and where only the best-estimated mix is simulated (7 ranks): over the 7-GPU DGX-1
# allocations at 2048 chunks that mix came within 0.991 of the best mix's busbw (mean) at
# 0.25, 0.989 at 0.5 and 0.982 at 1.
FILL_WEIGHT_ONE = 0.25
# From this many ranks, packings with host edges that have equal-tree mixes are lowered only
# as those: on the DGX-1 allocations of 6 and 7 GPUs their LP trees (on shared lanes, a lane
# per tree or lanes in proportion) never won, and lowering them took ~0.15 s of a 1 s plan.
UNITS_ONLY_FROM = 6
# k equal trees split the chunks k ways, so each fills its pipeline in k times fewer chunks than
# one tree of the whole rate: up to 6 ranks they take four times the most chunks host packings
# may take, 2048 at 1 GiB. Twice (1024) lifted DGX-1V 5-6 GPU allocations up to +0.026 of the
# reference; four times added 0.007 in the median over 879 mixes of the 132 DGX-1 allocations
# then below 0.95, and a mix reached 0.95 on 54 of them instead of 30. At 7 GPUs they do too,
# simulating only the best-estimated mix (as many chunks simulate twice as slowly as at 6):
# the 16 DGX-1 plans went from 0.854-0.915 of the reference to 0.898-0.960 (2 past 0.95,
# 3 of DGX-1V 0.005 lower), for about 0.1 s more.
UNIT_CHUNKS = 4
UNIT_CHUNKS_UP_TO = 7
TREE_LANES = 4                 # most lanes per link one allreduce tree gets with lanes of its own
# Allreduce trees with host edges on lanes of their own move their chunks in runs of two,
# every other tree's first run one chunk (TreeEmitter's stagger): equal trees no longer wait
# out their transfers' latency in step. Over the 2 x 247 DGX-1 allocations 333 allreduce
# plans got faster (median +0.005 of the reference, up to +0.027) and 22 slower (by 0.013 at
# most); those below 0.95 went from 9 / 2 to 4 / 0 (DGX-1V / DGX-1P). Runs of three, or
# four, lifted fewer.
STAGGER = 2
MAX_ROOTED_INSTRUCTIONS = 4096   # broadcast / reduce at 8 ranks (one per tree edge and chunk),
                                 # growing with n^2 (see chunking.instruction_budget)
SHALLOW_INSTRUCTIONS = 12288     # two-level trees, any n: they fill in one chunk time, and
                                 # the best count balances that against per-chunk waits
PER_TREE_CHUNKS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 240)
PAIRED_CHUNKS = (320, 480, 640)   # staggered pieces of equal deep trees (see _rooted_style)
PAIRED_TRIED = 2                  # of their largest counts, simulated
WIDE_BELOW = 0.95   # deep broadcasts with host edges below this of their rate try more chunks
# ... these many times the budget's count, in turn. Broadcasts below 0.95 of the bound on the
# 247 DGX-1V / DGX-1P allocations: 17 / 13 with the budget's count, 11 / 13 with 2x, 9 / 6
# with 4x as well (8x too: no fewer, and the slowest plans took 1.5 s).
WIDE_FACTORS = (2, 4)
UNIT_BROADCAST_CHUNKS = 2048   # of equal-tree broadcasts (see _broadcast_units_or), at most
UNIT_BROADCAST_UP_TO = 7       # ranks: the full DGX-1s gained nothing and took 0.2 s more
# Chunks of the integer program's equal-tree broadcasts (see _exact_broadcast_or): the full
# DGX-1V's 31 trees reach 0.973 of the bound on 4096 and plan in 0.44 s; on 2048 they reach
# 0.967-0.969 and, below the relay gate, go on to the host modes and cuts that follow (0.73 s).
EXACT_BROADCAST_CHUNKS = 4096


def plan_blink(topo: nx.DiGraph, ranks: tuple, collective: str, nbytes: int, *, root: int = 0,
               inplace: bool = False, nchunks: int | None = None,
               host: bool | str = False, lean: bool = True) -> Schedule:
    """Plan allreduce, broadcast or reduce over packed spanning trees.

    Parameters
    ----------
    topo : nx.DiGraph
        The topology (not modified). GPUs outside ``ranks`` are not used as relays.
    ranks : tuple of str
        GPU node ids; schedule rank ``i`` is ``ranks[i]``.
    collective : str
        allreduce, broadcast or reduce.
    nbytes : int
        Message size (nccl-tests convention); bounds the chunk count from above.
    root : int
        Root rank of broadcast / reduce.
    inplace : bool
        Build for aliased input/output.
    nchunks : int, optional
        Chunks of the payload; default the smallest count whose integral shares keep 98% of
        the packing's rate with the pipeline fill counted, within :data:`MIN_CHUNK_BYTES` per
        chunk and about ``instruction_budget(n)`` per schedule (see :mod:`~.chunking`).
    host : bool
        Let tree edges between GPUs joined by a direct link move through host memory over
        PCIe (each way on its own for allreduce); ``"any"``: every GPU pair, as in
        :func:`~.forest.plan_forest`.
    lean : bool
        With ``host``: the least loaded of the optimal packings, else the LP's vertex
        (:func:`~.treesched.pack_rooted`, :func:`~.treesched.pack_both_ways`).

    Returns
    -------
    Schedule
        ``meta["trees"]`` lists ``[root rank, edges, first chunk, nchunk]`` per tree and
        ``meta["rate_gbps"]`` the packing rate.

    Raises
    ------
    PlanError
        Unsupported collective or bad root; NoFeasiblePlan if the GPUs are not connected.

    Examples
    --------
    >>> from collectx.topology import line
    >>> from collectx.schedule import verify
    >>> s = plan_blink(line(3, bw=100.0), ("GPU0", "GPU1", "GPU2"), "allreduce", 1 << 20,
    ...                nchunks=4)
    >>> verify(s).instructions > 0, s.meta_dict()["rate_gbps"]
    (True, 100.0)
    """
    n = len(ranks)
    check_args(collective, n, root, nchunks)
    if collective not in SUPPORTED:
        raise PlanError(f"blink plans {', '.join(SUPPORTED)}, not {collective}; use forest for "
                        f"allgather / reduce_scatter")
    ranks = tuple(ranks)
    if n == 1:
        return _single(collective, root, inplace)
    G = job_graph(topo, ranks)
    require_connected(G, ranks)
    if collective == "allreduce":
        packing, caps = pack_both_ways(G, ranks, host=host, lean=lean)
        units = _unit_mixes(packing, caps, ranks, nbytes, nchunks) \
            if host and lean and len(packing.trees) > 2 else []
        s = None
        # A chunk count asked for is one per instruction. Without host edges staggering lifted
        # no DGX-1 plan, and on dgx2 it made a losing candidate 0.3 s slower to simulate.
        stagger = STAGGER if host and not nchunks else 1
        if not units or n < UNITS_ONLY_FROM:
            counted = _allreduce_counts(packing, caps, nbytes, n, nchunks)
            s = _allreduce_layouts(packing, counted, ranks, root, inplace, host, topo, nbytes,
                                   stagger)
        s = _equal_units_or(s, units, ranks, root, inplace, topo, nbytes, stagger)
        unit = None if packing.balanced or host else pack_unit_spanning_trees(G, ranks)
        if unit is not None:
            # LP trees of unequal rates against fewer equal unit trees on their own lanes:
            # on mi250_16gcd three unit trees reach 0.82 of the reference where the LP's
            # trees reach 0.79, but with a lower packing rate, so the simulator decides.
            s = faster(s, _allreduce(unit, _allreduce_counts(unit, caps, nbytes, n, nchunks),
                                     ranks, root, inplace, own=True), topo, nbytes, ranks)
        return s
    return _rooted(G, topo, ranks, collective, nbytes, root, inplace, nchunks, host, lean)


def _rooted(G, topo, ranks, collective, nbytes, root, inplace, nchunks, host, lean) -> Schedule:
    """Broadcast / reduce over the trees of one root, lowered as :func:`_rooted_style` says;
    where two lowerings compete, the simulator decides."""
    packing, caps = pack_rooted(G, ranks, [ranks[root]], reverse=collective == "reduce",
                                host=host, lean=lean)
    style = _rooted_style(collective, packing)
    wait = _route_wait_us(G, ranks, packing)
    n = len(ranks)
    cands = [nchunks] if nchunks else _rooted_candidates(nbytes, n, packing, style, wait)
    args = (packing, caps, collective, nbytes, wait, not nchunks, ranks, root, inplace)
    s, counted = _rooted_plan(style, cands, *args)
    if style == "deep" and len(packing.trees) > 1:
        # Unequal trees of one root: a lane per tree and link, as for equal unit trees,
        # against lanes per link shared in pipeline order (dgx1v GPUs 0, 1, 3-7 broadcast:
        # 0.965 of the packing rate against 0.936; with host edges 0.866 against 0.724).
        s = faster(s, _lowered(collective, packing, counted, ranks, root, inplace, 1, True),
                   topo, nbytes, ranks)
    if collective == "broadcast" and style == "deep" and packing.staged and not nchunks:
        # Host edges pipeline each chunk through two PCIe copies, so the fill of the budget's
        # chunk count stays long: more chunks, lanes per link (one lane per tree won 1 of 21
        # such plans it lifted on DGX-1V), while the plan stays below WIDE_BELOW of its rate
        # and each count is faster than the one before (where 2x lost, 4x lifted no plan).
        for factor in WIDE_FACTORS:
            if rate_kept(s, topo, nbytes, ranks, packing.rate) >= WIDE_BELOW:
                break
            before = s
            s = faster(s, _rooted_plan(style, [factor * counted[0]], *args)[0], topo, nbytes,
                       ranks)
            if s is before:
                break
        if lean and n <= UNIT_BROADCAST_UP_TO and \
                rate_kept(s, topo, nbytes, ranks, packing.rate) < WIDE_BELOW:
            s = _broadcast_units_or(s, packing, caps, ranks, root, inplace, topo, nbytes)
        if lean and host is True and \
                rate_kept(s, topo, nbytes, ranks, packing.rate) < WIDE_BELOW:
            # the program's trees for linked pairs only: with host routes for every pair too
            # they added 0.003 to the full DGX-1P broadcast for 0.16 s more (0.95 s)
            s = _exact_broadcast_or(s, packing, caps, ranks, root, inplace, topo, nbytes)
    if style == "unit" and collective == "broadcast":
        # Paired pieces at the two largest counts: where a tree finishes varies by a percent
        # or so from one count to the next (16-GCD MI250: 0.955, 0.941, 0.947, 0.960 of the
        # bound at 480, 560, 640 and 720 chunks per tree), so one more simulation pays.
        paired = [nchunks] if nchunks else _rooted_candidates(nbytes, n, packing, "paired",
                                                              wait)
        for q in paired[-PAIRED_TRIED:]:
            s = faster(s, _rooted_plan("paired", [q], *args)[0], topo, nbytes, ranks)
    return s


def _broadcast_units_or(s, packing, caps, ranks, root, inplace, topo, nbytes) -> Schedule:
    """``s``, or the broadcast over the mix of equal trees (:func:`~.chunking.equal_units`,
    ``k`` of :data:`UNIT_TREES`) that keeps the most of the packing's rate, each tree on lanes
    of its own, where that simulates faster.

    The broadcast counterpart of :func:`_equal_units_or`, for deep trees with host edges that
    lag their packing rate even with more chunks: on the 15 DGX-1 broadcasts below 0.95 of the
    bound, the best mix reached 0.95 on 7 (DGX-1V GPUs 0, 1, 2, 4, 5, 7: 0.937 -> 0.967 with
    18 trees), each time fastest at :data:`UNIT_BROADCAST_CHUNKS` of 512, 1024 and 2048, and
    taking each packing's mix that keeps the most rate finds all 7.
    """
    mixes = most_kept(equal_unit_mixes(packing, caps, UNIT_TREES))
    if not mixes:
        return s
    return _faster_broadcast(s, *mixes[0], UNIT_BROADCAST_CHUNKS, ranks, root, inplace, topo,
                             nbytes)


def _exact_broadcast_or(s, packing, caps, ranks, root, inplace, topo, nbytes) -> Schedule:
    """``s``, or the broadcast over the fewest equal out-trees that keep
    :data:`~.exact_mixes.KEEP` of the packing's rate (:func:`~.exact_mixes.exact_rooted_mix`,
    counted edge by edge, not picked among the LP's columns), each on lanes of its own, with
    :data:`EXACT_BROADCAST_CHUNKS`, where that simulates faster."""
    for k, units in exact_rooted_mix(packing, caps, ranks, root):
        s = _faster_broadcast(s, k, units, EXACT_BROADCAST_CHUNKS, ranks, root, inplace, topo,
                              nbytes)
    return s


def _faster_broadcast(s, k, units, chunks, ranks, root, inplace, topo, nbytes) -> Schedule:
    """``s``, or the broadcast of ``k`` equal trees ``units`` on lanes of their own, with
    ``chunks`` rounded up to whole chunks per tree (within :data:`MIN_CHUNK_BYTES` a chunk),
    where that simulates faster."""
    most = max(1, int(nbytes // MIN_CHUNK_BYTES))
    q = min(k * -(-chunks // k), max(k, most // k * k))
    counted = (q, largest_remainder(units, q))
    return faster(s, _lowered("broadcast", units, counted, ranks, root, inplace, 1, True),
                  topo, nbytes, ranks)


def _rooted_plan(style, cands, packing, caps, collective, nbytes, wait, balance, ranks, root,
                 inplace) -> tuple[Schedule, tuple]:
    """(schedule, (chunks, counts)): ``packing`` lowered in ``style``, in the first of the
    candidate chunk counts that keeps the rate (see :func:`~.chunking.chunk_counts`);
    ``balance``: equal trees get chunks by depth, so that they all end together."""
    full_us = nbytes / (packing.rate * 1e3) if packing.rate > 0 else 0.0
    nch, counts = chunk_counts(packing, caps, cands, latency=wait / full_us
                               if style == "chain" and full_us > 0 else None)
    own = style in ("unit", "paired")
    if own and balance:
        counts = depth_balanced_counts(packing.trees, nch)
    sublanes = {"staggered": 2, "chain": 1, "deep": SUBLANES, "unit": 1, "paired": 2}[style]
    counted = (nch, counts)
    return _lowered(collective, packing, counted, ranks, root, inplace, sublanes, own), counted


def _lowered(collective, packing, counted, ranks, root, inplace, sublanes, own,
             tree_lanes=1, stagger=1) -> Schedule:
    """``collective`` over ``packing``'s trees with ``counted`` = (chunks, counts):
    ``sublanes`` lanes per link shared in pipeline order, or with ``own`` lanes of its own for
    every tree, up to ``tree_lanes`` per link (see :meth:`TreeEmitter._tree_keys`); with
    ``stagger`` > 1 on that many times the chunks, in runs out of step (see
    :class:`TreeEmitter`)."""
    nch, counts = counted
    if stagger > 1:   # the same bytes per instruction, in runs of `stagger` chunks
        nch, counts = nch * stagger, [(t, c * stagger) for t, c in counts]
    shares = _shares(counts, {g: i for i, g in enumerate(ranks)}, up=collective == "reduce")
    b = ScheduleBuilder(collective, len(ranks), nch, root=root, inplace=inplace,
                        algorithm="blink")
    em = TreeEmitter(b, sublanes, tree_lanes=tree_lanes, stagger=stagger)
    _EMIT[collective](b, em, shares, sublanes == 2 and collective == "broadcast", own)
    return _finish(b, em, shares, packing)


plan_blink.collectives = SUPPORTED


def _shares(counts, at: dict, up: bool = False) -> list:
    return [Share.of(t, at[t.root], tuple((at[p], at[c]) for p, c in t.edges), run, up)
            for runs in runs_by_group(counts, lambda g: 0).values() for t, run in runs]


def _allreduce_counts(packing, caps, nbytes, n, nchunks) -> tuple[int, list]:
    """:func:`~.chunking.chunk_counts` of an allreduce packing used up and down."""
    scale = 2 if n <= HOST_CHUNKS_UP_TO and packing.staged else 1
    cands = [nchunks] if nchunks else _candidates("allreduce", nbytes, n, scale)
    return chunk_counts(packing, caps, cands, passes=2)


def _allreduce(packing, counted, ranks, root, inplace, own=False, tree_lanes=1,
               stagger=1) -> Schedule:
    """Reduce up and broadcast down ``packing``'s trees (:func:`_lowered`): three lanes per
    link, or lanes of its own for every tree (``stagger`` serves those only)."""
    return _lowered("allreduce", packing, counted, ranks, root, inplace, 1 if own else SUBLANES,
                    own, tree_lanes, stagger if own else 1)


def _allreduce_layouts(packing, counted, ranks, root, inplace, host, topo, nbytes,
                       stagger=1) -> Schedule:
    """:func:`_allreduce` on whichever lane layout the simulator finishes first.

    Trees of unequal rates (and PCIe-paced host hops): on many DGX-1 allocations a lane per
    tree keeps a slow tree from holding up the others' chunks on a shared lane (GPUs 0-4 of
    dgx1v with host edges: 0.94 of the reference against 0.81; GPUs 0-4, 6, 7 on NVLink alone:
    108.6 GB/s busbw against 92.1), on others sharing lanes wins. Trees of unequal chunk
    counts may also take lanes in proportion (up to :data:`TREE_LANES` each): on NVLink-only
    packings of 4-7 dgx1v GPUs that won 24 of 84 and one lane per tree beat it 5 times, by
    0.005 of the packing rate at most, so only trees with host edges try both.
    """
    s = _allreduce(packing, counted, ranks, root, inplace)
    if len(packing.trees) < 2:
        return s
    sizes = [n for _, n in counted[1]]
    unequal = max(sizes) >= 1.5 * min(sizes)
    for lanes in ((1, TREE_LANES) if host else (TREE_LANES,)) if unequal else (1,):
        s = faster(s, _allreduce(packing, counted, ranks, root, inplace, own=True,
                                 tree_lanes=lanes, stagger=stagger), topo, nbytes, ranks)
    return s


def _unit_mixes(packing, caps, ranks, nbytes: int, nchunks) -> list:
    """``[(units, (chunks, counts), lead)]``: the allreduce packings of ``k`` trees of one
    equal rate (:func:`~.chunking.equal_units`, one per ``k`` of :data:`ALLREDUCE_UNIT_TREES`)
    with the best estimated rate after pipeline fill, at most :data:`UNITS_SIMULATED` of them
    (on 3 ranks :data:`UNITS_SIMULATED_3`, on 7 one), best first; then, where none of those
    mixes keeps :data:`EXACT_BELOW` of the packing's rate, the fewest equal trees the integer
    program of :mod:`~.exact_mixes` finds, in place of one of those mixes (of all of them where
    they keep :data:`EXACT_ALONE` more of the rate). ``lead``: the fraction of the best plan's
    time a mix must beat (1, or :data:`EXACT_LEAD` for the program's).

    The fill estimate (:func:`~.chunking.chunk_counts`' for the deepest tree's chunks) is
    weighed by :data:`FILL_WEIGHT` (:data:`FILL_WEIGHT_ONE` on 7 ranks). Of the 132 DGX-1
    allocations below 0.95 of the reference before mixes of up to 28 trees, 54 have a mix
    that simulates at 0.95 or more; simulating
    the best-estimated mix of each packing found one for 40 of them with the fill counted
    whole, for 42 with half of it (and for 46 with the two best).
    """
    n = len(ranks)
    scale = UNIT_CHUNKS if n <= UNIT_CHUNKS_UP_TO else 1
    one = HOST_CHUNKS_UP_TO < n <= UNIT_CHUNKS_UP_TO    # simulate the best-estimated mix only
    weight = FILL_WEIGHT_ONE if one else FILL_WEIGHT
    q = nchunks or min(scale * max(_candidates("allreduce", nbytes, n, 2)),
                       max(1, int(unit_bytes("allreduce", nbytes, n) // MIN_CHUNK_BYTES)))
    scored = []
    mixes = equal_unit_mixes(packing, caps, ALLREDUCE_UNIT_TREES)
    for k, units in mixes:
        counts = largest_remainder(units, q)
        fill = max((2 * t.depth() - 1) / c for t, c in counts)
        scored.append((units.rate / (1 + weight * fill), k, units, (q, counts)))
    scored.sort(key=lambda x: (-x[0], x[1]))
    most = UNITS_SIMULATED_3 if n <= 3 else 1 if one else UNITS_SIMULATED
    kept = max((units.rate for _, units in mixes), default=0.0)
    exact = []
    if kept < EXACT_BELOW * packing.rate:
        exact = [(units, (q, largest_remainder(units, q)), EXACT_LEAD)
                 for _, units in exact_equal_mixes(packing, caps, ranks, kept)]
    if exact:   # they take a column mix's simulation, or every one where they keep far more
        most = 0 if exact[0][0].rate >= kept + EXACT_ALONE * packing.rate else max(1, most - 1)
    return [(units, counted, 1.0) for _, _, units, counted in scored[:most]] + exact


def _equal_units_or(s, units: list, ranks, root, inplace, topo, nbytes,
                    stagger=1) -> Schedule:
    """``s`` (None: no plan yet), or an allreduce over a few trees of one equal rate from
    ``units`` (:func:`_unit_mixes`) where that simulates faster (by its ``lead``).

    The LP's optimum mixes many trees of unequal rates (with host edges on DGX-1: often 10 or
    more, at rates 15x apart), but a link shares its bandwidth equally among the transfers on
    it, so they do not get their planned rates where they meet: some links run dry while
    others fall behind. :func:`~.chunking.equal_units` picks ``k`` equal trees from the
    packing, each on lanes of its own; a mix is simulated while its packing rate could beat
    the best plan so far. Over the 247 DGX-1V allocations of 2-8 GPUs, ``k`` up to 12 on 1024
    chunks lifted 78 allreduce plans and none got slower (the worst from 0.754 to 0.841 of
    the reference). Up to 28 trees on 2048 chunks, and lanes enough for each (64 per rank),
    lifted the DGX-1V / DGX-1P allocations below 0.95 from 65 / 67 to 43 / 48: the more equal
    trees, the closer a mix of them keeps to the LP's rate (DGX-1P GPUs 0, 2, 3, 4, 7: 0.83 of
    it with 8-12 trees, 0.97 with 22, simulated at 0.951 of the reference against 0.862).
    """
    best_us = float("inf")
    if s is not None:
        mine = simulated(s, topo, nbytes, ranks)
        if mine is None:
            return s   # no simulator to compare with
        best_us = mine.time_us
    for packing, counted, lead in units:
        if nbytes / (packing.rate * 1e3) >= best_us * lead:
            continue   # the packing's own rate cannot beat the best plan so far
        plan = _allreduce(packing, counted, ranks, root, inplace, own=True, stagger=stagger)
        found = simulated(plan, topo, nbytes, ranks)
        if found is None:
            return plan   # no simulator and no plan yet: the best-estimated mix
        if found.time_us < best_us * lead:
            s, best_us = plan, found.time_us
    return s


def _finish(b: ScheduleBuilder, em: TreeEmitter, shares, packing) -> Schedule:
    """Append the emitted items, record the trees and the packing rate, stage host edges."""
    em.flush()
    # Chunks by depth can leave a tree of a small message without any chunk: it carries nothing.
    b.meta("trees", [[s.root, [list(e) for e in s.edges], s.chunks[0], len(s.chunks),
                      *s.host_record()] for s in shares if s.chunks])
    b.meta("rate_gbps", packing.rate)
    return b.build()


_OUT = chunk_refs("output")
_IN = chunk_refs("input")


def _emit_allreduce(b, em, shares, staggered=False, own=False):
    done = em.reduce(shares, contrib=_IN, result=_OUT, own_lanes=own)
    em.broadcast(shares, src=_OUT, dst=_OUT, after=done, own_lanes=own)


def _emit_broadcast(b, em, shares, staggered=False, own=False):
    if not b.inplace:   # one rank-local copy: per chunk, it was a chain of nchunks steps
        em.self_copy(b.root, Ref(b.root, "output", 0, b.nchunks),
                     Ref(b.root, "input", 0, b.nchunks))
    if staggered:
        em.staggered_broadcast(shares, src=_IN, dst=_OUT, own_lanes=own)
    else:
        em.broadcast(shares, src=_IN, dst=_OUT, own_lanes=own)


def _emit_reduce(b, em, shares, staggered=False, own=False):
    em.reduce(shares, contrib=_IN, result=_OUT, own_lanes=own)


_EMIT = {"allreduce": _emit_allreduce, "broadcast": _emit_broadcast, "reduce": _emit_reduce}


def _candidates(collective, nbytes, n, scale: int = 1) -> list[int]:
    """Chunk counts within MIN_CHUNK_BYTES per chunk and ``scale`` instruction budgets."""
    most = max(1, min(int(unit_bytes(collective, nbytes, n) // MIN_CHUNK_BYTES),
                      scale * instruction_budget(n, MAX_INSTRUCTIONS) // (2 * (n - 1))))
    sizes = CANDIDATE_CHUNKS + (WIDE_CHUNKS if n > 8 else ())
    return [c for c in sizes if c <= most] or [1]


def _rooted_style(collective, packing) -> str:
    """How a broadcast / reduce packing is lowered.

    * ``staggered`` (two-level broadcast trees): pieces of two chunks on two lanes per edge,
      half a piece out of step (:meth:`~.treesched.TreeEmitter.staggered_broadcast`): the
      route latency before each piece is hidden, so chunks can be small and the fill short;
    * ``chain`` (two-level reduce trees): one lane per edge, so that a relay's first chunk
      arrives alone, and the count that balances fill against per-chunk waits;
    * ``deep``: several lanes per edge (the waits of a long chain would add up) and the
      deepest pipeline that keeps the rate (the fill of ~10 levels dominates);
    * ``unit`` (deep trees of one equal rate, ``Packing.balanced``): lanes of its own for
      every tree on each link (see :meth:`~.treesched.TreeEmitter.broadcast`'s
      ``own_lanes``), so each tree gets the share it was planned with; on mi250_16gcd
      broadcast reached 0.92 of the bound against 0.88 with three lanes per link shared by
      the trees, reduce 0.93 against 0.88.
    * ``paired``, tried beside ``unit`` for broadcast (:func:`_rooted`): the same lanes of
      each tree's own, two of them, moving staggered pieces. On one lane each chunk's hop
      waits out the route latency: the 16-GCD MI250 broadcast was 0.92 of the bound, 0.965
      with the latency taken out, and finer chunks only added waits (0.90 with twice as
      many). Pieces halve the instructions, so the budget takes twice the chunks: 0.953.
    """
    if max(t.depth() for t in packing.trees) > 2:
        return "unit" if packing.balanced else "deep"
    return "staggered" if collective == "broadcast" else "chain"


def _rooted_candidates(nbytes, n, packing, style, wait_us) -> list[int]:
    """Chunk counts for broadcast / reduce: whole chunks per tree (equal trees stay equal),
    within :data:`MIN_CHUNK_BYTES` per chunk and the instruction budget.

    Staggered pieces only hide the latency when a piece takes longer than it: the count is
    the largest whose chunks take at least ``wait_us`` at a tree's rate (two per piece).
    """
    ntrees = max(len(packing.trees), 1)
    paired = style == "paired"   # one instruction per two chunks and tree edge
    if style in ("deep", "unit", "paired"):
        budget = instruction_budget(n, MAX_ROOTED_INSTRUCTIONS) // n * (2 if paired else 1)
    elif style == "chain":
        budget = SHALLOW_INSTRUCTIONS // n
    else:
        budget = 2 * SHALLOW_INSTRUCTIONS // n
    most = max(1, min(int(nbytes // MIN_CHUNK_BYTES), budget))
    per_tree = PER_TREE_CHUNKS + (PAIRED_CHUNKS if paired else ())
    out = [m * ntrees for m in per_tree if m * ntrees <= most] or [1]
    if style != "staggered":
        return out
    tree_rate = packing.rate / ntrees * 1e3          # bytes per microsecond
    hidden = [q for q in out if nbytes / q >= wait_us * tree_rate]
    return [max(hidden)] if hidden else out[:1]


def _route_wait_us(G, ranks, packing) -> float:
    """The longest route latency (us) of a tree edge: what a lane waits before each chunk
    it pulls starts to move."""
    from ..schedule._routes import routes_for
    table = routes_for(G)
    at = {g: i for i, g in enumerate(ranks)}
    waits = [max(lat for _, lat, _ in table.spread(p, c))
             for t in packing.trees for p, c in t.edges if p in at and c in at]
    return max(waits, default=0.0)


def _single(collective: str, root: int, inplace: bool) -> Schedule:
    b = ScheduleBuilder(collective, 1, 1, root=root, inplace=inplace, algorithm="blink")
    if not inplace:
        b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    return b.build()
