"""The packing program: its LP reaches the bounds, its rounding gives equal arborescences that
fit the links, and its trees lower to schedules that verify on any machine."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import numpy as np
import pytest

import collectx.topology as T
from collectx.planner import plan, program as P
from collectx.planner.api import allocation
from collectx.planner.bounds import bounds
from collectx.planner.trees import Pipeline, plan_blink, plan_forest
from collectx.schedule import simulate, verify
from collectx.schedule.ir import GPU_LANES
from collectx.topology.view import job_graph

import _dumps as dumps

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce")


def packed(topo, collective, gpus=None, host=False):
    ranks, view = allocation(topo, gpus)
    p = P.problem(job_graph(view, ranks), ranks, collective, host=host)
    return p, P.fractional(p), view, ranks


def busbw(collective, n, rate):
    """The busbw a packing's per-group rate gives (trees used both ways carry every byte)."""
    return {"allgather": n - 1, "reduce_scatter": n - 1, "broadcast": 1, "reduce": 1,
            "allreduce": 2 * (n - 1) / n}[collective] * rate


@pytest.mark.parametrize("name", ["dgx1v", "pcie_gen4_8gpu", "dgx_a100", "mi300x"])
def test_allgather_lp_reaches_the_bound_with_the_hardware_routes(name):
    G = T.load(name)
    p, lp, _, _ = packed(G, "allgather", host=True)
    assert busbw("allgather", 8, lp.rate) == pytest.approx(bounds(G, "allgather").bound_busbw,
                                                           rel=1e-6)


def test_broadcast_lp_reaches_the_roots_links_and_with_host_ways_the_bound():
    G = T.load("dgx1v")
    _, nvlink, _, _ = packed(G, "broadcast")
    _, staged, _, _ = packed(G, "broadcast", host=True)
    assert nvlink.rate == pytest.approx(150.0)          # GPU0's six NVLinks, all busy
    assert staged.rate == pytest.approx(bounds(G, "broadcast").bound_busbw)


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter"])
def test_among_optimal_packings_the_lp_keeps_the_shallowest(collective):
    # On a full mesh every arborescence loads as many links, and column generation used to
    # stop at chains up to four hops deep: each root's star carries the same rate in one hop.
    ranks, view = allocation(T.fully_connected(5), None)
    p, lp = P.solved(view, ranks, collective)
    assert lp.rate == pytest.approx(bounds(view, collective).bound_busbw / (len(ranks) - 1))
    assert {t.depth() for t in lp.trees} == {1}


def test_a_line_of_three_packs_trees_both_ways_at_its_link_rate():
    p, lp, _, _ = packed(T.line(3, bw=100.0), "allreduce")
    assert lp.rate == pytest.approx(100.0)   # busbw 133: beyond reduce-scatter + allgather


ROUNDED = [("dgx1v", [0, 1, 2, 5], "allreduce"), ("dgx1v", [0, 1, 2, 5], "allgather"),
           ("dgx1p", None, "broadcast"), ("mi250_16gcd", [0, 1, 4, 5, 8, 9], "reduce_scatter")]


@pytest.mark.parametrize("name, gpus, collective", ROUNDED)
def test_rounding_gives_k_equal_arborescences_per_group_within_the_links(name, gpus,
                                                                           collective):
    p, lp, _, _ = packed(T.load(name), collective, gpus, host=True)
    rounding = P.Rounding(p, lp)
    _assert_equal_trees(p, lp, rounding, rounding.solve_all([(2, np.inf)])[0], 2)


@pytest.mark.parametrize("name, gpus, collective", ROUNDED + [
    ("pcie_gen4_8gpu", [0, 1, 6, 7], "broadcast")])   # some of the LP's trees are whole columns
def test_the_lps_trees_dealt_out_are_k_equal_arborescences_within_the_links(name, gpus,
                                                                             collective):
    # What the integer programs must beat: every count's dealt trees split without a program.
    p, lp, _, _ = packed(T.load(name), collective, gpus, host=True)
    rounding = P.Rounding(p, lp)
    for K in (1, 3, 7):
        _assert_equal_trees(p, lp, rounding, rounding.seeded(K), K)


def _assert_equal_trees(p, lp, rounding, x, K):
    trees = rounding.trees(x, K)
    n = len(p.gpus)
    assert {g: sum(t.group == g for t in trees) for g in range(len(p.groups))} == \
        dict.fromkeys(range(len(p.groups)), K)
    load = np.zeros(len(p.caps))
    for t in trees:
        assert t.rate == pytest.approx(rounding.rate(x, K) / K)
        assert len(t.edges) == n - 1 and t.edges[0][0] == t.root
        assert {c for _, c in t.edges} == set(range(n)) - {t.root}      # spans, one parent
        for path in t.paths:
            for link, w in path:
                load[link] += w * t.rate
    assert np.all(load <= np.asarray(p.caps) * (1 + 1e-9))
    assert rounding.rate(x, K) <= lp.rate * (1 + 1e-9)


