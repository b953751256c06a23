"""The ring-only fallback baseline: one ring, NVLink hops direct, the others through host memory."""

import pytest

import collectx.topology as T
from collectx.errors import PlanError
from collectx.planner import plan
from collectx.planner.fallback_ring import best_order, hop_rates, plan_fallback_ring
from collectx.schedule import ScheduleBuilder, simulate, verify
from collectx.schedule.host import stage_through_host
from collectx.schedule.ir import Ref

DGX1V = T.load("dgx1v")
NO_RING = [0, 1, 2, 6]          # NVLink-connected, but GPU6 shares no NVLink with GPU0 or GPU1


def ranks_of(gpus):
    return tuple(T.gpus(DGX1V)[g] for g in gpus)


def staged_pairs(s):
    """(writer, reader) rank pairs that pass data through a host buffer."""
    pairs = set()
    for rank, lanes in enumerate(s.lanes):
        for lane in lanes:
            for ins in lane.instrs:
                for src in ins.srcs:
                    if src.buf == "host" and src.rank != rank:
                        pairs.add((src.rank, rank))
    return pairs


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reduce_scatter", "broadcast",
                                        "reduce"])
def test_it_verifies_and_stages_only_hops_without_nvlink(collective):
    ranks = ranks_of(NO_RING)
    s = plan_fallback_ring(T.subset(DGX1V, NO_RING), ranks, collective, 1 << 24, root=1)
    verify(s)
    direct, _ = hop_rates(DGX1V, ranks)
    pairs = staged_pairs(s)
    assert all(not direct[a][b] for a, b in pairs)
    if collective != "broadcast":   # a chain from the root may avoid the slow hop altogether
        assert pairs


def test_a_ring_of_nvlink_hops_needs_no_host_memory():
    gpus = [0, 1, 2, 3]             # 0-1-2-3-0 are all NVLink pairs on a DGX-1V
    s = plan_fallback_ring(T.subset(DGX1V, gpus), ranks_of(gpus), "allreduce", 1 << 24)
    assert not s.uses_host and s.algorithm == "fallback_ring"


def test_it_runs_at_the_slowest_hop_and_collectx_plans_beat_it():
    G = T.subset(DGX1V, NO_RING)
    ranks = ranks_of(NO_RING)
    _, rate = hop_rates(G, ranks)
    slowest = min(rate[a][b] for a in range(4) for b in range(4) if a != b)
    fallback = plan(DGX1V, "allgather", 1 << 28, gpus=NO_RING, algo=plan_fallback_ring)
    assert fallback.predicted.busbw_GBps <= slowest * 1.001
    assert fallback.predicted.busbw_GBps >= 0.8 * slowest
    chosen = plan(DGX1V, "allgather", 1 << 28, gpus=NO_RING)
    assert chosen.predicted.busbw_GBps >= 3 * fallback.predicted.busbw_GBps


def test_the_order_maximises_the_slowest_hop_then_the_direct_hops():
    rate = [[0, 9, 1, 9], [9, 0, 9, 1], [1, 9, 0, 9], [9, 1, 9, 0]]
    direct = [[r == 9 for r in row] for row in rate]
    order, bw = best_order(rate, direct)
    assert bw == 9 and order in ((0, 1, 2, 3), (0, 3, 2, 1))


def test_bad_requests_are_refused():
    with pytest.raises(PlanError, match="alltoall"):
        plan_fallback_ring(DGX1V, ranks_of([0, 1]), "alltoall", 1 << 20)
    big = T.ring(10)
    with pytest.raises(PlanError, match="at most"):
        plan_fallback_ring(big, tuple(T.gpus(big)), "allreduce", 1 << 20)


def test_staging_can_be_limited_to_some_pairs():
    b = ScheduleBuilder("allgather", 3, nchunks=1)
    for r in range(3):
        b.copy(r, 0, Ref(r, "output", r), Ref(r, "input", 0))
        for p in range(3):
            if p != r:
                b.copy(r, 1, Ref(r, "output", p), Ref(p, "input", 0))
    s = b.build()
    staged = stage_through_host(s, pairs=lambda a, b: {a, b} == {0, 2})
    verify(staged)
    assert staged_pairs(staged) == {(0, 2), (2, 0)}
    everything = stage_through_host(s)
    assert len(staged_pairs(everything)) == 6
    G = T.fully_connected(3)
    assert simulate(staged, G, 1 << 20).time_us > 0


def test_it_is_forced_by_name_but_never_chosen_by_the_cost_model():
    from collectx.planner import candidates
    forced = plan(DGX1V, "allreduce", 1 << 26, gpus=NO_RING, algo="fallback_ring")
    assert forced.algorithm == "fallback_ring" and forced.verified
    assert "fallback_ring" not in candidates("allreduce")
    assert plan(DGX1V, "allreduce", 1 << 26, gpus=NO_RING).algorithm != "fallback_ring"
