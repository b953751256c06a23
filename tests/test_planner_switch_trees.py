"""Equal-rate per-root trees along the switch hierarchy of PCIe machines."""

from __future__ import annotations

import numpy as np
import pytest

import collectx.topology as topo
from collectx.topology.view import LinkIndex, job_graph, simulator_routes
from collectx.planner.forest import plan_forest
from collectx.planner.switch_trees import pack_switch_trees, tree_shaped
from collectx.planner.treepack import pack_out_trees
from collectx.planner.treesched import pack_rooted_mirrored
from collectx.schedule import simulate, verify

PCIE = "pcie_gen4_8gpu"


def _setup(name, picks=None):
    G0 = topo.load(name)
    gpus = tuple(topo.gpus(G0))
    ranks = gpus if picks is None else tuple(gpus[i] for i in picks)
    G = job_graph(G0, ranks)
    index = LinkIndex.of(G)
    routes = simulator_routes(G, index, ranks)
    return G0, G, ranks, index, routes


def test_switch_trees_reach_the_cut_bound_shallow_and_balanced():
    _, _, ranks, index, routes = _setup(PCIE)
    lp = pack_out_trees(index, ranks, ranks, routes=routes)
    sw = pack_switch_trees(index, ranks, ranks, routes, lp.rate)
    assert sw.balanced and sw.rate == pytest.approx(lp.rate, rel=1e-9)
    assert sorted(t.root for t in sw.trees) == sorted(ranks)
    assert max(t.depth() for t in sw.trees) <= 3
    sends = {g: 0 for g in ranks}
    for t in sw.trees:
        assert {c for _, c in t.edges} == set(ranks) - {t.root}
        for p, _ in t.edges:
            sends[p] += 1
    assert set(sends.values()) == {len(ranks) - 1}     # every GPU link carries N - 1 pieces
    load = np.zeros(len(index.caps))
    for t in sw.trees:
        for path in t.paths:
            for link, w in path:
                load[link] += w * sw.rate
    assert np.all(load <= np.asarray(index.caps) * (1 + 1e-9))


@pytest.mark.parametrize("name", ["dgx1v", "dgx_a100", "mi300x"])
def test_switch_trees_need_a_tree_shaped_fabric(name):
    _, G, ranks, index, routes = _setup(name)
    assert not tree_shaped(G, ranks)
    assert pack_switch_trees(index, ranks, ranks, routes, 1.0) is None


def test_pcie_is_tree_shaped():
    _, G, ranks, _, _ = _setup(PCIE, (0, 3, 5))
    assert tree_shaped(G, ranks)


@pytest.mark.parametrize("picks", [(0, 1, 2, 3), (0, 2, 4, 7), (1, 2, 3, 4, 5),
                                   (0, 1, 2, 4, 5, 7), (1, 2, 3, 4, 5, 6, 7)])
@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
def test_forest_on_pcie_allocations_verifies(picks, collective):
    G0, _, ranks, _, _ = _setup(PCIE, picks)
    for inplace in (False, True):
        verify(plan_forest(G0, ranks, collective, 1 << 22, inplace=inplace))


@pytest.mark.parametrize("picks", [(1, 2, 3, 4, 5), (1, 2, 3, 4, 5, 6)])
def test_pcie_allreduce_never_slower_than_the_lp_forest(picks):
    """On these allocations the switch trees simulate slower for allreduce; the LP forest's
    plan is kept there."""
    from collectx.planner import forest

    G0, G, ranks, _, _ = _setup(PCIE, picks)
    chosen = simulate(plan_forest(G0, ranks, "allreduce", 1 << 30), G0, 1 << 30,
                      ranks=list(ranks)).time_us
    both = pack_rooted_mirrored(G, ranks, ranks, balanced=False)
    lp = forest._schedule({"allgather": both[False], "reduce_scatter": both[True]},
                          "allreduce", 1 << 30, ranks, False, None)
    assert chosen <= simulate(lp, G0, 1 << 30, ranks=list(ranks)).time_us * (1 + 1e-9)
