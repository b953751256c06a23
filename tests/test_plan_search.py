"""How packed trees search for their fastest schedule: what is judged, when a climb ends, and
that threads change nothing a plan says."""

from __future__ import annotations

import pytest

import collectx._concurrent as C
import collectx.topology as T
from collectx.planner import plan, program as P, trees
from collectx.planner.api import allocation
from collectx.planner.cost_tables import FILL
from collectx.planner.select import _good_us
from collectx.topology.view import job_graph


class _Fake(str):
    """A schedule's name standing for it; its chunks are the digits after its letter."""

    @property
    def nchunks(self) -> int:
        return int(self[1:])


def _search(times: dict, firsts: dict, ladders: dict, good_us=None):
    """``trees._fastest`` over fake packings: ``times[name]`` is the simulated time of the
    schedule ``name``; returns (chosen name, names judged in order)."""
    judged = []

    def judge(name):
        def run():
            judged.append(name)
            return times[name], _Fake(name)
        return run
    tried = [([lambda n=n: n for n in firsts[k]], [lambda n=n: n for n in ladders[k]])
             for k in firsts]
    return trees._fastest(tried, lambda thunk: judge(thunk()), good_us), judged


def test_every_packing_climbs_until_a_rung_loses_by_more_than_the_rise():
    times = {"a1": 100.0, "a2": 98.0, "a3": 98.2, "a4": 97.0, "a5": 96.0,   # a3: a wobble
             "b1": 101.0, "b2": 99.5, "b3": 100.5, "b4": 90.0}               # b3: +1%, ends
    best, judged = _search(times, {"a": ["a1"], "b": ["b1"]},
                           {"a": ["a2", "a3", "a4", "a5"], "b": ["b2", "b3", "b4"]})
    assert best == "a5"
    assert "b4" not in judged and {"a3", "a4", "a5", "b3"} <= set(judged)


def test_a_packing_behind_at_first_may_still_win_at_more_chunks():
    times = {"a1": 100.0, "a2": 99.0, "b1": 102.0, "b2": 95.0}
    best, _ = _search(times, {"a": ["a1"], "b": ["b1"]}, {"a": ["a2"], "b": ["b2"]})
    assert best == "b2"


def test_no_rung_is_climbed_once_a_schedule_is_good_enough():
    times = {"a1": 100.0, "a2": 90.0, "b1": 104.0, "b2": 80.0}
    best, judged = _search(times, {"a": ["a1"], "b": ["b1"]}, {"a": ["a2"], "b": ["b2"]},
                           good_us=100.0)
    assert best == "a1" and sorted(judged) == ["a1", "b1"]


def test_of_the_good_enough_schedules_the_fewest_chunks_win():
    # Within the pipeline's bound the simulator cannot tell them apart; fewer instructions
    # cost less to ship, decode and run.
    times = {"a1": 100.0, "a2": 95.0, "b1": 96.0, "b4": 90.0}
    best, judged = _search(times, {"a": ["a2", "a1"], "b": ["b1"]}, {"a": [], "b": ["b4"]},
                           good_us=98.0)
    assert best == "b1" and "b4" not in judged   # a2 is faster, but has twice the chunks


def test_ties_keep_the_schedule_judged_first():
    times = {"a1": 100.0, "b1": 100.0}
    assert _search(times, {"a": ["a1"], "b": ["b1"]}, {"a": [], "b": []})[0] == "a1"


def test_good_enough_is_the_bound_plus_the_least_fill():
    # 1 GB broadcast at a 100 GB/s bound: 10,000 us, and 2% more is as good as trees get.
    assert _good_us(100.0, "broadcast", 10**9, 4) == pytest.approx(1e4 * (1 + FILL))
    assert _good_us(None, "broadcast", 10**9, 4) is None


@pytest.mark.parametrize("collective, gpus", [("allreduce", [0, 1, 2, 5]),
                                              ("allgather", [0, 1, 4, 6])])
def test_a_plan_does_not_depend_on_the_thread_count(monkeypatch, collective, gpus):
    # Ranks on different machines must plan the same trees: counts rounded in batches and
    # schedules judged at once give what one thread gives.
    G = T.load("dgx1v")
    runs = []
    for workers in (1, 4):
        monkeypatch.setattr(C, "WORKERS", workers)
        p = plan(G, collective, 1 << 28, gpus=gpus, verify=False)
        runs.append((p.algorithm, p.schedule.n_instructions, p.predicted.time_us))
    assert runs[0] == runs[1]


def test_rounding_in_batches_keeps_the_counts_one_by_one_keeps(monkeypatch):
    # A count is kept only if its trees beat the counts found before it in its batch, as if
    # rounded after them: the kept counts match rounding one count at a time.
    ranks, view = allocation(T.load("dgx1v"), None)
    p = P.problem(job_graph(view, ranks), ranks, "broadcast", host=True)
    lp = P.fractional(p)
    pipe = trees.Pipeline(p, 1 << 30)
    pipe.fit(lp)
    kept = []
    for batch in (1, P.BATCH):
        monkeypatch.setattr(P, "BATCH", batch)
        found = P._found(p, lp, pipe, P.Rounding(p, lp, pipe.level_cost(lp)), None, False)
        kept.append([K for _, K, _, _ in found])
    assert kept[0] == kept[1] and len(kept[0]) > 1

