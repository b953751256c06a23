"""Pushed copies (collectx.schedule.push): schedules rewritten so the rank that computed a chunk
writes it into its peers' outputs, and the runtime running them across processes."""

from __future__ import annotations

import numpy as np
import pytest

import collectx
from collectx import topology
from collectx.planner import make_schedule
from collectx.schedule import Ref, ScheduleBuilder
from collectx.schedule.ir import Dep
from collectx.schedule.push import push_copies
from collectx.schedule.verify import verify


def _remote_writes(s):
    return sum(ins.dst.rank != d.rank for d, ins in s.instructions())


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather", "broadcast"])
@pytest.mark.parametrize("algo", ["direct", "ring", "tree", "blink", "forest"])
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_pushed_schedules_still_compute_their_collective(coll, algo, nranks):
    try:
        s = make_schedule(topology.host(nranks), coll, nranks, 4 << 20, algo=algo)
    except collectx.CollectXError:
        pytest.skip(f"{algo} does not plan {coll} on {nranks} ranks")
    p = push_copies(s)
    verify(p)   # raises on a wrong result or a race
    assert p.n_instructions == s.n_instructions
    assert [len(lanes) for lanes in p.lanes] == [len(lanes) for lanes in s.lanes]


def test_one_hop_allreduce_pushes_every_reduced_chunk_to_every_peer():
    s = make_schedule(topology.host(4), "allreduce", 4, 8 << 20, algo="direct")
    p = push_copies(s)
    assert _remote_writes(s) == 0
    assert _remote_writes(p) == 4 * 3          # each rank's chunk to each of 3 peers
    for d, ins in p.instructions():
        if ins.dst.rank != d.rank:
            assert ins.op == "copy" and ins.deps == ()   # ordered by its lane alone
            before = p.lanes[d.rank][d.lane].instrs[:d.index]
            assert [b.dst for b in before if b.dst.rank == d.rank] == [ins.srcs[0]]


def test_the_instruction_after_a_moved_copy_waits_for_it():
    # rank 1 copies rank 0's chunk, then forwards what it received: the forward reads rank 0's
    # output only through the lane order after the copy, so it must now wait for the push.
    b = ScheduleBuilder("allgather", nranks=2, nchunks=1)
    p0 = b.copy(0, 0, dst=Ref(0, "output", 0), src=Ref(0, "input", 0))
    b.copy(0, 0, dst=Ref(0, "output", 1), src=Ref(1, "input", 0))
    b.copy(1, 0, dst=Ref(1, "output", 0), src=Ref(0, "output", 0), deps=[p0])
    b.copy(1, 0, dst=Ref(1, "output", 1), src=Ref(1, "input", 0))
    s = b.build()
    p = push_copies(s)
    assert [ins.dst.rank for ins in p.lanes[0][0].instrs] == [0, 1, 0]
    (rest,) = p.lanes[1][0].instrs
    assert rest.deps == (Dep(0, 0, 1),)
    verify(p)


def test_copies_into_chunks_others_also_use_are_not_moved():
    b = ScheduleBuilder("allgather", nranks=2, nchunks=1)
    p0 = b.copy(0, 0, dst=Ref(0, "output", 0), src=Ref(0, "input", 0))
    b.copy(0, 0, dst=Ref(0, "output", 1), src=Ref(1, "input", 0))
    c = b.copy(1, 0, dst=Ref(1, "output", 0), src=Ref(0, "output", 0), deps=[p0])
    b.copy(1, 0, dst=Ref(1, "output", 1), src=Ref(1, "input", 0))
    b.copy(0, 0, dst=Ref(0, "output", 1), src=Ref(1, "output", 0), deps=[c])  # reads it back
    s = b.build()
    assert push_copies(s) is s


def test_in_place_schedules_are_left_alone():
    s = make_schedule(topology.host(2), "allreduce", 2, 1 << 20)
    s_inplace = s.__class__(**{**{f: getattr(s, f) for f in s.__dataclass_fields__},
                               "inplace": True})
    assert push_copies(s_inplace) is s_inplace


def _pushed_sizes(sizes):
    comm = collectx.init()
    bad = []
    for n in sizes:
        x = np.arange(n, dtype=np.float32) * (comm.rank + 1)
        want = np.arange(n, dtype=np.float32) * sum(range(1, comm.size + 1))
        y = np.full(n, -1, np.float32)
        comm.allreduce(x.copy(), out=y)
        comm.allreduce(x)
        comm.allreduce(x * 0 + np.arange(n, dtype=np.float32) * (comm.rank + 1))  # fast call
        if not (np.array_equal(x, want) and np.array_equal(y, want)):
            bad.append(f"rank {comm.rank} n={n}: {x[:3]} {y[:3]} vs {want[:3]}")
        block = np.arange(n * comm.size, dtype=np.float32)
        got = comm.reduce_scatter(block)
        if not np.array_equal(got, block[comm.rank * n:(comm.rank + 1) * n] * comm.size):
            bad.append(f"rank {comm.rank} n={n}: reduce_scatter {got[:3]}")
    comm.close()
    return bad


@pytest.mark.parametrize("nranks", [2, 3])
def test_pushed_allreduce_and_reduce_scatter_land_right_in_place_and_out(nranks):
    from collectx.runtime.engine import cma_min_bytes
    from collectx.runtime.window import oversubscribed
    start = cma_min_bytes("allreduce", oversubscribed(nranks)) // 4
    sizes = [start - 1, start, 3 * start + 5, 8 * start + 3]
    assert collectx.launch(_pushed_sizes, nranks, args=(sizes,), timeout=240) == [[]] * nranks
