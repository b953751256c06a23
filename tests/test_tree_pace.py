"""Trees that keep pace (``Share.pace``, trees._kept_pace): a broadcast's root children take a
piece only once an earlier piece reached the tree's slowest node, so that the branches that
could run ahead leave that node's transfers the bandwidth the packing gave them."""

from __future__ import annotations

import math

import numpy as np
import pytest

import collectx.topology as T
from collectx.planner import plan, trees
from collectx.schedule import Ref, ScheduleBuilder, verify
from collectx.schedule._taskloop import native_available
from collectx.schedule.ir import PackedSchedule
import collectx.schedule.treesched as ts
from test_bounds import with_planes
from test_tree_items import NRANKS, _packing

needs_native = pytest.mark.skipif(not native_available(), reason="libcollectx not built")
needs_words = pytest.mark.skipif(ts.compiled_helper("lower_words") is None,
                                 reason="no compiled collectx._fastpath")

CHAIN = ((0, 1), (1, 2), (0, 3))   # rank 2 two levels below the root, 1 and 3 one


def test_a_share_lags_its_pace_node_by_that_nodes_depth():
    share = lambda pace: ts.Share(0, CHAIN, (0, 1, 2), pace=pace)  # noqa: E731
    assert [share(p).lag() for p in (2, 1, 3, 0, -1)] == [2, 1, 1, 0, 0]
    assert ts.Share(0, CHAIN, (0,), pace=4).lag() == 0   # not in the tree: no pace


def _broadcast(pace: int, buffers: int = 1, chunks: int = 6):
    b = ScheduleBuilder("broadcast", 4, nchunks=chunks, root=0)
    em = ts.TreeEmitter(b, buffers=buffers)
    em.self_copy(0, Ref(0, "output", 0, chunks), Ref(0, "input", 0, chunks))
    em.broadcast([ts.Share(0, CHAIN, tuple(range(chunks)), pace=pace)],
                 src=ts.chunk_refs("input"), dst=ts.chunk_refs("output"))
    em.flush()
    return b.build()


def _writers(s) -> dict:
    """``{(rank, chunk): ((rank, lane, index), deps)}`` of the copies into outputs."""
    out = {}
    for rank, lanes in enumerate(s.lanes):
        for lane, l in enumerate(lanes):
            for index, ins in enumerate(l.instrs):
                for c in range(ins.dst.chunk, ins.dst.chunk + ins.dst.count):
                    out[rank, c] = ((rank, lane, index), set(ins.deps))
    return out


@pytest.mark.parametrize("buffers", [1, 2])
def test_the_root_children_wait_for_the_piece_lag_before_at_the_pace_node(buffers):
    s = _broadcast(pace=2, buffers=buffers)
    verify(s)
    written = _writers(s)
    lag = 2 * buffers   # rank 2's depth, pieces per lane of each edge
    pieces = ts.TreeEmitter.pieces(ts.TreeEmitter(ScheduleBuilder("broadcast", 4, 6), buffers),
                                   ts.Share(0, CHAIN, tuple(range(6))))
    for i, (j, _) in enumerate(pieces):
        at_pace = written[2, pieces[i - lag][0]][0] if i >= lag else None
        for child in (1, 3):   # the root's children
            assert (at_pace in written[child, j][1]) == (at_pace is not None)
        # below the root nothing waits on the pace node: rank 2 only on its parent
        assert len(written[2, j][1]) == 1
    assert all(not deps for (rank, _), (_, deps) in _writers(_broadcast(-1)).items()
               if rank in (1, 3))   # without a pace the root's children wait on nothing


@needs_words
@pytest.mark.parametrize("kind", ["broadcast/blink", "allgather/forest", "allreduce/forest",
                                  "allreduce/blink"])
@pytest.mark.parametrize("buffers", [1, 2])
def test_the_compiled_emitter_keeps_pace_as_the_python_one(kind, buffers, monkeypatch):
    packing, modes, collective = _packing(kind, staged=True)
    pace = {g: tuple(t.edges[-1][1] for t, _ in dealt)   # each tree's last node
            for (g, _), dealt in trees._dealt(packing, modes, 48, {})}
    words = trees.lower(packing, modes, collective, NRANKS, 48, pace=pace, packed=True,
                        buffers=buffers)
    monkeypatch.setattr(ts, "compiled_helper", lambda name: None)
    objects = trees.lower(packing, modes, collective, NRANKS, 48, pace=pace, buffers=buffers)
    verify(objects)
    assert isinstance(words, PackedSchedule) and words.unpacked() == objects
    assert objects != trees.lower(packing, modes, collective, NRANKS, 48, buffers=buffers)