def test_a_batch_of_counts_shares_the_rows_it_finds_and_rounds_each_count(monkeypatch):
    # A forest on eight GPUs: Edmonds' rows are found as they bind. Each count of one batch
    # rounds into its own equal trees, its first integer program over the rows every count's
    # relaxation found, and a count whose relaxation fails gets no integer program.
    p, lp, _, _ = packed(T.load("dgx1v"), "allgather", None, host=True)
    rounding = P.Rounding(p, lp)
    assert not rounding.enumerated
    known, rows, milp = len(rounding.sets), [], P.milp
    monkeypatch.setattr(P, "milp", lambda c, **kw: "integrality" in kw and rows.append(
        (bool(np.any(kw["integrality"])), kw["constraints"].A.shape[0])) or milp(c, **kw))
    asks = [(1, np.inf), (2, np.inf), (3, np.inf), (2, 1.0 / lp.rate)]   # twice the LP's rate
    xs = rounding.solve_all(asks)
    relaxed = [n for integral, n in rows if not integral]
    first = rows.index(next(r for r in rows if r[0]))
    assert all(not integral for integral, _ in rows[:first])   # every relaxation first
    assert min(n for _, n in rows[first:]) >= max(relaxed)
    for (K, _), x in zip(asks[:3], xs):
        _assert_equal_trees(p, lp, rounding, x, K)
    assert xs[3] is None and len(rounding.sets) > known


def test_rounding_refuses_a_load_it_cannot_keep():
    p, lp, _, _ = packed(T.load("dgx1v"), "broadcast", [0, 1, 2, 5])
    rounding = P.Rounding(p, lp)
    assert rounding.solve_all([(1, 0.5 / lp.rate)])[0] is None   # twice the LP's rate: impossible


@pytest.mark.parametrize("name, gpus, collective, host, refuses", [
    ("dgx1v", None, "allreduce", True, True), ("dgx1v", None, "broadcast", False, True),
    ("dgx1p", [0, 1, 2, 5], "broadcast", True, True),
    ("dgx1v", [1, 2, 4, 7], "allgather", True, False),   # every count rounds the LP exactly
    ("mi250_16gcd", [0, 1, 4, 5], "allgather", False, True),
    ("dgx1v", None, "allgather", True, True)])   # Edmonds' rows found as they bind
def test_the_whole_transfer_cut_refuses_only_counts_the_integer_program_cannot_find(
        monkeypatch, name, gpus, collective, host, refuses):
    # A link whose loads are whole transfers takes a whole number of them: the LP with that
    # cut (Rounding._short) refuses tree counts without their integer programs, and must
    # never refuse one that the integer program would have found.
    p, lp, _, _ = packed(T.load(name), collective, gpus, host=host)
    rounding = P.Rounding(p, lp)
    short, kept = [], []
    for K in range(1, 17):
        for most in (K / lp.rate * 1.001, K / lp.rate * 1.02, K / lp.rate * 1.1):
            with monkeypatch.context() as m:
                m.setattr(rounding, "_short", lambda *a: False)
                found = rounding.solve_all([(K, most)])[0]
            refused = rounding._short(K, most, _bounds(rounding, K, most), rounding.sets)
            assert not (refused and found is not None), (K, most)
            short.append(refused)
            kept.append(found is not None)
    assert any(kept) and any(short) == refuses


def _bounds(rounding, K, most):
    C, H = len(rounding.cols), len(rounding.wholes)
    low, high = ((np.floor(rounding.scaled * K + 1e-9), np.ceil(rounding.scaled * K - 1e-9))
                 if len(rounding.p.groups) > 1 else (np.zeros(C + H), np.full(C + H, K)))
    return P.Bounds(np.r_[low[:C], np.zeros(C), low[C:], 0.0],
                    np.r_[high[:C], np.full(C, K), high[C:], most])


def _random_fabric(seed, chords=0.4):
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    G = T.ring(n, bw=25.0)
    for a, b in itertools.combinations(range(n), 2):
        if rng.random() < chords:
            T.add_link(G, f"GPU{a}", f"GPU{b}", "nvlink", rng.choice((25.0, 50.0)))
    return G, n


