"""Tree packing LP (column generation), arborescences, and Blink schedules (verify + simulate)."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import numpy as np
import pytest

import collectx.topology as topo
from collectx.errors import NoFeasiblePlan, PlanError, TopologyError
from collectx.planner.bounds import bounds
from collectx.planner import treepack
from collectx.planner.treepack import min_arborescence, min_spanning_tree, pack_undirected_trees
from collectx.planner.trees import plan_blink
from collectx.schedule import simulate, verify
from collectx.topology.view import LinkIndex, job_graph


def _nx_arborescence_cost(W, root):
    G = nx.DiGraph()
    n = len(W)
    for u, v in itertools.product(range(n), repeat=2):
        if u != v and v != root and np.isfinite(W[u, v]):
            G.add_edge(u, v, weight=W[u, v])
    return sum(d["weight"] for _, _, d in
               nx.minimum_spanning_arborescence(G, attr="weight").edges(data=True))


@pytest.mark.parametrize("seed", range(20))
def test_min_arborescence_matches_networkx(seed):
    rng = np.random.default_rng(seed)
    n = 3 + seed % 6
    W = rng.integers(1, 20, size=(n, n)).astype(float)
    W[rng.random((n, n)) < 0.2] = np.inf
    W[0, 1:] = 50.0                           # root reaches everyone, expensively
    parent = min_arborescence(W, 0)
    assert parent[0] == -1
    cost = sum(W[parent[v], v] for v in range(1, n))
    assert cost == pytest.approx(_nx_arborescence_cost(W, 0))
    seen = {0}                                # it is a tree hanging from the root
    for v in range(n):
        walk, u = set(), v
        while u not in seen:
            assert u not in walk
            walk.add(u)
            u = parent[u]
        seen |= walk


@pytest.mark.parametrize("seed", range(40))
def test_compiled_min_arborescence_is_the_python_one(seed, monkeypatch):
    # Same parents, ties and all (ties are common: costs are sums of a few link prices), so
    # that plans do not depend on whether collectx._fastpath is built.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 18))
    W = rng.integers(1, 4, size=(n, n)) * rng.choice([0.5, 1.0], size=(n, n))
    W[rng.random((n, n)) < rng.random() * 0.8] = np.inf
    root = int(rng.integers(n))
    got = min_arborescence(W, root)
    monkeypatch.setattr(treepack, "compiled_helper", lambda name: None)
    assert min_arborescence(W, root) == got


def test_min_arborescence_unreachable_is_none():
    W = np.full((3, 3), np.inf)
    W[0, 1] = 1.0
    assert min_arborescence(W, 0) is None


def test_min_spanning_tree_prim():
    C = np.array([[0, 3, 1, 9], [3, 0, 1, 9], [1, 1, 0, 2], [9, 9, 2, 0]], dtype=float)
    edges = min_spanning_tree(C)
    assert sum(C[u, v] for u, v in edges) == 4.0 and len(edges) == 3


def _index(G, gpus):
    return LinkIndex.of(job_graph(G, gpus)), job_graph(G, gpus)


def _loads(index, packing):
    load = np.zeros(len(index.links))
    for t in packing.trees:
        for path in t.paths:
            for link, w in path:
                load[link] += t.rate * w
    return load


def test_packing_respects_capacities():
    G = topo.load("dgx1v")
    gpus = ("GPU0", "GPU1", "GPU5", "GPU6")
    index, _ = _index(G, gpus)
    packing = pack_undirected_trees(index, gpus)
    assert np.all(_loads(index, packing) <= np.asarray(index.caps) * (1 + 1e-7))


BLINK = ("allreduce", "broadcast", "reduce")


@pytest.mark.parametrize("gen", ["ring", "fully_connected", "switch"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("collective", BLINK)
def test_blink_verifies_on_toy_topologies(gen, n, collective):
    G = getattr(topo, gen)(n)
    ranks = tuple(topo.gpus(G))
    for inplace in (False, True):
        s = plan_blink(G, ranks, collective, 1 << 20, root=n // 2, inplace=inplace)
        assert s.algorithm == "blink" and s.root == n // 2   # no CPU: nothing staged
        verify(s)


@pytest.mark.parametrize("name", ["dgx1v", "dgx1p", "dgx_a100", "dgx_h100", "mi300x",
                                  "pcie_gen4_8gpu"])
def test_blink_verifies_on_presets(name):
    G = topo.load(name)
    ranks = tuple(topo.gpus(G))
    for collective in BLINK:
        verify(plan_blink(G, ranks, collective, 1 << 22, root=1))


def test_blink_serves_allocations_without_a_ring():
    # GPU0, GPU1, GPU5 of a DGX-1V: NVLink 0-1 and 1-5 only, no NVLink ring
    G = topo.subset(topo.load("dgx1v"), ["GPU0", "GPU1", "GPU5"])
    ranks = ("GPU0", "GPU1", "GPU5")
    s = plan_blink(G, ranks, "allreduce", 1 << 30)
    verify(s)
    sim = simulate(s, G, 1 << 30, ranks=ranks)
    b = bounds(G, "allreduce", gpus=ranks)
    packed = 2 * 2 / 3 * s.meta_dict()["rate_gbps"]   # the packing under the simulator's routes
    assert sim.busbw_GBps <= b.ceiling_busbw * 1.001
    assert packed >= 33.3          # at least the NVLink trees: 2(N-1)/N * 25 GB/s
    assert sim.busbw_GBps >= 0.8 * packed


def test_blink_line_of_three_beats_reduce_scatter_allgather():
    G = topo.line(3, bw=100.0)
    ranks = tuple(topo.gpus(G))
    s = plan_blink(G, ranks, "allreduce", 1 << 30)
    sim = simulate(s, G, 1 << 30, ranks=ranks)
    assert sim.busbw_GBps > 0.95 * 400 / 3 > 100.0
    assert sim.busbw_GBps <= 400 / 3 * 1.001


def test_blink_rejects_what_it_does_not_plan():
    G = topo.ring(4)
    with pytest.raises(PlanError, match="forest"):
        plan_blink(G, tuple(topo.gpus(G)), "allgather", 1024)
    with pytest.raises(PlanError, match="root"):
        plan_blink(G, tuple(topo.gpus(G)), "broadcast", 1024, root=4)


def test_blink_disconnected_allocation_raises():
    G = topo.line(3)
    with pytest.raises((TopologyError, NoFeasiblePlan)):
        plan_blink(G, ("GPU0", "GPU2"), "allreduce", 1024)


def test_blink_is_pure():
    G = topo.load("dgx1v")
    before = nx.to_dict_of_dicts(G)
    a = plan_blink(G, ("GPU0", "GPU3", "GPU6"), "broadcast", 1 << 24)
    b = plan_blink(G, ("GPU0", "GPU3", "GPU6"), "broadcast", 1 << 24)
    assert a == b and nx.to_dict_of_dicts(G) == before


@pytest.mark.slow
@pytest.mark.parametrize("gen", ["ring", "fully_connected", "switch"])
def test_blink_verifies_up_to_sixteen_ranks(gen):
    for n in (1, 2, 3, 4, 5, 7, 9, 12, 16):
        G = getattr(topo, gen)(n)
        ranks = tuple(topo.gpus(G))
        for collective in BLINK:
            verify(plan_blink(G, ranks, collective, 1 << 20, root=random.Random(n).randrange(n)))


def test_room_left_is_the_most_each_link_can_spare_at_the_rate():
    two_ways = [(0, None, {0: 1}), (0, None, {1: 1})]   # one group, over link 0 or link 1
    assert treepack.room_left([10.0, 10.0], two_ways, 10.0, 0.25).tolist() == \
        pytest.approx([0.25, 0.25])
    assert treepack.room_left([10.0, 10.0, 5.0], two_ways, 20.0, 0.25).tolist() == \
        pytest.approx([0.0, 0.0, 0.0], abs=1e-6)   # both full at the rate; link 2 unused
    assert treepack.room_left([10.0, 10.0], two_ways, 25.0, 0.25) is None
