"""verify(): hand-written correct schedules pass; each kind of mistake is caught and named."""

import time

import pytest

from collectx.errors import (DataRace, DependencyCycle, MalformedSchedule, ReadBeforeWrite,
                             ScheduleError, WrongResult)
from collectx.schedule import Dep, Instr, Lane, Ref, Schedule, ScheduleBuilder, verify


# -- schedule makers -----------------------------------------------------------------------------
def allgather_direct(n, nchunks=2, inplace=False, skip=None):
    """Every rank pushes its whole input into every rank's output slot; ``skip`` drops a push."""
    b = ScheduleBuilder("allgather", n, nchunks, inplace=inplace, algorithm="direct")
    for r in range(n):
        for q in range(n):
            if (r, q) == skip or (inplace and q == r):
                continue
            b.copy(r, 0, dst=Ref(q, "output", r * nchunks, nchunks),
                   src=Ref(r, "input", 0, nchunks))
    return b.build()


def ring_allreduce(n, seg=1, lanes=1, inplace=False):
    """Pull-based ring allreduce: reduce-scatter then allgather, ``seg`` chunks per ring slot.

    Rank q reads its predecessor p = q-1. Reduce-scatter step s: q's block (q-1-s) = q's input
    + p's partial (p's input at s == 0). Allgather step t: q copies block (q-t) from p. q
    overwrites block (q-t) at allgather step t after q+1 read it (reduce-scatter step t of q+1);
    the chain of data dependencies around the ring already orders the two, which verify proves.
    """
    b = ScheduleBuilder("allreduce", n, n * seg, inplace=inplace, algorithm="ring")
    rs, ag = {}, {}
    for s in range(n - 1):
        for q in range(n):
            p, blk = (q - 1) % n, (q - 1 - s) % n
            for i in range(seg):
                c = blk * seg + i
                prev = Ref(p, "input", c) if s == 0 else Ref(p, "output", c)
                rs[q, s, i] = b.reduce(q, i % lanes, dst=Ref(q, "output", c),
                                       srcs=[Ref(q, "input", c), prev],
                                       deps=[rs.get((p, s - 1, i))])
    for t in range(n - 1):
        for q in range(n):
            p, blk = (q - 1) % n, (q - t) % n
            for i in range(seg):
                c = blk * seg + i
                made = rs[p, n - 2, i] if t == 0 else ag[p, t - 1, i]
                ag[q, t, i] = b.copy(q, i % lanes, dst=Ref(q, "output", c),
                                     src=Ref(p, "output", c), deps=[made])
    return b.build()


def raw(coll, n, lanes_per_rank, nchunks=1, **kw):
    """A schedule from explicit instruction lists: ``lanes_per_rank[r] = [[Instr, ...], ...]``."""
    lanes = tuple(tuple(Lane(tuple(l)) for l in rl) for rl in lanes_per_rank)
    return Schedule(collective=coll, nranks=n, nchunks=nchunks, lanes=lanes, **kw)


def cp(dst, src, deps=()):
    return Instr("copy", dst, (src,), tuple(deps))


def red(dst, srcs, deps=()):
    return Instr("reduce", dst, tuple(srcs), tuple(deps))


# -- correct schedules pass ----------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("inplace", [False, True])
def test_allgather_direct_passes(n, inplace):
    rep = verify(allgather_direct(n, inplace=inplace))
    assert rep.instructions == n * n - (n if inplace else 0)
    assert rep.collective == "allgather" and rep.depth == (n - 1 if inplace else n)


@pytest.mark.parametrize("n,seg,lanes", [(2, 1, 1), (3, 1, 1), (3, 2, 2), (4, 3, 2)])
@pytest.mark.parametrize("inplace", [False, True])
def test_ring_allreduce_passes(n, seg, lanes, inplace):
    rep = verify(ring_allreduce(n, seg, lanes, inplace=inplace))
    assert rep.reduces == rep.copies == n * (n - 1) * seg
    assert rep.remote == rep.instructions


def test_report_counts_dependencies_and_depth():
    rep = verify(ring_allreduce(3))
    # 2(n-1) steps in a chain along the ring.
    assert rep.depth == 4
    assert rep.dependencies > 0 and rep.engine_steps == 0