@pytest.mark.parametrize("seed", range(6))
def test_counts_hold_edmonds_rows_on_random_fabrics(seed):
    G, n = _random_fabric(seed)
    p, lp, _, _ = packed(G, "broadcast")
    rounding = P.Rounding(p, lp)
    x = rounding.solve_all([(3, np.inf)])[0]
    mult = rounding.multiplicity(x, 0)
    for v in range(1, n):
        flow = nx.maximum_flow_value(nx.DiGraph([(a, b, {"capacity": int(mult[a, b])})
                                                 for a in range(n) for b in range(n)
                                                 if mult[a, b]]), 0, v)
        assert flow >= 3


@pytest.mark.parametrize("topo, star", [
    (T.switch(4, bw=25.0), 25.0 / 3),   # the root's one link to the switch carries 3 copies
    (T.fully_connected(4, bw=25.0), 25.0),   # a link of its own to each GPU
    (T.line(3, bw=25.0), 0.0)])   # GPU2 is two hops from the root: no star at all
def test_the_star_rate_is_what_the_roots_links_carry_one_level_deep(topo, star):
    p, lp, _, _ = packed(topo, "broadcast")
    assert P.Rounding(p, lp).star_rate() == pytest.approx(star)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("collective", ["broadcast", "allgather", "allreduce"])
def test_no_trees_one_level_deep_are_faster_than_the_star_rate(seed, collective):
    p, lp, _, _ = packed(_random_fabric(seed, chords=0.8)[0], collective, host=True)
    rounding = P.Rounding(p, lp)
    stars = {}   # per group and GPU, the columns of the root's arc to it, unstaged
    for c, (g, (a, b), k) in enumerate(rounding.cols):
        way = p.ways[p.groups[g][1]][a, b][k]
        if a == p.groups[g][0] and not (way.down or way.up):
            stars.setdefault((g, b), []).append(c)
    if len(stars) < len(p.groups) * (rounding.n - 1):
        assert rounding.star_rate() == 0.0
        return
    rng = random.Random(seed)
    for _ in range(20):   # one way per arc: each group's star
        x = np.zeros(len(rounding.cols) + len(rounding.wholes), dtype=np.int64)
        for cols in stars.values():
            x[rng.choice(cols)] += 1
        assert rounding.rate(x, 1) <= rounding.star_rate() * (1 + 1e-9)


@pytest.mark.parametrize("name, collective", [("dgx1v", "broadcast"), ("dgx1p", "allgather")])
def test_no_count_is_rounded_that_must_beat_the_lps_rate(monkeypatch, name, collective):
    asked, solve_all = [], P.Rounding.solve_all
    monkeypatch.setattr(P.Rounding, "solve_all",
                        lambda self, asks: asked.extend(asks) or solve_all(self, asks))
    G = T.load(name)
    planner = plan_blink if collective == "broadcast" else plan_forest
    planner(G, tuple(T.gpus(G)), collective, 1 << 30, host=True)
    lp = packed(G, collective, host=True)[1]
    assert asked and all(K / most <= lp.rate * (1 + 1e-6) for K, most in asked)


def test_one_roots_counts_stop_at_the_gpu_lanes_where_host_staging_doubles_them(monkeypatch):
    asked, solve_all = [], P.Rounding.solve_all
    monkeypatch.setattr(P.Rounding, "solve_all",
                        lambda self, asks: asked.extend(asks) or solve_all(self, asks))
    # a switched machine whose broadcast rounds count after count up to the lanes it may take
    G = dumps.load("hgx_a100_8gpu_5nic_bond_nccl_topo.xml")
    p = packed(G, "broadcast", host=True)[0]
    assert P.most_trees(p) > GPU_LANES   # the CPU executor's lanes hold more trees
    plan_blink(G, tuple(T.gpus(G)), "broadcast", 1 << 30, host=True)
    assert asked and max(K for K, _ in asked) <= GPU_LANES


def test_centred_trees_keep_their_edges_and_staging():
    p, lp, _, _ = packed(T.load("dgx1v"), "allreduce", [0, 1, 2, 5], host=True)
    rounding = P.Rounding(p, lp)
    x = rounding.solve_all([(4, np.inf)])[0]
    for t in rounding.trees(x, 4):
        c = P.centred(t)
        same = {frozenset(e): (i in t.staged, i in t.staged_up) for i, e in enumerate(t.edges)}
        for i, (a, b) in enumerate(c.edges):
            down, up = i in c.staged, i in c.staged_up
            was = same[frozenset((a, b))]
            flipped = (a, b) not in t.edges
            assert (down, up) == (was[::-1] if flipped else was)


@pytest.mark.parametrize("gen", ["ring", "fully_connected", "switch", "line"])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_packed_trees_verify_on_toy_topologies(gen, n, collective):
    G = getattr(T, gen)(n)
    ranks = tuple(T.gpus(G))
    planner = plan_forest if collective in ("allgather", "reduce_scatter") else plan_blink
    for inplace in (False, True):
        s = planner(G, ranks, collective, 1 << 20, root=n - 1, inplace=inplace)
        assert verify(s).instructions == s.n_instructions


