"""Trees with lanes of their own: a tree gets lanes in proportion to its share of the chunks."""

from __future__ import annotations

import collectx.topology as topo
from collectx.planner.blink import plan_blink
from collectx.topology.view import job_gpus
from collectx.planner.select import upper_busbw
from collectx.planner.treesched import Share, TreeEmitter
from collectx.schedule import ScheduleBuilder, simulate, verify


def _lanes_used(tree_lanes: int) -> list[int]:
    counts = (8, 2, 4)
    firsts = (0, 8, 10)
    shares = [Share(0, ((0, 1),), tuple(range(f, f + n))) for f, n in zip(firsts, counts)]
    em = TreeEmitter(ScheduleBuilder("broadcast", 2, sum(counts)), 1, tree_lanes=tree_lanes)
    key = em._tree_keys(shares)
    return [len({key(s, i) for i in range(len(s.chunks))}) for s in shares]


def test_trees_take_lanes_in_proportion_to_their_chunks():
    assert _lanes_used(4) == [4, 1, 2]
    assert _lanes_used(2) == [2, 1, 2]
    assert _lanes_used(1) == [1, 1, 1]


def test_unequal_trees_reach_near_their_packing_rate():
    # Seven DGX-1V GPUs without GPU5: the packing's eight trees run at 25, 12.5 and 6.25 GB/s.
    # With every tree on one lane per link the links split evenly between the trees that meet
    # there and the allreduce reached 0.84 of the packing's rate (0.72 with shared lanes);
    # with lanes in proportion, 0.88.
    G = topo.load("dgx1v")
    gpus = job_gpus(G)
    ranks = tuple(gpus[i] for i in (0, 1, 2, 3, 4, 6, 7))
    view = G.copy()
    view.remove_node(gpus[5])   # another job's GPU relays nothing
    s = plan_blink(view, ranks, "allreduce", 1 << 30)
    verify(s)
    busbw = simulate(s, view, 1 << 30, ranks=list(ranks)).busbw_GBps
    assert busbw >= 0.87 * upper_busbw(s, len(ranks))


def test_unequal_broadcast_trees_take_a_lane_each_where_that_is_faster():
    # Seven DGX-1V GPUs without GPU2, broadcast from GPU0 over four NVLink trees: lanes per
    # link shared in pipeline order reached 0.936 of the packing's rate, a lane per tree 0.965.
    G = topo.load("dgx1v")
    gpus = job_gpus(G)
    ranks = tuple(gpus[i] for i in (0, 1, 3, 4, 5, 6, 7))
    view = G.copy()
    view.remove_node(gpus[2])
    s = plan_blink(view, ranks, "broadcast", 1 << 30)
    verify(s)
    busbw = simulate(s, view, 1 << 30, ranks=list(ranks)).busbw_GBps
    assert busbw >= 0.955 * s.meta_dict()["rate_gbps"]


def test_tree_plans_stay_within_the_executors_lanes():
    # The CPU and CUDA executors run at most 64 lanes per rank; tree plans with many trees on
    # lanes of their own (16-GCD MI250, DGX-1 packings with host edges) fold extra keys onto
    # shared lanes instead of exceeding that.
    from collectx.planner import plan
    from collectx.runtime.executor import MAX_LANES
    cases = [("mi250_16gcd", None, "allreduce"), ("mi250_16gcd", None, "allgather"),
             ("dgx1v", [0, 1, 2, 3, 5], "allreduce"), ("dgx1p", [0, 2, 4, 5], "allreduce"),
             ("dgx1v", [0, 1, 3, 4, 6, 7], "allgather")]
    for name, gpus, coll in cases:
        s = plan(topo.load(name), coll, 1 << 30, gpus=gpus).schedule
        assert max(len(lanes) for lanes in s.lanes) <= MAX_LANES, (name, gpus, coll)