def test_round_trip_through_json_still_verifies():
    s = ring_allreduce(4, seg=2, lanes=2)
    assert verify(Schedule.from_json(s.to_json())) == verify(s)


# -- wrong results -------------------------------------------------------------------------------
def test_missing_contribution():
    with pytest.raises(WrongResult, match=r"rank 2 output chunk 1 \(nothing wrote it\) misses "
                                          r"rank 1 input chunk 0"):
        verify(allgather_direct(3, nchunks=1, skip=(1, 2)))


def test_double_contribution():
    s = raw("allreduce", 2, [
        [[red(Ref(0, "output", 0), [Ref(0, "input", 0), Ref(1, "input", 0)]),
          red(Ref(0, "output", 0), [Ref(0, "output", 0), Ref(1, "input", 0)])]],
        [[red(Ref(1, "output", 0), [Ref(1, "input", 0), Ref(0, "input", 0)])]]])
    with pytest.raises(WrongResult, match=r"rank 0 output chunk 0 \(last written by rank 0 lane 0 "
                                          r"instr 1 .*holds more than once rank 1 input chunk 0"):
        verify(s)


def test_foreign_contribution_in_broadcast():
    s = raw("broadcast", 2, [[[cp(Ref(0, "output", 0), Ref(0, "input", 0))]],
                             [[cp(Ref(1, "output", 0), Ref(1, "input", 0))]]])
    with pytest.raises(WrongResult, match="rank 1 output chunk 0 .*holds foreign rank 1"):
        verify(s)


# -- ordering errors -----------------------------------------------------------------------------
def test_dependency_cycle_is_named():
    s = raw("allgather", 2, [
        [[cp(Ref(0, "output", 0), Ref(0, "input", 0), [Dep(1, 0, 0)])]],
        [[cp(Ref(1, "output", 1), Ref(1, "input", 0), [Dep(0, 0, 0)])]]])
    with pytest.raises(DependencyCycle, match=r"rank 0 lane 0 instr 0 \(copy 0:output\[0\] <- "
                                              r"0:input\[0\]\).*rank 1 lane 0 instr 0"):
        verify(s)


def test_read_before_write_without_dependency():
    s = raw("broadcast", 2, [[[cp(Ref(0, "output", 0), Ref(0, "input", 0))]],
                             [[cp(Ref(1, "output", 0), Ref(0, "output", 0))]]])
    with pytest.raises(ReadBeforeWrite, match=r"rank 1 lane 0 instr 0 \(copy 1:output\[0\] <- "
                                              r"0:output\[0\]\) reads 0:output\[0\]"):
        verify(s)


def test_read_of_unwritten_scratch():
    s = raw("broadcast", 1, [[[cp(Ref(0, "output", 0), Ref(0, "scratch", 0))]]],
            scratch_units=(1,))
    with pytest.raises(ReadBeforeWrite, match="which nothing has written"):
        verify(s)


def test_write_after_read_race():
    # Rank 0 overwrites its output (via scratch) while rank 1 may still be reading it.
    s = raw("broadcast", 2, [
        [[cp(Ref(0, "output", 0), Ref(0, "input", 0)), cp(Ref(0, "scratch", 0), Ref(0, "input", 0)),
          cp(Ref(0, "output", 0), Ref(0, "scratch", 0))]],
        [[cp(Ref(1, "output", 0), Ref(0, "output", 0), [Dep(0, 0, 0)])]]], scratch_units=(1, 0))
    with pytest.raises(DataRace, match=r"rank 0 lane 0 instr 2 .* while rank 1 lane 0 instr 0 "
                                       r".*write-after-read race"):
        verify(s)
    fixed = raw("broadcast", 2, [
        [[cp(Ref(0, "output", 0), Ref(0, "input", 0)), cp(Ref(0, "scratch", 0), Ref(0, "input", 0)),
          cp(Ref(0, "output", 0), Ref(0, "scratch", 0), [Dep(1, 0, 0)])]],
        [[cp(Ref(1, "output", 0), Ref(0, "output", 0), [Dep(0, 0, 0)])]]], scratch_units=(1, 0))
    assert verify(fixed).dependencies == 2


