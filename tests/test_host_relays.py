"""Host buffers (tree edges staged through host memory over PCIe): IR, verify, simulate,
planner, executors."""

from __future__ import annotations

import pytest

import _runtime_workers as W
import collectx
import collectx.topology as T
from collectx.errors import MalformedSchedule, ReadBeforeWrite, ScheduleError, WrongResult
from collectx.planner import make_schedule, plan, registry
from collectx.planner.api import allocation
from collectx.schedule import Ref, Schedule, ScheduleBuilder, simulate, to_msccl_xml, verify
from collectx.schedule.host import host_as_scratch, host_chunks, stage_through_host

DGX1V = T.load("dgx1v")


def relayed_broadcast(nchunks=1, skip_wait=False, skip_copy=False):
    """Root 0 writes its input into its host buffer; rank 1 reads it from there."""
    b = ScheduleBuilder("broadcast", 2, nchunks=nchunks, root=0)
    h = b.host(0, 1)
    up = b.copy(0, 0, Ref(0, "host", h, nchunks), Ref(0, "input", 0, nchunks))
    b.copy(0, 0, Ref(0, "output", 0, nchunks), Ref(0, "input", 0, nchunks))
    if not skip_copy:
        b.copy(1, 0, Ref(1, "output", 0, nchunks), Ref(0, "host", h, nchunks),
               deps=[] if skip_wait else [up])
    return b.build()


# -- IR and verify -------------------------------------------------------------------------------
def test_host_buffers_round_trip_with_schema_2_and_old_schedules_still_load():
    s = relayed_broadcast()
    d = s.to_dict()
    assert d["schema"] == "collectx.schedule/2" and d["host_units"] == [1, 0]
    assert Schedule.from_dict(d) == s
    plain = plan(T.ring(3), "allgather", 1 << 10, algo="ring").schedule
    old = plain.to_dict()
    assert old["schema"] == "collectx.schedule/1" and "host_units" not in old
    assert Schedule.from_dict(old) == plain
    with pytest.raises(ScheduleError, match="schedule/1"):
        Schedule.from_dict({**old, "schema": "collectx.schedule/9"})


def test_verify_treats_host_like_scratch():
    assert verify(relayed_broadcast()).instructions == 3
    with pytest.raises(ReadBeforeWrite):
        verify(relayed_broadcast(skip_wait=True))
    with pytest.raises(WrongResult):
        verify(relayed_broadcast(skip_copy=True))
    b = ScheduleBuilder("broadcast", 2, nchunks=1, root=0)
    b.copy(0, 0, Ref(0, "host", 0), Ref(0, "input", 0))       # no host units reserved
    with pytest.raises(MalformedSchedule, match="host of 0 chunks"):
        verify(b.build())


# -- simulate ------------------------------------------------------------------------------------
def test_a_host_relay_crosses_pcie_up_to_the_cpu_and_down_again():
    ranks, view = allocation(DGX1V, [0, 1])
    r = simulate(relayed_broadcast(), view, 1 << 30, ranks=list(ranks))
    assert set(r.link_bytes) == {("GPU0", "PLX0"), ("PLX0", "CPU0"), ("CPU0", "PLX0"),
                                 ("PLX0", "GPU1")}          # never the NVLink between them


def test_a_reader_on_the_other_socket_also_crosses_the_cpu_link():
    ranks, view = allocation(DGX1V, [0, 4])
    r = simulate(relayed_broadcast(), view, 1 << 28, ranks=list(ranks))
    assert ("CPU0", "CPU1") in r.link_bytes and ("GPU0", "GPU4") not in r.link_bytes


def test_relay_and_nvlink_shares_add_up_to_the_bound_for_a_switch_pair_broadcast():
    p = plan(DGX1V, "broadcast", 1 << 30, gpus=[0, 1])
    assert p.schedule.uses_host and p.algorithm.endswith("blink+host")
    assert p.efficiency > 0.95
    assert p.predicted.busbw_GBps <= 1.001 * p.bound.bound_busbw


