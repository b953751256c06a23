"""Pushed copies (collectx.schedule.push): schedules rewritten so the rank that computed a chunk
writes it into its peers' outputs, and the runtime running them across processes."""

from __future__ import annotations

import numpy as np
import pytest

import collectx
from collectx import topology
from collectx.planner import make_schedule
from collectx.runtime.segment import fit_window_bytes, shm_free
from collectx.schedule import Ref, ScheduleBuilder
from collectx.schedule.ir import Dep
from collectx.schedule.push import push_copies, share_copies
from collectx.schedule.verify import verify


def _remote_writes(s):
    return sum(ins.dst.rank != d.rank for d, ins in s.instructions())


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "reduce", "allgather",
                                  "broadcast"])
@pytest.mark.parametrize("algo", ["direct", "ring", "tree", "blink", "forest"])
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_pushed_schedules_still_compute_their_collective(coll, algo, nranks):
    try:
        s = make_schedule(topology.host(nranks), coll, nranks, 4 << 20, algo=algo)
    except collectx.CollectXError:
        pytest.skip(f"{algo} does not plan {coll} on {nranks} ranks")
    p = push_copies(s)
    verify(p)   # raises on a wrong result or a race
    folded = s.n_instructions - p.n_instructions     # reduces' gathers, written in place
    gathers = sum(ins.op == "copy" and ins.srcs[0].buf == "scratch"
                  and ins.dst.rank != ins.srcs[0].rank for _, ins in s.instructions())
    assert folded == 0 or (coll == "reduce" and folded <= gathers)
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


def test_one_hop_reduce_writes_each_reduced_shard_straight_into_the_root_output():
    s = make_schedule(topology.host(3), "reduce", 3, 8 << 20, algo="direct", root=1)
    p = push_copies(s)
    verify(p)
    reduces = [(d.rank, ins.dst.chunk, ins.dst.count) for d, ins in s.instructions()
               if ins.op == "reduce"]
    assert p.scratch_units == (0, 0, 0)                       # the gather copies folded
    assert sorted((d.rank, ins.dst.chunk, ins.dst.count) for d, ins in p.instructions()
                  ) == sorted(reduces)                      # each piece where it was reduced
    for d, ins in p.instructions():
        assert ins.op == "reduce" and ins.dst.rank == 1 and ins.dst.buf == "output"
        assert d.rank != 1 and ins.deps == ()


def test_scratch_that_others_also_read_is_pushed_not_folded():
    # rank 1 reduces into its scratch; rank 0 copies that into its output, and rank 1 too
    b = ScheduleBuilder("allreduce", nranks=2, nchunks=1)
    b.scratch(1, 1)
    red = b.reduce(1, 0, dst=Ref(1, "scratch", 0), srcs=[Ref(1, "input", 0), Ref(0, "input", 0)])
    b.copy(0, 0, dst=Ref(0, "output", 0), src=Ref(1, "scratch", 0), deps=[red])
    b.copy(1, 0, dst=Ref(1, "output", 0), src=Ref(1, "scratch", 0))
    s = b.build()
    p = push_copies(s)
    verify(p)
    assert [(ins.op, ins.dst.rank) for ins in p.lanes[1][0].instrs] == [
        ("reduce", 1), ("copy", 0), ("copy", 1)]
    assert p.scratch_units == s.scratch_units


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


@pytest.mark.parametrize("coll", ["broadcast", "allgather", "alltoall"])
@pytest.mark.parametrize("algo", ["direct", "ring", "tree", "blink", "forest"])
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_shared_schedules_still_compute_their_collective(coll, algo, nranks):
    for root in range(nranks):
        try:
            s = make_schedule(topology.host(nranks), coll, nranks, 4 << 20, algo=algo, root=root)
        except collectx.CollectXError:
            pytest.skip(f"{algo} does not plan {coll} on {nranks} ranks")
        p = share_copies(s)
        verify(p)
        assert p.n_instructions == s.n_instructions


def _cross_rank_chunks(s):
    load = [0] * s.nranks
    for d, ins in s.instructions():
        load[d.rank] += sum(ref.count for ref in (ins.dst, *ins.srcs) if ref.rank != d.rank)
    return load


@pytest.mark.parametrize("nranks", [2, 3, 4, 5])
def test_a_shared_direct_broadcast_moves_as_much_on_the_root_as_on_each_peer(nranks):
    s = make_schedule(topology.host(nranks), "broadcast", nranks, 4 << 20, algo="direct",
                      root=1)
    assert _cross_rank_chunks(s)[1] == 0
    p = share_copies(s)
    verify(p)
    load = _cross_rank_chunks(p)
    piece = max(ins.dst.count for _, ins in s.instructions())
    assert max(load) - min(load) <= piece        # balanced to within one piece
    shared = {d for d, ins in p.instructions() if ins.dst.rank != d.rank}
    for d in shared:
        ins = p.instr(d)
        assert d.rank == 1 and ins.deps == () and ins.srcs[0].buf == "input"
    # the peers that relay a shared piece pull it from where it landed once it has
    for d, ins in p.instructions():
        for src in ins.srcs:
            writer = [w for w in shared if p.instr(w).dst.rank == src.rank
                      and set(p.instr(w).dst.chunks()) & set(src.chunks())]
            assert all(w in ins.deps for w in writer)


