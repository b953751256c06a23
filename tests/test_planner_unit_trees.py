"""Edge-disjoint unit-rate broadcast trees (Edmonds/Lovász) on fabrics of whole xGMI lanes."""

from __future__ import annotations

import numpy as np
import pytest

import collectx.topology as topo
from collectx.planner import plan
from collectx.planner import integral_trees
from collectx.planner.blink import plan_blink
from collectx.topology.view import LinkIndex, job_gpus, job_graph, simulator_routes
from collectx.planner.integral_trees import (depth_balanced_counts, disjoint_arborescences,
                                             lane_counts, pack_unit_spanning_trees,
                                             pack_unit_trees, spanning_unit_trees)
from collectx.schedule import simulate, verify

MI250_BROADCAST_FLOOR = 0.945  # measured 0.953 at 1 GiB in paired pieces (one lane per tree:
                               # 0.921; LP trees: 0.786)
MI250_REDUCE_FLOOR = 0.90      # measured 0.923 (LP trees: 0.752)
MI250_ALLREDUCE_FLOOR = 0.95   # measured 0.975 of the reference (forest, 512 chunks per root,
                               # reductions on three lanes per link; two: 0.939)
MI250_REDUCE_SCATTER_FLOOR = 0.93   # measured 0.940 on 512 chunks, four reduction lanes (0.850 on 128)


def _check_trees(mult, root, trees):
    n = len(mult)
    used = np.zeros_like(mult)
    for edges in trees:
        reached = {root}
        for p, c in edges:
            assert p in reached and c not in reached
            reached.add(c)
            used[p, c] += 1
        assert reached == set(range(n))
    assert (used <= mult).all()


def test_disjoint_arborescences_small_multigraph():
    # a triangle with doubled arcs out of the root: two unit trees from 0
    mult = np.array([[0, 2, 1], [1, 0, 1], [1, 1, 0]], dtype=np.int32)
    trees = disjoint_arborescences(mult, 0, 2)
    assert trees is not None and len(trees) == 2
    _check_trees(mult, 0, trees)
    assert disjoint_arborescences(mult, 0, 3) is None


@pytest.mark.parametrize("seed", range(60))
def test_arborescences_by_vertex_sets_match_max_flows(seed, monkeypatch):
    # Lovász's test over every vertex set at once must pick the very arcs the max-flow
    # version picks (the plans of small fabrics must not change with the faster test)
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(3, 9)), int(rng.integers(1, 6))
    mult = rng.integers(0, 4, size=(n, n)).astype(np.int32)
    np.fill_diagonal(mult, 0)
    root = int(rng.integers(0, n))
    by_sets = disjoint_arborescences(mult, root, k)
    monkeypatch.setattr(integral_trees, "MOST_SET_VERTICES", 0)
    assert disjoint_arborescences(mult, root, k) == by_sets
    if by_sets is not None:
        _check_trees(mult, root, by_sets)


def test_mi250_unit_trees_reach_the_maxflow():
    G = topo.load("mi250_16gcd")
    ranks = job_gpus(G)
    J = job_graph(G, ranks)
    index = LinkIndex.of(J)
    routes = simulator_routes(J, index, ranks)
    unit, mult, _ = lane_counts(index, ranks, routes)
    assert unit == pytest.approx(50.0)
    packing = pack_unit_trees(index, ranks, ranks[0], routes, 300.0)
    assert packing is not None and packing.rate == pytest.approx(300.0)
    assert len(packing.trees) == 6 and packing.balanced
    at = {g: i for i, g in enumerate(ranks)}
    _check_trees(mult, 0, [[(at[p], at[c]) for p, c in t.edges] for t in packing.trees])


def test_mi250_broadcast_verifies_and_beats_floor():
    G = topo.load("mi250_16gcd")
    ranks = job_gpus(G)
    s = plan_blink(G, ranks, "broadcast", 1 << 30)
    verify(s)
    busbw = simulate(s, G, 1 << 30, ranks=list(ranks)).busbw_GBps
    assert busbw >= MI250_BROADCAST_FLOOR * 300.0


