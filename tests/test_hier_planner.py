"""Hierarchical plans on multi-node topologies: verified, simulated, bounded, and CLI output."""

from __future__ import annotations

import pytest

from collectx.errors import PlanError, TopologyError
from collectx.planner import plan
from collectx.planner.bounds import bounds
from collectx.planner.hier_bounds import symmetric_bounds
from collectx.planner.hierarchical import node_groups, plan_hierarchical, spans_machines
from collectx.schedule import verify
from collectx.schedule.simulate import simulate
from collectx.topology import gpus, load, multi_node, ring, switch

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast")


@pytest.mark.parametrize("base", [switch(2), switch(3), ring(4)], ids=lambda g: g.graph["name"])
@pytest.mark.parametrize("n_nodes", [2, 3])
@pytest.mark.parametrize("rails", [True, False])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_plan_verifies_and_simulates(base, n_nodes, rails, collective):
    G = multi_node(base, n_nodes, nic_bw=25.0, rails=rails)
    ranks = tuple(gpus(G))
    for pieces in (1, 3):
        roots = (0, len(ranks) - 1) if collective == "broadcast" else (0,)
        for root in roots:
            s = plan_hierarchical(G, ranks, collective, 1 << 20, nchunks=pieces, root=root)
            report = verify(s)
            assert report.engine_steps > 0
            sim = simulate(s, G, 1 << 22, ranks=list(ranks))
            assert 0 < sim.busbw_GBps
            assert s.algorithm == "hierarchical" and s.meta_dict()["pieces"] == pieces


def test_engine_steps_run_along_rails():
    G = multi_node(switch(2), 3, nic_bw=25.0)
    s = plan_hierarchical(G, tuple(gpus(G)), "allreduce", 1 << 20, nchunks=2)
    groups = {ins.group for _, ins in s.instructions() if ins.op == "engine"}
    assert groups == {(0, 2, 4), (1, 3, 5)}          # local rank i of every node
    ops = {ins.engine_op for _, ins in s.instructions() if ins.op == "engine"}
    assert ops == {"allreduce"}


def test_network_links_carry_the_inter_node_phase():
    G = multi_node(switch(2), 2, nic_bw=25.0)
    s = plan_hierarchical(G, tuple(gpus(G)), "allreduce", 1 << 20)
    sim = simulate(s, G, 1 << 24, ranks=list(gpus(G)))
    assert {("n0/NIC0", "RAIL0"), ("n1/NIC1", "RAIL1")} <= set(sim.link_bytes)


def test_refuses_one_machine_uneven_nodes_and_in_place():
    with pytest.raises(PlanError, match="one machine"):
        plan_hierarchical(switch(4), tuple(gpus(switch(4))), "allreduce", 1 << 20)
    G = multi_node(switch(2), 2, nic_bw=25.0)
    with pytest.raises(PlanError, match="same number"):
        node_groups(G, ("n0/GPU0", "n0/GPU1", "n1/GPU0"))
    with pytest.raises(PlanError, match="out of place"):
        plan_hierarchical(G, tuple(gpus(G)), "allreduce", 1 << 20, inplace=True)
    with pytest.raises(PlanError, match="alltoall"):
        plan_hierarchical(G, tuple(gpus(G)), "alltoall", 1 << 20)


def test_plan_picks_hierarchical_across_machines_only():
    assert spans_machines(multi_node(switch(2), 2, nic_bw=25.0), ("n0/GPU0", "n1/GPU0"))
    assert not spans_machines(multi_node(switch(2), 2, nic_bw=25.0), ("n0/GPU0", "n0/GPU1"))
    p = plan(multi_node(switch(2), 2, nic_bw=25.0), "allgather", 1 << 20)
    assert p.algorithm == "hierarchical" and p.verified and p.efficiency > 0
    uneven = plan(multi_node(switch(2), 2, nic_bw=25.0), "allreduce", 1 << 20,
                  gpus=["n0/GPU0", "n0/GPU1", "n1/GPU0"])
    assert uneven.algorithm != "hierarchical" and uneven.verified


@pytest.mark.parametrize("G", [multi_node(switch(2), 3, nic_bw=10.0),
                               multi_node(switch(4, bw=5.0), 3, nic_bw=25.0),
                               multi_node(ring(4), 2, nic_bw=25.0, rails=False)],
                         ids=lambda g: g.graph["name"])
@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce",
                                        "broadcast", "reduce"])
def test_symmetric_bounds_equal_the_generic_ones(G, collective):
    fast = symmetric_bounds(G, collective, root=1)
    slow = bounds(G, collective, root=1)
    if fast is None:      # trees might beat the cut: the generic LP must decide
        assert collective == "allreduce"
        return
    assert fast.bound_busbw == pytest.approx(slow.bound_busbw, rel=1e-6)
    if collective == "allreduce":
        assert fast.ceiling_busbw == pytest.approx(slow.ceiling_busbw, rel=1e-6)


def test_symmetric_bounds_decline_partial_machines():
    G = multi_node(switch(2), 2, nic_bw=25.0)
    assert symmetric_bounds(G, "allgather", gpus=["n0/GPU0", "n0/GPU1", "n1/GPU0"]) is None
    assert symmetric_bounds(switch(4), "allgather") is None


def test_cut_bound_counts_nic_links():
    # 3 nodes x 2 GPUs, NICs at 10 GB/s: the cut around one node allows 2 x 10 GB/s for the
    # other 4 GPUs' data, so allgather busbw <= (N-1) * 20/4 = 25 GB/s whatever NVLink does.
    b = bounds(multi_node(switch(2, bw=1000.0), 3, nic_bw=10.0), "allgather")
    assert b.bound_busbw == pytest.approx(25.0)


def test_multi_source_syntax():
    G = load("multi:dgx_a100:2:25:single")
    assert len(gpus(G)) == 16 and "NETSW" in G and "RAIL0" not in G
    with pytest.raises(TopologyError, match="multi:PRESET:NODES:GBPS"):
        load("multi:dgx_a100:two:25")
    with pytest.raises(TopologyError, match="number of machines 0"):
        load("multi:dgx_a100:0:25")


def test_cli_prints_hierarchical_plan_and_flat_ring(capsys):
    from collectx.cli.main import main
    assert main(["plan", "multi:dgx1v:2:25", "--collective", "allreduce", "--size", "64M"]) == 0
    text = capsys.readouterr().out
    assert "hierarchical" in text and "flat ring    busbw" in text and "efficiency" in text


@pytest.mark.slow
@pytest.mark.parametrize("source", ["multi:dgx_a100:4:25", "multi:dgx_h100:16:50"])
def test_acceptance_efficiency(source):
    from collectx.cli.plan import flat_ring_busbw
    G = load(source)
    p = plan(G, "allreduce", 1 << 30)
    assert p.algorithm == "hierarchical" and p.verified
    assert p.efficiency >= 0.9
    assert flat_ring_busbw(G, p) < p.predicted.busbw_GBps
