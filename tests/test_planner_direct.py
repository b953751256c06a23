"""The one-hop planner: every collective, 1..16 ranks, in place and not, passes verify."""

import dataclasses

import pytest

from collectx.errors import PlanError, ScheduleError
from collectx.planner.direct import MAX_COPY_LANES, plan_direct
from collectx.schedule.ir import COLLECTIVES, Lane, alias
from collectx.schedule.verify import verify

NAMES = tuple(f"R{i}" for i in range(16))


def _cases():
    for coll in COLLECTIVES:
        for inplace in (False, True):
            if inplace and coll == "alltoall":
                continue
            yield coll, inplace


@pytest.mark.parametrize("coll,inplace", list(_cases()))
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 16])
def test_direct_verifies(coll, inplace, n):
    for nchunks in (None, 1, 2 * n + 1):
        for root in sorted({0, n - 1}):
            s = plan_direct(None, NAMES[:n], coll, 1 << 20, root=root, inplace=inplace,
                            nchunks=nchunks)
            assert s.algorithm == "direct" and s.inplace == inplace
            verify(s)


@pytest.mark.parametrize("n", [4, 7])
def test_allreduce_is_two_steps_with_one_nary_reduce_per_rank(n):
    s = plan_direct(None, NAMES[:n], "allreduce", 1 << 20)
    for r, lanes in enumerate(s.lanes):
        reduces = [i for lane in lanes for i in lane.instrs if i.op == "reduce"]
        assert len(reduces) == 1 and len(reduces[0].srcs) == n
        copies = [i for lane in lanes for i in lane.instrs if i.op == "copy"]
        assert len(copies) == n - 1
        # pull: every instruction a rank runs writes that rank's own buffers
        assert all(i.dst.rank == r for lane in lanes for i in lane.instrs)
    assert len(s.lanes[0]) == min(n - 1, MAX_COPY_LANES)


def test_inplace_drops_self_copies():
    out = plan_direct(None, NAMES[:4], "allgather", 64)
    inp = plan_direct(None, NAMES[:4], "allgather", 64, inplace=True)
    assert inp.n_instructions == out.n_instructions - 4
    for _, ins in inp.instructions():
        assert alias(inp, ins.dst) != alias(inp, ins.srcs[0])


def test_single_rank_is_a_local_copy():
    s = plan_direct(None, NAMES[:1], "allreduce", 64)
    (ins,) = [i for _, i in s.instructions()]
    assert ins.op == "copy" and ins.srcs[0].buf == "input" and ins.dst.buf == "output"
    assert plan_direct(None, NAMES[:1], "allreduce", 64, inplace=True).n_instructions == 0


def test_broadcast_root_sends_each_byte_once_for_more_than_two_ranks():
    n = 6
    s = plan_direct(None, NAMES[:n], "broadcast", 1 << 20, root=2)
    from_root = sum(ref.count for d, ins in s.instructions() if d.rank != 2
                    for ref in ins.srcs if ref.rank == 2)
    # the payload scattered once among the n - 1 others, who relay it
    assert from_root == s.nchunks


def test_dropping_dependencies_is_caught_by_verify():
    s = plan_direct(None, NAMES[:3], "allreduce", 64)
    lanes = tuple(tuple(Lane(tuple(i._replace(deps=()) for i in lane.instrs))
                        for lane in rl) for rl in s.lanes)
    with pytest.raises(ScheduleError):
        verify(dataclasses.replace(s, lanes=lanes))


@pytest.mark.parametrize("kw,match", [({"root": 3}, "root"), ({"nchunks": 0}, "nchunks"),
                                      ({"inplace": True}, "alltoall")])
def test_bad_arguments(kw, match):
    with pytest.raises(PlanError, match=match):
        plan_direct(None, NAMES[:3], "alltoall", 64, **kw)


def test_unknown_collective():
    with pytest.raises(PlanError, match="unknown collective"):
        plan_direct(None, NAMES[:3], "allscatter", 64)