def test_copies_of_balanced_or_ordered_work_are_not_shared():
    for coll in ("allgather", "alltoall", "allreduce"):
        s = make_schedule(topology.host(3), coll, 3, 4 << 20, algo="direct")
        assert share_copies(s) is s


def test_in_place_schedules_are_left_alone():
    s = make_schedule(topology.host(2), "allreduce", 2, 1 << 20)
    s_inplace = s.__class__(**{**{f: getattr(s, f) for f in s.__dataclass_fields__},
                               "inplace": True})
    assert push_copies(s_inplace) is s_inplace


def _pushed_sizes(sizes, window=False):
    """``window``: the allreduce and reduce_scatter buffers come from comm.empty, so the pushed
    copies are stores into peers' arrays in the window rather than writes across processes."""
    comm = collectx.init()
    bad = []

    def buf(a):
        if not window:
            return a
        w = comm.empty(a.shape, a.dtype)
        w[:] = a
        return w
    for n in sizes:
        x = buf(np.arange(n, dtype=np.float32) * (comm.rank + 1))
        want = np.arange(n, dtype=np.float32) * sum(range(1, comm.size + 1))
        y = buf(np.full(n, -1, np.float32))
        comm.allreduce(buf(x.copy()), out=y)
        comm.allreduce(x)
        x[:] = np.arange(n, dtype=np.float32) * (comm.rank + 1)
        comm.allreduce(x)                                              # fast call
        if not (np.array_equal(x, want) and np.array_equal(y, want)):
            bad.append(f"rank {comm.rank} n={n}: {x[:3]} {y[:3]} vs {want[:3]}")
        block = buf(np.arange(n * comm.size, dtype=np.float32))
        got = buf(np.full(n, -1, np.float32))
        comm.reduce_scatter(block, out=got)
        if not np.array_equal(got, block[comm.rank * n:(comm.rank + 1) * n] * comm.size):
            bad.append(f"rank {comm.rank} n={n}: reduce_scatter {got[:3]}")
        del x, y, block, got
        for root in range(comm.size):
            z = np.arange(n, dtype=np.float32) * (comm.rank + 1)
            out = np.full(n, -1, np.float32)
            comm.reduce(z.copy(), out=out, root=root)
            comm.reduce(z, root=root)
            if comm.rank == root and not (np.array_equal(z, want) and np.array_equal(out, want)):
                bad.append(f"rank {comm.rank} n={n}: reduce to {root} {z[:3]} {out[:3]}")
    comm.close()
    return bad


@pytest.mark.parametrize("nranks", [2, 3])
def test_pushed_allreduce_reduce_scatter_and_reduce_land_right_in_place_and_out(nranks):
    from collectx.runtime.engine import cma_min_bytes
    from collectx.runtime.window import oversubscribed
    start = cma_min_bytes("allreduce", oversubscribed(nranks)) // 4
    sizes = [start - 1, start, 3 * start + 5, 8 * start + 3]
    assert collectx.launch(_pushed_sizes, nranks, args=(sizes,), timeout=240) == [[]] * nranks


@pytest.mark.parametrize("nranks", [2, 3])
def test_pushed_copies_into_window_arrays_land_right(monkeypatch, nranks):
    # A rank's pushed copies (one per peer) run inside its reduce, into peers' window arrays
    from collectx.runtime.engine import cma_min_bytes
    from collectx.runtime.window import oversubscribed
    start = cma_min_bytes("allreduce", oversubscribed(nranks)) // 4
    window = 2 * 4 * (5 + nranks) * (8 * start + 3)
    if fit_window_bytes(window, nranks, nranks, shm_free("/dev/shm")) < window:
        pytest.skip(f"/dev/shm has no room for {nranks} windows of {window >> 20} MiB")
    monkeypatch.setenv("COLLECTX_WINDOW_BYTES", str(window))
    sizes = [start, 3 * start + 5, 8 * start + 3]
    assert collectx.launch(_pushed_sizes, nranks, args=(sizes, True),
                           timeout=240) == [[]] * nranks


def _broadcasts(sizes):
    comm = collectx.init()
    bad = []
    for n in sizes:
        for root in range(comm.size):
            for rep in range(2):
                want = np.arange(n, dtype=np.float32) + rep * 3 + root
                x = want.copy() if comm.rank == root else np.full(n, -1, np.float32)
                comm.broadcast(x, root=root)
                if not np.array_equal(x, want):
                    bad.append(f"rank {comm.rank} n={n} root={root}: {x[:3]} vs {want[:3]}")
    comm.close()
    return bad


@pytest.mark.parametrize("nranks", [2, 3])
def test_shared_broadcasts_land_right(nranks):
    from collectx.runtime.engine import SHARED_BROADCAST_MIN_BYTES
    start = SHARED_BROADCAST_MIN_BYTES // 4
    sizes = [start - 1, start, 3 * start + 5]
    assert collectx.launch(_broadcasts, nranks, args=(sizes,), timeout=240) == [[]] * nranks