def test_write_after_write_race():
    s = raw("broadcast", 2, [[[cp(Ref(0, "output", 0), Ref(0, "input", 0)),
                               cp(Ref(1, "output", 0), Ref(0, "input", 0))]],
                             [[cp(Ref(1, "output", 0), Ref(0, "input", 0))]]])
    with pytest.raises(DataRace, match="write-after-write race"):
        verify(s)


# -- malformed schedules -------------------------------------------------------------------------
@pytest.mark.parametrize("ref,msg", [
    (Ref(0, "output", 2), r"0:output\[2\] is outside rank 0's output of 2 chunks"),
    (Ref(0, "output", 1, 2), r"outside rank 0's output"),
    (Ref(3, "output", 0), "names rank 3"),
    (Ref(0, "scratch", 0), "reserve scratch"),
    (Ref(0, "bogus", 0), "unknown buffer"),
])
def test_out_of_range_refs(ref, msg):
    s = raw("allgather", 2, [[[cp(ref, Ref(0, "input", 0))]], [[]]])
    with pytest.raises(MalformedSchedule, match=msg):
        verify(s)


def test_unknown_dependency():
    s = raw("broadcast", 1, [[[cp(Ref(0, "output", 0), Ref(0, "input", 0), [Dep(0, 3, 0)])]]])
    with pytest.raises(MalformedSchedule, match="depends on rank 0 lane 3 instr 0, which does not"):
        verify(s)


def test_span_mismatch_and_source_count():
    s = raw("allgather", 2, [[[cp(Ref(0, "output", 0, 2), Ref(0, "input", 0))]], [[]]])
    with pytest.raises(MalformedSchedule, match="spans 1 chunks but the destination spans 2"):
        verify(s)
    s = raw("allreduce", 1, [[[red(Ref(0, "output", 0), [Ref(0, "input", 0)])]]])
    with pytest.raises(MalformedSchedule, match="reduce has 1 sources; expected at least 2"):
        verify(s)


def test_overlap_allowed_only_for_exact_accumulate():
    s = raw("allgather", 1, [[[cp(Ref(0, "output", 0), Ref(0, "input", 0))]]], nchunks=2,
            inplace=True)
    with pytest.raises(MalformedSchedule, match="overlaps source"):
        verify(s)


def test_out_of_place_input_must_stay_untouched():
    s = raw("allreduce", 1, [[[cp(Ref(0, "input", 0), Ref(0, "output", 0))]]])
    with pytest.raises(MalformedSchedule, match="writes an input buffer"):
        verify(s)


def test_errors_share_the_schedule_error_base():
    assert all(issubclass(e, ScheduleError) for e in
               (DataRace, DependencyCycle, MalformedSchedule, ReadBeforeWrite, WrongResult))


# -- other collectives and engine steps ----------------------------------------------------------
def test_reduce_scatter_and_alltoall_direct():
    n = 3
    b = ScheduleBuilder("reduce_scatter", n, 1)
    for q in range(n):
        b.reduce(q, 0, Ref(q, "output", 0), [Ref(r, "input", q) for r in range(n)])
    assert verify(b.build()).reduces == n
    b = ScheduleBuilder("alltoall", n, 1)
    for q in range(n):
        for r in range(n):
            b.copy(q, 0, Ref(q, "output", r), Ref(r, "input", q))
    assert verify(b.build()).copies == n * n


def test_sendrecv_and_reduce_rooted():
    b = ScheduleBuilder("sendrecv", 3, 1, root=2)
    b.copy(0, 0, Ref(0, "output", 0), Ref(2, "input", 0))
    assert verify(b.build()).remote == 1
    b = ScheduleBuilder("reduce", 3, 1, root=1)
    b.reduce(1, 0, Ref(1, "output", 0), [Ref(r, "input", 0) for r in range(3)])
    assert verify(b.build()).reduces == 1