def test_the_lane_limit_matches_both_native_executors():
    import re
    from pathlib import Path
    from collectx.schedule.ir import MAX_LANES
    include = Path(__file__).resolve().parents[1] / "native" / "include"
    for header, name in (("cx_executor.h", "CX_EXEC_MAX_LANES"),
                         ("cx_cuda_exec.h", "CX_CUDA_MAX_LANES")):
        found = re.search(rf"#define {name} (\d+)", (include / header).read_text())
        assert found and int(found.group(1)) == MAX_LANES, header


def _reduce_then_broadcast(up_sublanes):
    """Lanes of rank 0 after it reduces six chunks from ranks 1 and 2 and sends them back."""
    from collectx.planner.treesched import chunk_refs
    b = ScheduleBuilder("allreduce", 3, 6)
    em = TreeEmitter(b, 1, up_sublanes=up_sublanes)
    share = Share(0, ((0, 1), (0, 2)), tuple(range(6)))
    done = em.reduce([share], contrib=chunk_refs("input"), result=chunk_refs("output"))
    em.broadcast([share], src=chunk_refs("output"), dst=chunk_refs("output"), after=done)
    em.flush()
    s = b.build()
    verify(s)
    return s


def test_reductions_take_their_own_count_of_lanes(monkeypatch):
    import collectx.planner.treesched as ts
    for native in (True, False):
        if not native:
            monkeypatch.setattr(ts, "compiled_helper", lambda name: None)
        reducing = [len(lane.instrs) for lane in _reduce_then_broadcast(3).lanes[0]]
        assert reducing == [2, 2, 2], native   # rank 0 only reduces, over three lanes
        sending = [len(lane.instrs) for lane in _reduce_then_broadcast(3).lanes[1]]
        assert sending == [6], native          # rank 1 pulls each chunk back on one lane
        assert [len(lane.instrs) for lane in _reduce_then_broadcast(None).lanes[0]] == [6]


def _plans_of_tree_emitters():
    """Tree plans that exercise every kind of lane key: shared and per-root lanes, trees with
    lanes of their own, staggered runs, staged copies through host memory, and (the full
    DGX-1V allreduce: 91 keys on a rank) more keys than lanes."""
    from collectx.planner import plan
    G = topo.load("dgx1v")
    return [plan(G, coll, 1 << 30, gpus=gpus, verify=False).schedule
            for coll, gpus in (("allreduce", [0, 2, 3, 4, 5, 7]), ("allgather", [0, 1, 3, 4, 5, 7]),
                               ("broadcast", [0, 1, 2, 3, 5, 6, 7]), ("allreduce", None))]


def test_the_c_dealer_emits_what_the_python_loop_emits(monkeypatch):
    import pytest

    import collectx.planner.treesched as ts
    if ts.compiled_helper("emit_lanes") is None:
        pytest.skip("no compiled collectx._fastpath")
    native = _plans_of_tree_emitters()
    assert any(s.uses_host for s in native) and any(s.meta_dict().get("stagger") for s in native)
    monkeypatch.setattr(ts, "compiled_helper", lambda name: None)
    assert [s.to_dict() for s in _plans_of_tree_emitters()] == [s.to_dict() for s in native]


def test_the_c_dealer_refuses_an_item_waiting_for_a_later_one():
    import pytest

    from collectx.planner.treesched import ONE_LANE_TAGS, compiled_helper
    from collectx.schedule.ir import Dep, Instr, Ref
    deal = compiled_helper("emit_lanes")
    if deal is None:
        pytest.skip("no compiled collectx._fastpath")
    ref = Ref(0, "output", 0)
    items = [(0.0, 1, 0, ("down", 0), "copy", ref, (ref,), (0,)),
             (1.0, 0, 1, ("down", 0), "copy", ref, (ref,), ())]
    with pytest.raises(ValueError, match="names no item appended before"):
        deal(items, [[], []], [{}, {}], 3, 64, dict.fromkeys(ONE_LANE_TAGS, 1), Instr, Dep)
    with pytest.raises(ValueError, match="new seq"):
        deal([items[1], items[1]], [[], []], [{}, {}], 3, 64, dict.fromkeys(ONE_LANE_TAGS, 1),
             Instr, Dep)