def test_mi250_broadcast_moves_paired_pieces_on_lanes_of_each_tree():
    # Equal deep trees broadcast in pieces of two chunks, two lanes per tree and link, so a
    # piece's transfer covers the route latency of the next one on the other lane.
    G = topo.load("mi250_16gcd")
    ranks = job_gpus(G)
    s = plan_blink(G, ranks, "broadcast", 1 << 30)
    copies = [ins for rank in s.lanes[1:] for lane in rank for ins in lane.instrs]
    assert sum(ins.dst.count == 2 for ins in copies) > 0.9 * len(copies)
    assert max(len(rank) for rank in s.lanes) == 2 * len(s.meta_dict()["trees"])


def test_switch_fabrics_keep_their_trees():
    # no direct GPU links: the unit construction does not apply
    G = topo.load("pcie_gen4_8gpu")
    ranks = job_gpus(G)
    J = job_graph(G, ranks)
    index = LinkIndex.of(J)
    assert lane_counts(index, ranks, simulator_routes(J, index, ranks)) is None


def test_mi250_reduce_beats_floor():
    p = plan(topo.load("mi250_16gcd"), "reduce", 1 << 30, verify=True)
    assert p.efficiency >= MI250_REDUCE_FLOOR


@pytest.mark.parametrize("name, gpus, coll, floor", [
    ("dgx1v", None, "broadcast", 0.91),            # 0.918 (ring before: 0.911)
    ("dgx1v", [0, 1, 2, 4, 5, 6, 7], "broadcast", 0.83),   # 0.840 (0.812 before)
    ("pcie_gen4_8gpu", None, "allreduce", 0.99),
    ("pcie_gen4_8gpu", None, "allgather", 0.99),
])
def test_no_regression_elsewhere(name, gpus, coll, floor):
    p = plan(topo.load(name), coll, 1 << 30, gpus=gpus, verify=True)
    assert p.efficiency >= floor


def test_spanning_unit_trees_respect_lanes():
    G = topo.load("mi250_16gcd")
    ranks = job_gpus(G)
    J = job_graph(G, ranks)
    index = LinkIndex.of(J)
    _, mult, _ = lane_counts(index, ranks, simulator_routes(J, index, ranks))
    both = np.minimum(mult, mult.T)
    trees = spanning_unit_trees(both, 3, list(range(16)))
    assert trees is not None
    used = np.zeros_like(both)
    for i, edges in enumerate(trees):
        reached = {i}
        for p, c in edges:
            assert p in reached and c not in reached
            reached.add(c)
            used[p, c] += 1
            used[c, p] += 1
        assert len(reached) == 16
    assert (used <= both).all()
    packing = pack_unit_spanning_trees(J, ranks)
    assert packing is not None and packing.rate == pytest.approx(150.0)


def test_depth_balanced_counts_sum_and_order():
    G = topo.load("mi250_16gcd")
    ranks = job_gpus(G)
    J = job_graph(G, ranks)
    index = LinkIndex.of(J)
    packing = pack_unit_trees(index, ranks, ranks[0], simulator_routes(J, index, ranks), 300.0)
    counts = depth_balanced_counts(packing.trees, 960)
    assert sum(n for _, n in counts) == 960
    deep = max(counts, key=lambda tn: tn[0].depth())
    shallow = min(counts, key=lambda tn: tn[0].depth())
    assert deep[1] <= shallow[1]


def test_mi250_allreduce_beats_floor():
    p = plan(topo.load("mi250_16gcd"), "allreduce", 1 << 30, verify=True)
    assert p.efficiency >= MI250_ALLREDUCE_FLOOR


def test_mi250_reduce_scatter_beats_floor():
    p = plan(topo.load("mi250_16gcd"), "reduce_scatter", 1 << 30, verify=True)
    assert p.efficiency >= MI250_REDUCE_SCATTER_FLOOR
