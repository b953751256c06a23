"""Selection and the cost model: the fastest candidate wins, small messages favour few steps."""

import pytest

import collectx.topology as T
from collectx.errors import NoFeasiblePlan, PlanError
from collectx.planner import plan
from collectx.planner.cost import link_class, steps
from collectx.planner.cost_tables import BASE_US, FILL, LAT_US, alpha_us
from collectx.planner.direct import plan_direct
from collectx.planner.select import choose, predict

import _dumps as dumps

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _ranks(G):
    return tuple(T.gpus(G))


@pytest.mark.parametrize("coll,nbytes", [("allreduce", 8 << 10), ("allreduce", 64 << 20),
                                         ("broadcast", 8 << 10), ("allgather", 16 << 20)])
def test_choice_is_the_fastest_baseline(coll, nbytes):
    G = T.load("dgx1v")
    S = T.subset(G, [0, 1, 2, 3])
    ranks = _ranks(S)
    names = [a for a in ("direct", "ring", "tree") if coll != "allgather" or a != "tree"]
    name, sched, pred = choose(S, ranks, coll, nbytes, algorithms=names)
    assert sched.algorithm == name
    for other in names:
        from collectx.planner.registry import call
        alt = predict(call(other, S, ranks, coll, nbytes), S, nbytes, ranks, other)
        assert pred.time_us <= alt.time_us * (1 + 1e-9), other


def test_small_messages_prefer_fewer_steps_large_prefer_bandwidth():
    G = T.ring(8)
    ranks = _ranks(G)
    small, _, _ = choose(G, ranks, "allreduce", 1 << 10, algorithms=["ring", "tree"])
    large, _, _ = choose(G, ranks, "allreduce", 1 << 30, algorithms=["ring", "tree"])
    assert (small, large) == ("tree", "ring")


def test_predicted_time_includes_latency_terms():
    G = T.switch(4)
    ranks = _ranks(G)
    s = plan_direct(G, ranks, "allreduce", 0)
    p = predict(s, G, 0, ranks, "direct")
    assert p.time_us == pytest.approx(BASE_US["gpu"] + steps(s) * alpha_us("nvlink", "direct"))


def test_plan_reports_a_consistent_prediction():
    p = plan(T.switch(4), "allgather", 1 << 24, algo="ring")
    d = p.to_dict()
    assert d["predicted_algbw_GBps"] == pytest.approx((1 << 24) / d["predicted_time_us"] / 1e3)
    assert d["predicted_busbw_GBps"] == pytest.approx(d["predicted_algbw_GBps"] * 3 / 4)
    assert d["efficiency"] == pytest.approx(d["predicted_busbw_GBps"] / d["bound_busbw_GBps"])


def test_unservable_request_is_no_feasible_plan():
    def refuses(topo, ranks, collective, nbytes, **kw):
        raise PlanError("not today")
    with pytest.raises(NoFeasiblePlan, match="not today"):
        choose(T.switch(2), ("GPU0", "GPU1"), "allreduce", 64, algorithms=[refuses])


def test_link_class_follows_the_widest_route():
    G = T.load("dgx1v")
    ranks = ("GPU0", "GPU5")
    assert link_class(plan_direct(G, ("GPU0", "GPU3"), "allgather", 64), G,
                      ("GPU0", "GPU3")) == "nvlink"
    s = plan_direct(G, ranks, "allgather", 64)
    assert link_class(s, T.subset(G, list(ranks)), ranks) in ("smp", "pcie")
    assert link_class(s, None, ranks) == "shm"


def test_cost_table_is_complete_and_ordered():
    for row in LAT_US.values():
        assert "default" in row and all(v > 0 for v in row.values())
    assert alpha_us("shm", "ring") < alpha_us("nvlink", "ring") < alpha_us("pcie", "ring")