# -- passes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo, coll", [
    (algo, coll) for algo in ("direct", "ring", "tree")
    for coll in ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall")
    if registry.supports(algo, coll)])
def test_staged_schedules_verify(coll, algo):
    ranks, view = allocation(T.ring(4), None)
    s = plan(view, coll, 1 << 16, algo=algo, root=1).schedule
    staged = stage_through_host(s)
    assert verify(staged) and verify(host_as_scratch(staged))
    assert host_chunks(staged) > 0 and not host_as_scratch(staged).uses_host
    assert all(ins.dst.rank == d.rank or ins.dst.buf == "host" or
               all(x.rank == ins.dst.rank for x in ins.srcs)
               for d, ins in staged.instructions())   # every move between ranks is staged


def test_msccl_export_maps_host_buffers_to_scratch():
    xml = to_msccl_xml(relayed_broadcast())
    assert 'type="h"' not in xml and "<algo" in xml


# -- planner -------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["dgx1v", "dgx1p"])
@pytest.mark.parametrize("gpus", [[0, 1], [0, 1, 2], [0, 2, 4, 6, 7], [1, 2, 3, 4, 5, 6]])
def test_plans_with_host_edges_verify_and_stay_under_the_bounds(preset, gpus):
    for coll in ("allreduce", "allgather", "broadcast"):
        p = plan(T.load(preset), coll, 1 << 30, gpus=gpus)
        assert p.verified
        cap = p.bound.ceiling_busbw if coll == "allreduce" else p.bound.bound_busbw
        assert p.predicted.busbw_GBps <= 1.001 * cap


@pytest.mark.parametrize("coll", ["allreduce", "allgather"])
def test_full_dgx1v_reaches_the_bound_only_with_pcie_beside_nvlink(coll):
    # NVLink alone carries 150 of the 157.9 GB/s bound: only trees that stage some edges
    # through host memory pass 0.95 of it.
    p = plan(DGX1V, coll, 1 << 30, verify=False)
    assert p.schedule.uses_host and p.algorithm.endswith("+host")
    assert 0.95 <= p.efficiency <= 1.001
    alone = plan(DGX1V, coll, 1 << 30, host_relays=False, verify=False)
    assert not alone.schedule.uses_host
    assert alone.bound.bound_busbw == pytest.approx(150.0, rel=1e-3)   # NVLink's alone
    assert alone.predicted.busbw_GBps <= 150.0 * 1.001 and alone.efficiency >= 0.95


def test_host_relays_false_never_stages_and_small_messages_never_do():
    for coll in ("allreduce", "allgather", "broadcast"):
        assert not plan(DGX1V, coll, 1 << 30, gpus=[0, 1], host_relays=False).schedule.uses_host
        assert not plan(DGX1V, coll, 8 << 10, gpus=[0, 1]).schedule.uses_host
        assert not make_schedule(DGX1V, coll, 2, 64 << 20, host_relays=False).uses_host
    assert make_schedule(DGX1V, "broadcast", 2, 64 << 20).uses_host


@pytest.mark.parametrize("make", [T.ring, T.fully_connected, T.switch])
def test_fabrics_without_cpus_never_stage(make):
    p = plan(make(5), "allreduce", 1 << 26)
    assert p.verified and not p.schedule.uses_host


@pytest.mark.parametrize("preset", ["dgx1v", "dgx1p", "dgx2", "dgx_a100", "dgx_h100",
                                    "mi250_16gcd", "mi300x", "pcie_gen4_8gpu"])
def test_every_preset_plans_verified_schedules_with_host_buffers_allowed(preset):
    G = T.load(preset)
    gpus = None if len(T.gpus(G)) <= 8 else list(range(8))
    for coll in ("allgather", "broadcast"):
        p = plan(G, coll, 1 << 28, gpus=gpus)
        assert p.verified
        assert p.predicted.busbw_GBps <= 1.001 * p.bound.bound_busbw
        if preset in ("dgx2", "dgx_a100", "dgx_h100", "mi250_16gcd", "mi300x"):
            assert not p.schedule.uses_host      # no CPU in these graphs


