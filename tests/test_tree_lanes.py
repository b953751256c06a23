"""Trees on lanes of their own: every tree moves as its own transfers, within the executors'
lanes, and the compiled lowering deals them as the Python emitter does."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import collectx.topology as topo
from collectx.planner import plan
from collectx.schedule.treesched import Share, TreeEmitter, chunk_refs
from collectx.schedule import ScheduleBuilder, verify

from _dumps import REAL


def _two_trees_over_one_link():
    """Two trees of root 0 that both cross 0 -> 1, four chunks each."""
    b = ScheduleBuilder("broadcast", 3, 8, inplace=True)
    em = TreeEmitter(b)
    shares = [Share(0, ((0, 1), (1, 2)), tuple(range(4))),
              Share(0, ((0, 1), (0, 2)), tuple(range(4, 8)))]
    em.broadcast(shares, src=chunk_refs("input"), dst=chunk_refs("output"))
    em.flush()
    return b.build()


def test_trees_that_share_a_link_move_on_lanes_of_their_own():
    s = _two_trees_over_one_link()
    verify(s)
    assert [len(lane.instrs) for lane in s.lanes[1]] == [4, 4]   # one lane per tree


def test_tree_plans_stay_within_the_lanes_of_the_executors_that_run_them():
    # The CUDA executor runs at most GPU_LANES per rank and has no host buffers; the CPU
    # executor runs MAX_LANES. Plans with many trees fold extra lane keys onto shared lanes
    # instead of exceeding their executor's limit; only plans for the CPU executor (host
    # staging allowed, as plan() does by default) may take more than GPU_LANES.
    from collectx.schedule.ir import GPU_LANES, MAX_LANES
    cases = [("mi250_16gcd", None, "allgather"), ("dgx1v", [0, 1, 2, 3, 5], "allreduce"),
             ("dgx1v", [0, 1, 3, 4, 6, 7], "allgather"), ("dgx1v", None, "broadcast"),
             (REAL / "mi250_8gcd_8nic_rccl_topo.xml", None, "allgather")]
    most = {}
    for (name, gpus, coll), host in itertools.product(cases, (True, False)):
        s = plan(topo.load(name), coll, 1 << 30, gpus=gpus, verify=False,
                 host_relays=host).schedule
        lanes = max(len(lanes) for lanes in s.lanes)
        assert lanes <= (MAX_LANES if host else GPU_LANES), (name, gpus, coll, lanes)
        most[host] = max(most.get(host, 0), lanes)
    assert most[True] > GPU_LANES   # the MI250 dump's allgather takes the CPU executor's lanes


def test_a_plan_with_more_lanes_than_its_executor_runs_is_refused():
    from collectx.errors import PlanError
    from collectx.runtime.executor import FlatPlan
    from collectx.schedule.ir import GPU_LANES
    s = plan(topo.load(REAL / "mi250_8gcd_8nic_rccl_topo.xml"), "allgather", 1 << 30,
             verify=False).schedule
    rank = max(range(s.nranks), key=lambda r: len(s.lanes[r]))
    assert len(FlatPlan(s, rank).schedule.lanes[rank]) > GPU_LANES   # the CPU executor runs it
    with pytest.raises(PlanError, match=f"the CUDA executor runs at most {GPU_LANES}"):
        FlatPlan(s, rank, GPU_LANES, "CUDA")


def test_the_lane_limits_match_the_native_executors():
    import re
    from collectx.runtime.segment import CTL_BYTES
    from collectx.schedule.ir import GPU_LANES, MAX_LANES
    include = Path(__file__).resolve().parents[1] / "native" / "include"
    for header, name, want in (("cx_executor.h", "CX_EXEC_MAX_LANES", MAX_LANES),
                               ("cx_executor.h", "CX_CTL_BYTES", CTL_BYTES),
                               ("cx_cuda_exec.h", "CX_CUDA_MAX_LANES", GPU_LANES)):
        found = re.search(rf"#define {name} (\d+)", (include / header).read_text())
        assert found and int(found.group(1)) == want, (header, name)


def _plans_of_tree_emitters():
    """Tree plans with every kind of lane key: reductions, broadcasts, copies staged through
    host memory, and more keys than lanes (the full DGX-1V allreduce)."""
    G = topo.load("dgx1v")
    return [plan(G, coll, 1 << 30, gpus=gpus, verify=False).schedule
            for coll, gpus in (("allreduce", [0, 2, 3, 4, 5, 7]), ("allgather", [0, 1, 3, 4, 5, 7]),
                               ("broadcast", [0, 1, 2, 3, 5, 6, 7]), ("allreduce", None))]


def test_the_compiled_lowering_deals_what_the_python_emitter_deals(monkeypatch):
    import collectx.schedule.treesched as ts
    if ts.compiled_helper("lower_words") is None:
        pytest.skip("no compiled collectx._fastpath")
    native = _plans_of_tree_emitters()
    assert any(s.uses_host for s in native)
    monkeypatch.setattr(ts, "compiled_helper", lambda name: None)
    assert [s.to_dict() for s in _plans_of_tree_emitters()] == [s.to_dict() for s in native]


def _many_lanes_allgather(lanes: int):
    """A 2-rank allgather on ``lanes`` lanes per rank: each rank copies its own input on lane 0
    and the peer's chunk ``j`` on lane ``1 + j``; rank 1's copy of chunk ``j`` also waits for
    rank 0's (a dep on a flag past the 64th lane)."""
    from collectx.schedule.builder import LaneBuilder
    from collectx.schedule.ir import Ref
    c = lanes - 1
    b = LaneBuilder("allgather", 2, c)
    copied = {}
    for r in (0, 1):
        b.add(r, 0, "copy", Ref(r, "output", r * c, c), [Ref(r, "input", 0, c)])
        for j in range(c):
            copied[r, j] = b.add(r, 1 + j, "copy", Ref(r, "output", (1 - r) * c + j),
                                 [Ref(1 - r, "input", j)], [copied[0, j]] if r else [])
    return b.schedule("many_lanes")


def test_the_cpu_executor_runs_every_lane_it_allows(monkeypatch):
    import numpy as np
    import collectx
    import collectx.planner as planner
    from collectx.runtime.store import HashStore
    from collectx.schedule.ir import GPU_LANES, MAX_LANES
    from _threads import on_threads
    s = _many_lanes_allgather(MAX_LANES)
    assert len(s.lanes[1]) == MAX_LANES > GPU_LANES and verify(s)
    monkeypatch.setattr(planner, "make_schedule", lambda *args, **kw: s)
    store, count = HashStore(), 1 << 20   # 4 MiB of float32: past the one-step sizes

    def run(rank):
        comm = collectx.init(rank, 2, store=store)
        try:
            x = np.arange(count, dtype=np.float32) + rank * count
            out = np.empty(2 * count, dtype=np.float32)
            comm.allgather(x, out)
            return out
        finally:
            comm.close()
    results, errors = on_threads(2, run)
    assert errors == [None, None]
    for out in results:
        np.testing.assert_array_equal(out, np.arange(2 * count, dtype=np.float32))