def test_each_tree_keeps_pace_with_the_node_that_received_its_chunks_last():
    packing, modes, collective = _packing("broadcast/blink", staged=False)
    dealt = next(iter(trees._dealt(packing, modes, 8, {})))[1]
    ends = np.zeros((NRANKS, 8))
    for number, (t, chunks) in enumerate(dealt):
        for rank in range(NRANKS):   # the first tree's last node is its highest, the other's
            ends[rank, list(chunks)] = 10.0 + (rank if number == 0 else -rank)   # its lowest
    nodes = [sorted(c for _, c in t.edges) for t, _ in dealt]
    assert trees._laggards(packing, modes, collective, 8, {}, ends) == \
        ((0, (nodes[0][-1], nodes[1][0])),)
    reduce_packing, reduce_modes, _ = _packing("reduce/blink", staged=False)
    nothing_broadcasts = trees._laggards(reduce_packing, reduce_modes, "reduce", 8, {}, ends)
    assert nothing_broadcasts == ()
    even = np.full((NRANKS, 8), 100.0)
    even[0, 0] = 101.0   # a root's own copy, not received: no tree lags by more than FILL
    even[1, :] += np.arange(8) * 0.1
    assert trees._laggards(packing, modes, collective, 8, {}, even) == ()


class _Lower:
    """A fake packing's lowering: ``rate`` (the time at its rate, below), ``buffers`` (lanes
    per edge that fit) and what its paced runs take, ``paced_us``."""

    def __init__(self, paced_us: float, rate: float = 50.0, buffers: int = 1):
        self.paced_us, self.rate, self.buffers = paced_us, rate, buffers

    def paced(self, per_group, deal, ends):
        return ((0, (3,)),)


class _Paced:
    """A try whose paced run (a fake lowering's) takes ``paced_us``."""

    def __init__(self, paced_us: float):
        self.at, self.judged = trees._Try(_Lower(paced_us), 4, 1, 1), []

    def judge(self, at, beat=math.inf):
        def run():
            self.judged.append((at.pace, beat))
            return min(at.lower.paced_us, beat), f"paced {at.lower.rate}", at
        return run


@pytest.mark.parametrize("paced_us, good_us, kept, judged", [
    (90.0, 0.0, "paced", 1),        # faster: kept
    (100.0, 0.0, "s", 1),           # no faster: the run it was made from stays
    (90.0, 100.0, "s", 0),          # as fast as its trees get already: never judged
])
def test_a_paced_run_is_judged_where_the_run_is_slow_and_kept_where_faster(
        paced_us, good_us, kept, judged):
    f = _Paced(paced_us)
    assert trees._kept_pace((100.0, "s", f.at), f.judge, lambda s: None, good_us,
                            math.inf)[1] in (kept, f"{kept} 50.0")
    assert len(f.judged) == judged and all(pace == ((0, (3,)),) for pace, _ in f.judged)


def _other(us: float, rate: float, paced_us: float) -> tuple:
    """Another packing's fastest run: ``us``, its packing's ``rate`` (``_at_rate``: 1000 / rate
    microseconds), and ``paced_us`` where its trees keep pace."""
    return us, "o", trees._Try(_Lower(paced_us, rate), 4, 1, 1)


def _at_rate(at) -> float:
    return 1000.0 / at.lower.rate


@pytest.mark.parametrize("others, kept, beats", [
    ([_other(104.0, 12.5, 80.0)], "paced 12.5", [100.0, 100.0]),   # may beat 100 us: kept
    ([_other(104.0, 12.5, 100.0)], "s", [100.0, 100.0]),   # judged, no faster: not kept
    ([_other(101.0, 10.0, 70.0)], "s", [100.0]),   # 100 us at its rate: cannot beat 100
    ([_other(100.5, 10.05, 70.0)], "s", [100.0]),   # within FILL of its rate: nothing ran ahead
])
def test_another_packings_run_keeps_pace_where_its_rate_may_beat_the_fastest(
        others, kept, beats):
    f = _Paced(100.0)   # the fastest run's own trees keeping pace gain nothing
    got = trees._kept_pace((100.0, "s", f.at), f.judge, lambda s: None, 0.0, math.inf,
                           others, _at_rate)[1]
    assert got == kept and [beat for _, beat in f.judged] == beats


