"""The planner's front door: allocation checks, forced algorithms, Plan fields, make_schedule."""

import json

import numpy as np
import pytest

import collectx.topology as T
from collectx.errors import ArgumentError, NoFeasiblePlan, PlanError, TopologyError
from collectx.planner import ALGORITHMS, Plan, make_schedule, plan
from collectx.schedule.ir import Schedule

JSON_FIELDS = {"collective", "ranks", "algorithm", "nbytes", "predicted_time_us",
               "predicted_algbw_GBps", "predicted_busbw_GBps", "bound_busbw_GBps",
               "ceiling_busbw_GBps", "efficiency", "no_communication", "planning_time_s",
               "verified", "verify_time_s", "schedule"}


def test_plan_forced_direct_on_switch():
    p = plan(T.switch(4), "allreduce", 1 << 20, algo="direct")
    assert isinstance(p, Plan) and p.algorithm == "direct" and p.verified
    assert p.ranks == ("GPU0", "GPU1", "GPU2", "GPU3") and p.schedule.nranks == 4
    d = json.loads(json.dumps(p.to_dict()))
    assert set(d) == JSON_FIELDS
    assert Schedule.from_dict(d["schedule"]) == p.schedule
    assert d["ranks"] == list(p.ranks) and d["nbytes"] == 1 << 20


def test_verification_is_timed_apart_from_planning(monkeypatch):
    import types

    import collectx.planner.api as api
    real = api._verify
    clock = [100.0]   # a clock that moves only while the schedule is verified

    def slow_verify(schedule):
        clock[0] += 5.0
        return real(schedule)
    monkeypatch.setattr(api, "_verify", slow_verify)
    monkeypatch.setattr(api, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    checked = plan(T.switch(4), "allreduce", 1 << 20, algo="direct")
    assert checked.verified and checked.verify_time_s == 5.0 and checked.planning_time_s == 0.0
    unchecked = plan(T.switch(4), "allreduce", 1 << 20, algo="direct", verify=False)
    assert not unchecked.verified and unchecked.verify_time_s == 0.0


def test_plan_gpu_ids_and_indices_pick_the_same_ranks():
    G = T.load("dgx1v")
    a = plan(G, "allgather", 4096, gpus=[0, 3, 5], algo="direct")
    b = plan(G, "allgather", 4096, gpus=["GPU0", "GPU3", "GPU5"], algo="direct")
    assert a.ranks == b.ranks == ("GPU0", "GPU3", "GPU5")
    assert a.schedule == b.schedule


def test_plan_accepts_a_planner_callable():
    from collectx.planner.direct import plan_direct
    p = plan(T.switch(3), "broadcast", 64, algo=plan_direct, root=2)
    assert p.algorithm == "direct" and p.schedule.root == 2


@pytest.mark.parametrize("gpus,err,match", [
    ([0, 0], TopologyError, "twice"),
    (["GPU9"], TopologyError, "GPU9"),
    ([7], TopologyError, "out of range"),
    ([], PlanError, "empty"),
    ("GPU0", ArgumentError, r"\['GPU0'\]"),   # a string is not read letter by letter
])
def test_bad_allocations(gpus, err, match):
    with pytest.raises(err, match=match):
        plan(T.switch(4), "allreduce", 64, gpus=gpus)


def test_disconnected_allocation_is_no_feasible_plan():
    # On a line, dropping the middle GPU cuts the two ends apart.
    with pytest.raises(NoFeasiblePlan, match="cannot reach"):
        plan(T.line(3), "allreduce", 64, gpus=[0, 2])


@pytest.mark.parametrize("kw,match", [({"algo": "magic"}, "unknown algorithm"),
                                      ({"root": 9}, "root"),
                                      ({"algo": "direct", "inplace": True}, "in-place"),
                                      ({"nchunks": 0}, "nchunks=0: expected a positive"),
                                      ({"nchunks": 2.0}, "nchunks=2.0"),
                                      ({"root": True}, "root=True"),   # not rank 1
                                      ({"nchunks": True}, "nchunks=True")])
def test_bad_requests(kw, match):
    with pytest.raises(PlanError, match=match):
        plan(T.switch(3), "alltoall", 64, **kw)


def test_numpy_integers_are_sizes_roots_and_gpu_indices():
    # what np.prod(shape) * itemsize and np.arange give: the same plan as Python ints
    a = plan(T.switch(4), "broadcast", np.int64(1 << 16), gpus=np.arange(1, 4), root=np.int64(2))
    b = plan(T.switch(4), "broadcast", 1 << 16, gpus=[1, 2, 3], root=2)
    assert a.ranks == b.ranks == ("GPU1", "GPU2", "GPU3")
    assert type(a.nbytes) is int and a.schedule == b.schedule


def test_unknown_collective_and_bad_size():
    with pytest.raises(PlanError, match="unknown collective"):
        plan(T.switch(2), "gather", 64)
    with pytest.raises(PlanError, match="nbytes"):
        plan(T.switch(2), "allreduce", -1)


def test_make_schedule_for_the_runtime():
    s = make_schedule(T.host(4), "allreduce", 4, 1 << 20)
    assert s.nranks == 4 and s.collective == "allreduce"
    assert make_schedule(None, "reduce", 3, 64, root=1).root == 1
    with pytest.raises(PlanError, match="ranks"):
        make_schedule(T.switch(2), "allreduce", 3, 64)


def test_one_host_of_cpu_ranks_is_planned_one_hop():
    assert make_schedule(T.host(4), "allreduce", 4, 1 << 30).algorithm == "direct"


def test_runtime_and_plan_make_the_same_choice():
    G = T.load("dgx1v")
    chosen = plan(G, "allgather", 1 << 28, gpus=[0, 1, 2, 3], verify=False).schedule
    assert make_schedule(G, "allgather", 4, 1 << 28) == chosen


def test_registry_has_direct_for_every_collective():
    from collectx.planner import candidates
    from collectx.schedule.ir import COLLECTIVES
    assert "direct" in ALGORITHMS
    assert all("direct" in candidates(c) for c in COLLECTIVES)


def test_sendrecv_bound_is_the_max_flow_between_the_pair():
    p = plan(T.load("dgx1v"), "sendrecv", 1 << 20, gpus=[0, 3], algo="direct")
    assert p.bound.bound_busbw == pytest.approx(50.0 + 15.75)  # NVLink pair plus PCIe
    assert p.schedule.root == 0


def test_make_schedule_without_topology_serves_every_algorithm():
    for algo in ("direct", "ring", "tree"):
        s = make_schedule(None, "broadcast", 3, 1 << 20, algo=algo, root=2)
        assert s.algorithm == algo and s.root == 2


def test_a_plan_keeps_no_candidate_schedule_alive_after_it_returns():
    # The simulator remembers the schedules it saw while planning; kept past the plan, the
    # next plan paid for freeing them (and ran slower in a row).
    import sys
    seen = sys.modules["collectx.schedule.simulate"]._SEEN
    p = plan(T.load("dgx1p"), "allreduce", 1 << 30, gpus=[0, 2, 4, 6], verify=False)
    assert p.algorithm in ("blink+host", "forest+host") and not seen   # packed: many simulated
    make_schedule(T.load("dgx1p"), "allgather", 4, 1 << 30)
    assert not seen