@pytest.mark.parametrize("name", ["dgx1v", "dgx1p", "dgx2", "dgx_a100", "mi250_16gcd",
                                  "pcie_gen4_8gpu"])
def test_forest_allreduce_verifies_and_stays_under_the_ceiling(name):
    G = T.load(name)
    ranks, view = allocation(G, [0, 1, 4, 5, 8, 9] if name == "mi250_16gcd" else list(range(6)))
    s = plan_forest(view, ranks, "allreduce", 1 << 26, host=True)
    assert verify(s).instructions == s.n_instructions
    b = bounds(view, "allreduce", gpus=list(ranks))
    assert simulate(s, view, 1 << 26, ranks=list(ranks)).busbw_GBps <= 1.001 * b.ceiling_busbw


def test_forced_chunks_are_the_schedules_chunks():
    ranks, view = allocation(T.load("dgx1v"), [0, 1, 2, 5])
    assert plan_blink(view, ranks, "broadcast", 1 << 24, nchunks=7).nchunks == 7
    assert plan_forest(view, ranks, "allgather", 1 << 24, nchunks=9).nchunks == 9
    assert plan_forest(view, ranks, "allreduce", 1 << 24, nchunks=8).nchunks == 8


def test_pipelines_deepen_with_the_message_and_stop_at_the_chunk_size():
    p, lp, _, _ = packed(T.load("dgx1v"), "broadcast", [0, 1, 2, 5])
    big, small = Pipeline(p, 1 << 30), Pipeline(p, 1 << 20)
    assert big.chunks(lp) > small.chunks(lp) >= 1
    assert small.chunks(lp) * len(lp.trees) <= (1 << 20) // (64 << 10)


def test_packed_trees_are_the_plan_on_an_allocation_without_an_nvlink_ring():
    # DGX-1V GPUs 0, 1, 2, 5: no NVLink ring exists; rings fall back to PCIe there.
    p = plan(T.load("dgx1v"), "allreduce", 1 << 30, gpus=[0, 1, 2, 5], verify=False)
    assert p.algorithm.startswith("blink") and p.efficiency >= 0.95


def test_a_gpu_staging_one_chunk_for_several_children_uploads_it_once():
    # A broadcast tree through the root's host memory: the root copies each chunk into it
    # once, and every other GPU reads it from there. Counted per child, the upload would
    # carry n - 1 times the rate; the emitter shares the copy, and so must the program.
    G = dumps.load("hgx_h100_nccl_topo.xml")
    p, lp, _, _ = packed(G, "broadcast", host=True)
    best = {e: 0 for e in p.ways["down"]}
    stars = P.host_stars(p, 0, best)
    star = next(t for t in stars if all(a == 0 for a, _ in t.edges))
    assert len(star.staged) == 7 and P.shares_uploads(p, star)
    use = P.use_of(p, star)
    for link, w in p.uploads[0]:
        assert use[link] == pytest.approx(w)   # once, not seven times
    # a group per root (allgather) counts no shared copies (see _staged_children)
    q, _, _, _ = packed(G, "allgather", host=True)
    assert not P.host_stars(q, 0, {e: 0 for e in q.ways["down"]})


def test_broadcast_over_a_switch_adds_host_memory_fanned_out_once():
    # NVLink alone carries 450 of the 513 GB/s a broadcast can get on this HGX H100; the rest
    # is PCIe, reached through host memory that one copy fills for every GPU.
    G = dumps.load("hgx_h100_nccl_topo.xml")
    p = plan(G, "broadcast", 1 << 30, verify=False)
    assert p.schedule.uses_host and p.efficiency > 450 / 513 + 0.03


def test_the_lps_own_trees_join_where_every_rounding_loses_more_than_fill():
    # Eight MI50s in two xGMI rings without host staging: 64 lanes hold 8 trees per root, and
    # the best 8 equal trees keep 0.97 of the LP's rate; the LP's own trees (2-4 per root),
    # each dealt chunks by its rate, fit and simulate faster.
    G = T.load(dumps.REAL / "mi50_8gpu_2xgmi_rings_4numa_2nic_rccl_topo.xml")
    gpus = tuple(T.gpus(G))
    p, lp = P.solved(G, gpus, "allgather")
    pipe = Pipeline(p, (1 << 30) / len(gpus))
    pipe.fit(lp)
    kept = P.equal_trees(p, lp, pipe, keep=2)
    assert kept[-1] is lp and max(k.rate for k in kept[:-1]) < lp.rate * (1 - P.FILL)
    assert plan(G, "allgather", 1 << 30, verify=False, host_relays=False).efficiency > 0.97