# -- CPU executor --------------------------------------------------------------------------------
@pytest.mark.parametrize("nranks", [2, 3])
def test_cpu_executor_runs_host_staged_schedules(monkeypatch, nranks):
    monkeypatch.setenv("COLLECTX_TOPO_FILE", "dgx1v")
    relayed = [c for c in ("allreduce", "broadcast", "reduce", "allgather")
               if make_schedule(DGX1V, c, nranks, 4 << 20).uses_host]
    assert relayed, "expected some collective to stage tree edges through host memory"
    n = (4 << 20) // 4 + 3
    cases = [(c, "float32", "max", n, nranks - 1, 7 + i) for i, c in enumerate(relayed)]
    assert collectx.launch(W.run_cases, nranks, args=(cases,), timeout=300) == [[]] * nranks


@pytest.mark.parametrize("algo, coll", [("blink", "reduce"), ("blink", "allreduce"),
                                        ("forest", "reduce_scatter")])
def test_cpu_executor_runs_tree_partials_at_odd_sizes(monkeypatch, algo, coll):
    # Reduction trees keep partial sums in scratch; with a payload that does not split evenly
    # into chunks, a partial must sit at its chunk's index of a scratch unit or the executor
    # sees refs of unequal length.
    monkeypatch.setenv("COLLECTX_TOPO_FILE", "dgx1v")
    monkeypatch.setenv("COLLECTX_ALGO", algo)
    n = (4 << 20) // 4 + 3
    cases = [(coll, "float32", "sum", n, 2, 11)]
    assert collectx.launch(W.run_cases, 3, args=(cases,), timeout=300) == [[]] * 3


def _runtime_topology(monkeypatch, tmp_path, preset: str, gpus: list):
    """GPUs ``gpus`` of ``preset`` as the topology the runtime's ranks plan on (written to a
    file they read through COLLECTX_TOPO_FILE), loaded back as they load it."""
    path = tmp_path / f"{preset}_{''.join(map(str, gpus))}.json"
    T.write_json(T.subset(T.load(preset), gpus), path)
    monkeypatch.setenv("COLLECTX_TOPO_FILE", str(path))
    return T.load(str(path))


def test_cpu_executor_runs_host_edges_between_gpus_without_a_direct_link(monkeypatch, tmp_path):
    # DGX-1P GPUs 0, 3, 6, 7 allgather stages edges between GPU0 and GPU6 (no NVLink, across
    # the sockets): the receiver reads a host buffer its own CPU does not hold.
    G = _runtime_topology(monkeypatch, tmp_path, "dgx1p", [0, 3, 6, 7])
    n = (16 << 20) // 4 + 5
    s = make_schedule(G, "allgather", 4, n * 4)
    staged = {tuple(e) for t in s.meta_dict()["trees"] if "host" in t
              for e in t[t.index("host") + 1]}
    assert staged & {(0, 2), (2, 0)}
    cases = [("allgather", "float32", "sum", n, 0, 9), ("allgather", "int8", "sum", 4 * n, 0, 3)]
    assert collectx.launch(W.run_cases, 4, args=(cases,), timeout=300) == [[]] * 4


def test_cpu_executor_runs_equal_trees_on_more_than_32_lanes(monkeypatch, tmp_path):
    # Equal trees with host edges give every tree lanes of its own on each link; GPUs 0, 3,
    # 4, 7 of dgx1v take more lanes than the 32 the executors once ran. The executor must run
    # all of them, host buffers and all, at a size that does not split evenly.
    G = _runtime_topology(monkeypatch, tmp_path, "dgx1v", [0, 3, 4, 7])
    n = (64 << 20) // 4 + 3
    s = make_schedule(G, "allreduce", 4, n * 4)
    assert s.uses_host and max(len(lanes) for lanes in s.lanes) > 32
    cases = [("allreduce", "float32", "sum", n, 0, 5)]
    assert collectx.launch(W.run_cases, 4, args=(cases,), timeout=300) == [[]] * 4