def test_another_packings_paced_run_takes_the_lanes_its_trees_fit():
    f = _Paced(100.0)
    f.at = trees._Try(_Lower(100.0, buffers=2), 4, 1, 1)   # won on one lane of two that fit
    judged = []
    judge = lambda at, beat=math.inf: judged.append(at.buffers) or f.judge(at, beat)  # noqa
    other = (104.0, "o", trees._Try(_Lower(80.0, 12.5, buffers=2), 4, 1, 1))
    assert trees._kept_pace((100.0, "s", f.at), judge, lambda s: None, 0.0, math.inf,
                            [other], _at_rate)[1] == "paced 12.5"
    assert judged == [1, 2]   # the chosen keeps its lanes; the other keeps a piece in flight


def _uneven_planes():
    """Two sockets of two PCIe switches of two GPUs, and two NVSwitch planes, GPU5 on one:
    GPU5's receive (its plane plus host staging over PCIe) bounds an allgather, and every
    other transfer crosses links that GPU5's share too."""
    return with_planes(T.pcie_tree(2, 2, 2, pcie_bw=31.5, smp_bw=20.0), 2, missing=((5, 1),))


@needs_native
def test_trees_that_keep_pace_reach_the_bound_where_free_branches_starve_one_gpu(monkeypatch):
    G = _uneven_planes()
    paced = plan(G, "allgather", 1 << 30)
    monkeypatch.setattr(trees, "_kept_pace", lambda found, *rest: found)
    free = plan(G, "allgather", 1 << 30, verify=False)
    assert paced.summary()["algorithm"] == free.summary()["algorithm"] == "forest+host"
    assert paced.summary()["efficiency"] >= 0.95 > 0.9 > free.summary()["efficiency"]


@needs_native
def test_another_packings_trees_keep_pace_where_the_fastest_run_as_it_was_falls_short(
        monkeypatch):
    # four GPUs on four NVSwitch planes, GPU0 on three, GPU3 on two: every root's shard
    # reaches GPU3 over its two links and PCIe, which the LP's rate fills. In every packing's
    # run the branches to GPUs 0-2 run ahead, and it misses its rate; kept at pace, the one
    # that ran fastest as it was gains less than another does.
    G = with_planes(T.pcie_tree(1, 1, 4, pcie_bw=15.75, smp_bw=20.0), 4,
                    missing=((0, 0), (3, 1), (3, 2)), bw=100.0)
    paced = plan(G, "allgather", 1 << 30, verify=False)
    kept_pace = trees._kept_pace
    monkeypatch.setattr(trees, "_kept_pace", lambda found, judge, ends, good, beat, *others:
                        kept_pace(found, judge, ends, good, beat))
    own = plan(G, "allgather", 1 << 30, verify=False)
    assert paced.summary()["algorithm"] == own.summary()["algorithm"] == "forest+host"
    assert paced.efficiency >= 0.98 > own.efficiency + 0.01


def _unequal_planes():
    """A PCIe tree of eight GPUs and four NVSwitch planes that the GPUs reach over zero, one
    or two 50 GB/s links each (drawn by ``perf/generalization.py --families irregular --seed
    4242``). Of GPUs 0-3 and 5, GPU5 reaches two planes only, which bounds an allgather,
    and GPU0's three planes bind too in the LP's first optimum."""
    G = T.pcie_tree(1, 4, 2, pcie_bw=15.75, smp_bw=40.0)
    links = {0: (0, 2, 1, 2), 1: (2, 2, 2, 2), 2: (1, 2, 2, 2), 3: (2, 2, 0, 1),
             4: (1, 0, 2, 2), 5: (2, 0, 0, 2), 6: (2, 2, 2, 2), 7: (2, 2, 1, 2)}
    for k in range(4):
        T.add_node(G, f"NVS{k}", "nvswitch")
        for g, counts in links.items():
            if counts[k]:
                T.add_link(G, f"GPU{g}", f"NVS{k}", "nvlink", 50.0 * counts[k])
    return G


@needs_native
def test_links_the_rate_does_not_need_keep_room_for_transfers_that_run_ahead(monkeypatch):
    G, gpus = _unequal_planes(), [0, 1, 2, 3, 5]
    roomy = plan(G, "allgather", 1 << 30, gpus=gpus, host_relays=False, verify=False)
    monkeypatch.setattr(trees.P, "roomy", trees.P.solved)
    full = plan(G, "allgather", 1 << 30, gpus=gpus, host_relays=False, verify=False)
    assert roomy.summary()["algorithm"] == full.summary()["algorithm"] == "forest"
    assert roomy.efficiency >= 0.955 > 0.945 > full.efficiency