def test_steps_of_a_cyclic_schedule_raise_instead_of_hanging():
    from collectx.errors import DependencyCycle
    from collectx.schedule import Dep, Instr, Lane, Ref, Schedule
    cp = lambda dst, src, deps=(): Instr("copy", dst, (src,), tuple(deps))  # noqa: E731
    s = Schedule("allgather", 2, 1, ((Lane((cp(Ref(0, "output", 0), Ref(0, "input", 0),
                                                [Dep(1, 0, 0)]),)),),
                                     (Lane((cp(Ref(1, "output", 1), Ref(1, "input", 0),
                                                [Dep(0, 0, 0)]),)),)))
    with pytest.raises(DependencyCycle):
        steps(s)


def test_steps_is_the_longest_dependency_chain():
    # Two lanes of 3 and 1 instructions; the single one waits for the end of the long lane.
    from collectx.schedule import Ref, ScheduleBuilder
    b = ScheduleBuilder("allgather", 2, nchunks=1)
    last = None
    for _ in range(3):
        last = b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    b.copy(1, 0, Ref(1, "output", 0), Ref(0, "output", 0), deps=[last])
    assert steps(b.build()) == 4


def test_forest_allreduce_is_not_pruned_by_the_phases_cut():
    """Per-root forests overlap their reduce-scatter and allgather chunk by chunk, so the two
    phases' cut rates do not bound them: on DGX-1V GPUs 0, 1, 4, 6 the forest packing reaches
    the tree packing's rate, well above that cut, and the chooser must try it."""
    from collectx.planner import program
    from collectx.planner.bounds import bounds
    from collectx.topology.view import job_graph
    G = T.load("dgx1v")
    ranks = tuple(T.gpus(G)[i] for i in (0, 1, 4, 6))
    b = bounds(G, "allreduce", ranks)
    lp = program.fractional(program.problem(job_graph(G, ranks), ranks, "allreduce", host=True,
                                            forest=True))
    forest = 2 * (len(ranks) - 1) * lp.rate   # the forest allreduce's busbw at its LP's rate
    assert forest > 1.2 * b.cut_busbw and forest == pytest.approx(b.tree_busbw, rel=1e-3)
    p = plan(G, "allreduce", 1 << 30, gpus=[0, 1, 4, 6], verify=False)
    assert p.efficiency >= 0.95, (p.algorithm, p.efficiency)


@pytest.mark.parametrize("algo,coll", [("blink", "broadcast"), ("forest", "allgather"),
                                       ("forest", "allreduce")])
def test_packed_trees_given_a_time_to_beat_fail_fast_or_plan_as_before(algo, coll,
                                                                        monkeypatch):
    """The chooser hands packed trees the time the best plan so far takes, less the fill
    margin: a packing whose LP cannot move the message in that time, even with the margin
    given back, is refused before any rounding, and a time any packing beats changes
    nothing."""
    from collectx.errors import PlanError
    from collectx.planner import program, registry
    from collectx.planner.api import allocation
    from collectx.schedule.metrics import unit_bytes
    from collectx.topology.view import job_graph
    ranks, view = allocation(T.load("dgx1v"), [0, 1, 2, 5])
    nbytes, n = 1 << 28, len(ranks)
    s = registry.call(algo, view, ranks, coll, nbytes, host=True)
    assert registry.call(algo, view, ranks, coll, nbytes, host=True, beat_us=1e9) == s
    forest = algo == "forest" and coll == "allreduce"
    lp = program.fractional(program.problem(job_graph(view, ranks), ranks, coll, host=True,
                                            forest=forest))
    lp_us = unit_bytes(coll, nbytes, n) / (n if forest else 1) / (lp.rate * 1e3)
    monkeypatch.setattr(program, "equal_trees", None)   # refused by its LP, never rounded
    with pytest.raises(PlanError, match="cannot move the message"):
        registry.call(algo, view, ranks, coll, nbytes, host=True,
                      beat_us=0.99 * lp_us / (1 + FILL))


