"""Packed trees dealt their chunks by the rate each reached in simulation (trees._balanced):
the dealing, what the simulator says of when chunks were delivered, and the search's last step."""

from __future__ import annotations

import dataclasses
import importlib
import math

import numpy as np
import pytest

import collectx.topology as T
from collectx.planner import trees
from collectx.planner.api import allocation
from collectx.planner.cost_tables import NOISE
import collectx.schedule.treesched as ts
from collectx.schedule import verify
from collectx.schedule._taskloop import native_available
from collectx.schedule.ir import PackedSchedule
from test_tree_items import KINDS, NRANKS, _lowered, _packing

sim = importlib.import_module("collectx.schedule.simulate")
needs_native = pytest.mark.skipif(not native_available(), reason="libcollectx not built")
needs_words = pytest.mark.skipif(ts.compiled_helper("lower_words") is None,
                                 reason="no compiled collectx._fastpath")


def _counts(s) -> list:
    """Chunks per tree share, in the schedule's ``trees`` meta order."""
    return [entry[3] for entry in s.meta_dict()["trees"]]


@pytest.mark.parametrize("kind", KINDS)
def test_a_deal_gives_each_tree_its_weight_of_the_chunks(kind):
    packing, modes, collective = _packing(kind, staged=True)
    per_group = 24 if collective == "allreduce" and "forest" in kind else 40
    keys = [key for (_, key), _ in trees._dealt(packing, modes, per_group, {})]
    deal = {key: (1.0, 3.0) for key in keys}   # two trees per group: a quarter, three quarters
    s = trees.lower(packing, modes, collective, NRANKS, per_group, deal=deal)
    verify(s)
    assert _counts(s) == [per_group // 4, 3 * per_group // 4] * (len(_counts(s)) // 2)
    assert _counts(trees.lower(packing, modes, collective, NRANKS, per_group)) == \
        [per_group // 2] * len(_counts(s))


@pytest.mark.parametrize("kind", KINDS)
def test_trees_of_unequal_rates_are_dealt_chunks_by_their_rates(kind):
    packing, modes, collective = _packing(kind, staged=True)
    per_group = 24 if collective == "allreduce" and "forest" in kind else 40
    rated = dataclasses.replace(packing, trees=tuple(
        dataclasses.replace(t, rate=1.0 + 2.0 * (i % 2)) for i, t in enumerate(packing.trees)))
    s = trees.lower(rated, modes, collective, NRANKS, per_group)
    verify(s)
    # a forest allreduce's two ways of a root cut their chunks alike: evenly, without a deal
    want = [per_group // 2] * 2 if kind == "allreduce/forest" else \
        [per_group // 4, 3 * per_group // 4]
    assert _counts(s) == want * (len(_counts(s)) // 2)


@needs_words
@pytest.mark.parametrize("kind", ["broadcast/blink", "allgather/forest", "allreduce/forest"])
def test_the_compiled_emitter_deals_as_the_python_one(kind, monkeypatch):
    packing, modes, collective = _packing(kind, staged=True)
    deal = {key: (2.0, 1.0) for (_, key), _ in trees._dealt(packing, modes, 12, {})}
    words = trees.lower(packing, modes, collective, NRANKS, 12, deal=deal, packed=True)
    monkeypatch.setattr(ts, "compiled_helper", lambda name: None)
    objects = trees.lower(packing, modes, collective, NRANKS, 12, deal=deal)
    assert isinstance(words, PackedSchedule) and words.unpacked() == objects


@needs_native
@pytest.mark.parametrize("kind", ["broadcast/blink", "allgather/forest", "allreduce/forest"])
def test_chunk_ends_are_the_same_from_the_native_and_the_python_loop(kind):
    packing, modes, collective = _packing(kind, staged=True)
    s = _lowered(packing, modes, collective, 12, 2, native=True)
    topo = T.switch(NRANKS)
    native, python = (sim._entry(s, topo, 1 << 24, None, 4, None, flag)[4]()
                      for flag in (True, False))
    assert np.array_equal(native, python)
    # every rank holds every chunk in the end, delivered by the time the run ends
    width = s.nchunks * (NRANKS if collective == "allgather" else 1)
    assert native.shape == (NRANKS, width) and (native > 0).all()
    assert native.max() == pytest.approx(sim.simulate(s, topo, 1 << 24).time_us)


def test_chunk_ends_count_only_output_buffers():
    from collectx.schedule import Ref, ScheduleBuilder
    b = ScheduleBuilder("sendrecv", 2, nchunks=2)
    staged = b.copy(0, 0, Ref(0, "host", 0, 2), Ref(0, "input", 0, 2))
    b.copy(1, 0, Ref(1, "output", 1), Ref(0, "host", 1), deps=[staged])
    ends = sim.chunk_ends(b.build(), T.ring(2, bw=25.0), 50_000_000)
    assert ends.shape == (2, 2) and ends[0].tolist() == [0.0, 0.0] and ends[1, 0] == 0.0
    assert ends[1, 1] > 0.0


def test_trees_are_dealt_chunks_in_proportion_to_the_chunks_they_delivered_per_us():
    packing, modes, collective = _packing("broadcast/blink", staged=False)
    ends = np.zeros((NRANKS, 8))
    ends[:, :4], ends[:, 4:] = 100.0, 200.0   # the first tree's chunks, then the second's
    deal, likely = trees._redealt(packing, modes, collective, NRANKS, 8, {}, ends)
    assert deal == (((0, 0), (0.04, 0.02)),)
    assert likely == pytest.approx(8 / 0.06)   # both would end together at 133 us
    # dealt so, the first tree takes chunks 0-4 (16/3, rounded) and the second 5-7
    dealt = trees._redealt(packing, modes, collective, NRANKS, 8, dict(deal), ends)[0]
    assert dealt == (((0, 0), (5 / 200, 3 / 200)),)
    nothing = trees._redealt(packing, modes, collective, NRANKS, 8, {}, np.zeros((NRANKS, 8)))
    assert nothing == ((), math.inf)


def _passes(deal: tuple) -> int:
    return int(deal[0][1][0]) if deal else 0


class _Found:
    """A try whose ``n``-th deal (a fake lowering's) runs ``times[n]`` us, promising ``likely``."""

    def __init__(self, times: dict, likely: float, name: str = "s"):
        self.times, self.judged, self.name = times, [], name

        class Lower:
            def dealt(self, per_group, deal, ends):
                return (("key", (_passes(deal) + 1.0,)),), likely

            def paced(self, per_group, deal, ends):   # no tree keeps pace (tests/test_tree_pace)
                return ()
        self.at = trees._Try(Lower(), 4, 1, 2)

    def judge(self, at, beat=math.inf):
        def run():   # a run past ``beat`` is given up there
            self.judged.append((_passes(at.deal), beat))
            us = self.times.get(_passes(at.deal), math.inf)
            return min(us, beat * 1.001) if us > beat else us, f"{self.name}{_passes(at.deal)}", at
        return run


def _balanced(times, likely, good=0.0, beat=math.inf):
    f = _Found(times, likely)
    s = trees._balanced([(times[0], "s0", f.at)], f.judge, lambda s: None, good, beat)[1]
    return s, f.judged


def test_a_deal_is_run_where_it_promises_to_gain_and_kept_where_faster():
    s, judged = _balanced({0: 100.0, 1: 99.7}, likely=90.0)   # gains less than NOISE: once
    assert s == "s1" and len(judged) == 1
    s, judged = _balanced({0: 100.0, 1: 98.0, 2: 97.8}, likely=90.0)   # gains more: again
    assert s == "s2" and len(judged) == 2
    s, judged = _balanced({0: 100.0, 1: 101.0}, likely=90.0)   # slower: the first stays
    assert s == "s0" and judged[0][1] == 100.0   # given up once it cannot beat it


def test_no_deal_is_run_where_it_cannot_gain_or_cannot_win():
    assert _balanced({0: 100.0, 1: 90.0}, likely=100.0 * (1 - NOISE)) == ("s0", [])
    assert _balanced({0: 100.0, 1: 90.0}, likely=90.0, good=100.0) == ("s0", [])
    assert _balanced({0: 100.0, 1: 90.0}, likely=95.0, beat=95.0) == ("s0", [])
    s, judged = _balanced({0: 100.0, 1: 93.0}, likely=90.0, beat=95.0)   # beats the other plan
    assert s == "s1" and judged[0][1] == 95.0


def test_where_no_deal_of_the_fastest_gains_the_fewest_chunks_near_it_are_dealt_anew():
    def balanced(fewer_dealt_us):
        fastest, fewer = _Found({0: 100.0, 1: 101.0}, 90.0, "a"), \
            _Found({0: 100.3, 1: fewer_dealt_us}, 90.0, "b")
        judge = lambda at, beat=math.inf: (  # noqa: E731
            fastest if at.lower is fastest.at.lower else fewer).judge(at, beat)
        found = [(100.0, "a0", fastest.at), (100.3, "b0", fewer.at)]
        return trees._balanced(found, judge, lambda s: None, 0.0, math.inf)[1], fewer.judged
    s, judged = balanced(98.0)   # beats the fastest: kept
    assert s == "b1" and judged[0] == (1, 100.0)   # given up once it cannot beat the fastest
    s, _ = balanced(100.2)       # gains on its own schedule, not on the fastest: not kept
    assert s == "a0"


@needs_native
def test_a_packed_plan_dealt_by_its_trees_rates_is_faster_than_dealt_evenly(monkeypatch):
    ranks, view = allocation(T.load("dgx1v"), [0, 1, 2, 3])
    args = (view, ranks, "broadcast", 1 << 26)
    balanced = trees.plan_blink(*args, host=True)
    monkeypatch.setattr(trees, "_balanced", lambda found, *rest: found[0])
    even = trees.plan_blink(*args, host=True)
    verify(balanced)
    assert len(set(_counts(even))) == 1 and len(set(_counts(balanced))) > 1
    assert sum(_counts(balanced)) == sum(_counts(even))
    times = [sim.simulate(s, view, 1 << 26, ranks=list(ranks)).time_us for s in (balanced, even)]
    assert times[0] < times[1]
