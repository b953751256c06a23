"""ForestColl-style forests: verify everywhere, reach the packing rate in the simulator."""

from __future__ import annotations

import networkx as nx
import pytest

import collectx.topology as topo
from collectx.errors import PlanError
from collectx.planner import ALGORITHMS
from collectx.planner.bounds import bounds
from collectx.planner.trees import plan_forest
from collectx.schedule import simulate, verify

FOREST = ("allgather", "reduce_scatter", "allreduce")


def test_registered():
    assert "forest" in ALGORITHMS and "blink" in ALGORITHMS


@pytest.mark.parametrize("gen", ["ring", "fully_connected", "switch"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("collective", FOREST)
def test_forest_verifies_on_toy_topologies(gen, n, collective):
    G = getattr(topo, gen)(n)
    ranks = tuple(topo.gpus(G))
    for inplace in (False, True):
        s = plan_forest(G, ranks, collective, 1 << 20, inplace=inplace)
        assert s.algorithm == "forest" and s.inplace == inplace
        verify(s)


@pytest.mark.parametrize("name", ["dgx1v", "dgx1p", "dgx_a100", "dgx_h100", "mi300x",
                                  "pcie_gen4_8gpu"])
def test_forest_verifies_on_presets(name):
    G = topo.load(name)
    ranks = tuple(topo.gpus(G))
    for collective in FOREST:
        verify(plan_forest(G, ranks, collective, 1 << 22))


def test_forest_meta_describes_every_chunk_once():
    G = topo.load("dgx1v")
    ranks = ("GPU0", "GPU2", "GPU4", "GPU6", "GPU7")
    s = plan_forest(G, ranks, "allgather", 1 << 26, nchunks=16)
    covered: dict = {}
    for root, edges, first, count, *_ in s.meta_dict()["trees"]:
        assert len(edges) == len(ranks) - 1
        covered.setdefault(root, []).extend(range(first, first + count))
    assert {r: sorted(c) for r, c in covered.items()} == {r: list(range(16)) for r in range(5)}


@pytest.mark.parametrize("gen,n", [("ring", 4), ("line", 3), ("fully_connected", 4)])
@pytest.mark.parametrize("collective", FOREST)
def test_forest_reaches_cut_bound_on_small_graphs(gen, n, collective):
    G = getattr(topo, gen)(n)
    ranks = tuple(topo.gpus(G))
    s = plan_forest(G, ranks, collective, 1 << 30)
    sim = simulate(s, G, 1 << 30, ranks=ranks)
    b = bounds(G, collective)
    assert sim.busbw_GBps <= (b.ceiling_busbw or b.bound_busbw) * 1.001
    assert sim.busbw_GBps >= 0.9 * b.cut_busbw


def test_forest_rejects_rooted_collectives():
    G = topo.ring(4)
    with pytest.raises(PlanError, match="blink"):
        plan_forest(G, tuple(topo.gpus(G)), "broadcast", 1024)


def test_forest_allreduce_gives_every_root_the_same_chunks():
    G = topo.ring(3)
    s = plan_forest(G, tuple(topo.gpus(G)), "allreduce", 1 << 24, nchunks=9)
    assert s.nchunks == 9
    verify(s)
    with pytest.raises(PlanError, match="multiple of 3"):
        plan_forest(G, tuple(topo.gpus(G)), "allreduce", 1 << 24, nchunks=7)


def test_forest_is_pure():
    G = topo.load("dgx1p")
    before = nx.to_dict_of_dicts(G)
    a = plan_forest(G, ("GPU1", "GPU2", "GPU7"), "reduce_scatter", 1 << 24)
    assert a == plan_forest(G, ("GPU1", "GPU2", "GPU7"), "reduce_scatter", 1 << 24)
    assert nx.to_dict_of_dicts(G) == before


@pytest.mark.slow
@pytest.mark.parametrize("gen", ["ring", "fully_connected", "switch"])
def test_forest_verifies_up_to_sixteen_ranks(gen):
    for n in (1, 2, 3, 4, 5, 7, 9, 12, 16):
        G = getattr(topo, gen)(n)
        ranks = tuple(topo.gpus(G))
        for collective in FOREST:
            verify(plan_forest(G, ranks, collective, 1 << 20))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dgx2", "mi250_16gcd"])
def test_forest_verifies_on_sixteen_gpu_presets(name):
    G = topo.load(name)
    ranks = tuple(topo.gpus(G))
    for collective in FOREST:
        verify(plan_forest(G, ranks, collective, 1 << 22))


@pytest.mark.parametrize("collective", ["allgather", "allreduce"])
def test_forest_on_pcie_switches_reaches_the_bound(collective):
    """A PCIe tree with one GPU per leaf: equal trees per root carry N - 1 equal transfers
    on every GPU link, so the simulator's equal link sharing is the planned sharing."""
    G = topo.load("pcie_gen4_8gpu")
    ranks = tuple(topo.gpus(G))
    s = plan_forest(G, ranks, collective, 1 << 30)
    verify(s)
    got = simulate(s, G, 1 << 30, ranks=list(ranks)).busbw_GBps
    ref = bounds(G, "allgather", gpus=list(ranks)).bound_busbw
    assert got >= 0.97 * ref


def test_forest_allgather_on_sixteen_gcds_reaches_the_bound():
    G = topo.load("mi250_16gcd")
    ranks = tuple(topo.gpus(G))
    s = plan_forest(G, ranks, "allgather", 1 << 30)
    got = simulate(s, G, 1 << 30, ranks=list(ranks))
    assert got.busbw_GBps >= 0.95 * bounds(G, "allgather", gpus=list(ranks)).bound_busbw