def hierarchical_allreduce(broken=False):
    """Two 2-rank 'nodes': local reduce on leaders 0 and 2, engine allreduce, local broadcast."""
    b = ScheduleBuilder("allreduce", 4, 1, algorithm="hier")
    made = {}
    for lead, peer in ((0, 1), (2, 3)):
        d = b.reduce(lead, 0, Ref(lead, "scratch", b.scratch(lead, 1)),
                     [Ref(lead, "input", 0), Ref(peer, "input", 0)])
        made[lead] = b.engine(lead, 0, Ref(lead, "output", 0), [Ref(lead, "scratch", 0)],
                              "allreduce", (0, 2), deps=[d])
        b.copy(peer, 0, Ref(peer, "output", 0), Ref(lead, "output", 0),
               deps=[] if broken else [made[lead]])
    return b.build()


def test_engine_allreduce_between_leaders():
    rep = verify(hierarchical_allreduce())
    assert rep.engine_steps == 2 and rep.depth == 3  # reduce -> engine -> copy


def test_engine_result_read_needs_dependency():
    with pytest.raises(ReadBeforeWrite, match="rank 1 lane 0 instr 0"):
        verify(hierarchical_allreduce(broken=True))


def test_engine_members_must_match():
    b = ScheduleBuilder("allreduce", 2, 1)
    b.engine(0, 0, Ref(0, "output", 0), [Ref(0, "input", 0)], "allreduce", (0, 1))
    with pytest.raises(MalformedSchedule, match="expected the same number on every member"):
        verify(b.build())


# -- scale -------------------------------------------------------------------------------------
def test_sixteen_ranks_thousands_of_instructions_is_fast():
    s = ring_allreduce(16, seg=16, lanes=4)
    t = time.perf_counter()
    rep = verify(s)
    elapsed = time.perf_counter() - t
    assert rep.instructions == 2 * 15 * 16 * 16
    assert elapsed < 4.0, f"verify took {elapsed:.2f}s for {rep.instructions} instructions"


def test_inplace_reduce_scatter_direct():
    n = 3
    b = ScheduleBuilder("reduce_scatter", n, 2, inplace=True)
    for q in range(n):
        mine = Ref(q, "input", 2 * q, 2)         # in place, rank q's output is this slot
        b.reduce(q, 0, Ref(q, "output", 0, 2), [mine] + [Ref(r, "input", 2 * q, 2)
                                                         for r in range(n) if r != q])
    assert verify(b.build()).reduces == n


@pytest.mark.parametrize("op", ["allgather", "reduce_scatter", "broadcast"])
def test_engine_collectives_between_two_ranks(op):
    coll = {"broadcast": "broadcast"}.get(op, op)
    b = ScheduleBuilder(coll, 2, 1)
    for r in range(2):
        if op == "allgather":
            b.engine(r, 0, Ref(r, "output", 0, 2), [Ref(r, "input", 0)], op, (0, 1))
        elif op == "reduce_scatter":
            b.engine(r, 0, Ref(r, "output", 0), [Ref(r, "input", 0, 2)], op, (0, 1))
        else:
            b.engine(r, 0, Ref(r, "output", 0), [Ref(r, "input", 0)], op, (0, 1))
    assert verify(b.build()).engine_steps == 2


def test_engine_span_mismatch_is_malformed():
    b = ScheduleBuilder("allgather", 2, 1)
    for r in range(2):
        b.engine(r, 0, Ref(r, "output", 0, 2 - r), [Ref(r, "input", 0)], "allgather", (0, 1))
    with pytest.raises(MalformedSchedule, match="expected 1 -> 2"):
        verify(b.build())


@pytest.mark.parametrize("seed", range(6))
def test_dropping_any_ring_dependency_is_caught(seed):
    # Every dependency of this ring is needed: removing one must raise a ScheduleError
    # subclass (never another exception, never a silent pass with a wrong result).
    import random

    s = ring_allreduce(4, seg=2, lanes=2)
    deps = [(d, k) for d, ins in s.instructions() for k in range(len(ins.deps))]
    d, k = random.Random(seed).choice(deps)
    lanes = [list(list(lane.instrs) for lane in rl) for rl in s.lanes]
    ins = lanes[d.rank][d.lane][d.index]
    lanes[d.rank][d.lane][d.index] = Instr(ins.op, ins.dst, ins.srcs,
                                           ins.deps[:k] + ins.deps[k + 1:])
    broken = raw("allreduce", 4, lanes, nchunks=s.nchunks)
    with pytest.raises((ReadBeforeWrite, DataRace)):
        verify(broken)