def test_a_packing_within_the_fill_margin_still_wins_when_its_model_says_so():
    """Two GPUs joined by one NVLink and host staging: the forest's trees are one or two hops
    deep and fill almost nothing, so its LP, within the fill margin of a plan at 0.985 of the
    LP's rate, is rounded all the same and beats it (refused, it left the chooser a blink
    plan at 0.978 of the bound where the forest reaches 0.992)."""
    from collectx.planner import cost, program
    from collectx.planner.api import allocation
    from collectx.planner.select import _to_beat
    from collectx.schedule.metrics import unit_bytes
    from collectx.planner.trees import plan_forest
    from collectx.topology.view import job_graph
    ranks, view = allocation(dumps.load("hgx_a100_8gpu_4nic_nvidia-smi-topo.txt"), [0, 2])
    nbytes = 1 << 30
    lp = program.fractional(program.problem(job_graph(view, ranks), ranks, "allreduce",
                                            host=True, forest=True))
    lp_us = unit_bytes("allreduce", nbytes, 2) / 2 / (lp.rate * 1e3)
    best_us = cost.base_us(view, ranks) + lp_us / 0.985
    beat_us = _to_beat((best_us,), view, ranks)
    assert lp_us > beat_us   # within the margin: only the model's own check lets it through
    forest = plan_forest(view, ranks, "allreduce", nbytes, host=True, beat_us=beat_us)
    assert predict(forest, view, nbytes, ranks, "forest").time_us < best_us


@pytest.mark.parametrize("name,gpus", [("dgx1v", None), ("dgx1v", [0, 1, 2, 5]),
                                       ("dgx1p", [1, 2, 4, 7]), ("pcie_gen4_8gpu", None),
                                       ("dgx_a100", [0, 3, 5])])
@pytest.mark.parametrize("coll", ["broadcast", "reduce"])
@pytest.mark.parametrize("nbytes", [8 << 10, 3 << 20, 1 << 28])
def test_no_direct_schedule_beats_its_least_time(name, gpus, coll, nbytes):
    from collectx.planner.api import allocation
    from collectx.planner.direct import least_us
    from collectx.schedule import simulate
    ranks, view = allocation(T.load(name), gpus)
    root = len(ranks) - 1
    least = least_us(view, ranks, coll, nbytes, root)
    s = plan_direct(view, ranks, coll, nbytes, root=root)
    assert 0 < least <= simulate(s, view, nbytes, ranks=list(ranks)).time_us
    assert least_us(view, ranks, "allgather", nbytes) == 0.0   # no bound: never skipped


@pytest.mark.parametrize("coll,gpus", [("broadcast", None), ("reduce", [0, 1, 2, 5]),
                                       ("broadcast", [1, 2, 4, 7])])
@pytest.mark.parametrize("nbytes", [8 << 10, 1 << 20, 1 << 28])
def test_skipping_direct_by_its_least_time_chooses_as_planning_it_does(monkeypatch, coll,
                                                                       gpus, nbytes):
    import collectx.planner.select as select
    from collectx.planner.api import allocation
    ranks, view = allocation(T.load("dgx1v"), gpus)
    names = ["direct", "ring", "tree"]
    planned = []
    real_call = select.registry.call
    monkeypatch.setattr(select.registry, "call",
                        lambda name, *a, **kw: planned.append(name) or real_call(name, *a, **kw))
    skipping = choose(view, ranks, coll, nbytes, algorithms=names)
    skipped = "direct" not in planned
    monkeypatch.setattr(select.direct, "least_us", lambda *a: 0.0)
    planned.clear()
    every = choose(view, ranks, coll, nbytes, algorithms=names)
    assert "direct" in planned and skipping[0] == every[0]
    assert skipping[2].time_us == every[2].time_us
    if nbytes in (8 << 10, 1 << 28):   # planned where latency decides, not where bandwidth
        assert skipped == (nbytes == 1 << 28)
