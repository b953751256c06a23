"""Communicator collectives against numpy references, across processes (collectx.launch).

To stay fast, each launched group runs many cases: one group per rank count.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import _needs as needs
from hypothesis import HealthCheck, given, settings, strategies as st

import _runtime_workers as W
import collectx
from collectx.errors import ArgumentError, CommError, DTypeError

COLLS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall")
DTYPES = ("float32", "float64", "float16", "int32", "int64", "int8", "uint8")
OPS = ("sum", "prod", "min", "max", "avg")

# sizes: mostly small and odd, sometimes up to a couple of MiB of float32
sizes = st.one_of(st.integers(0, 40), st.integers(41, 5000), st.integers(5001, 600_000))


@st.composite
def case(draw, nranks: int):
    coll = draw(st.sampled_from(COLLS))
    dtype = draw(st.sampled_from(DTYPES))
    op = draw(st.sampled_from(OPS))
    if dtype in ("float16", "int8", "uint8") and op in ("sum", "prod", "avg"):
        op = "max"  # keep references exact: tiny types overflow/round on sums of many ranks
    n = draw(sizes)
    if coll in ("reduce_scatter", "alltoall"):
        n = n // max(1, nranks)
    root = draw(st.integers(0, nranks - 1))
    return coll, dtype, op, n, root, draw(st.integers(0, 2**16))


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, pytest.param(8, marks=pytest.mark.slow)])
@settings(max_examples=1, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_collectives_match_numpy(nranks, data):
    cases = data.draw(st.lists(case(nranks), min_size=16, max_size=16), label="cases")
    failures = collectx.launch(W.run_cases, nranks, args=(cases,), timeout=240)
    assert [f for per_rank in failures for f in per_rank] == []


def test_every_collective_dtype_and_op_on_three_ranks_with_tiny_tiles(monkeypatch):
    # A 256 KiB window forces many tiles (and both staging sets) for the larger sizes.
    monkeypatch.setenv("COLLECTX_WINDOW_BYTES", str(256 << 10))
    cases = [(c, d, o, n, 2 if c in ("broadcast", "reduce") else 0, 7)
             for c in COLLS
             for d, o, n in (("float32", "sum", 100_003), ("int32", "max", 17),
                             ("float64", "avg", 3), ("int8", "prod", 0), ("int64", "avg", 7),
                             ("float16", "min", 5), ("uint8", "min", 70_001))]
    failures = collectx.launch(W.run_cases, 3, args=(cases,), timeout=240)
    assert [f for per_rank in failures for f in per_rank] == []


@pytest.mark.parametrize("nranks", [2, 3])
def test_disjoint_aliased_and_overlapping_buffers_over_many_tiles(monkeypatch, nranks):
    # 4 KiB tiles: a few hundred floats per tile, so every call spans many tiles.
    monkeypatch.setenv("COLLECTX_TILE_BYTES", "4096")
    assert collectx.launch(W.aliasing, nranks, args=(3001,), timeout=240) == [[]] * nranks


@pytest.mark.parametrize("cma", ["1", "0"])
def test_large_calls_with_each_rank_choosing_its_buffer_layout(monkeypatch, cma):
    # Three blocks a rank of the size from which reductions read user buffers across processes
    # (reduce_scatter's unit is a block). Rank 0 runs in place, rank 1 into a disjoint output,
    # rank 2 into an output that overlaps its input at an offset, which must be staged whatever
    # the others do; allgather and reduce_scatter in place (input = own block of the output, and
    # the reverse) need not be.
    from collectx.runtime.engine import cma_min_bytes
    monkeypatch.setenv("COLLECTX_CMA", cma)
    block = cma_min_bytes("reduce_scatter", True) // 4
    got = collectx.launch(W.cross_process_reads, 3, args=(3 * block + 7,), timeout=240)
    assert [b for g in got for b in g["bad"]] == []
    cma_used = got[0]["cma"]
    assert all(g["cma"] == cma_used for g in got)
    if cma == "0":
        assert not cma_used
    assert [g["published"]["allreduce"] for g in got] == [[cma_used] * 2] * 2 + [[False] * 2]
    for coll in ("allgather", "reduce_scatter"):
        assert [g["published"][coll] for g in got] == [[cma_used] * 2] * 3


def test_collectives_that_only_copy_read_across_processes_from_smaller_sizes():
    # A read across processes lands straight in the reader's output, so copy-only collectives
    # take it from CMA_COPY_MIN_BYTES (more when ranks outnumber CPUs); reductions from 4 MiB.
    from collectx.runtime.engine import cma_min_bytes
    from collectx.runtime.window import oversubscribed
    small, mid = 1 << 10, cma_min_bytes("allgather", oversubscribed(2)) // 4
    got = collectx.launch(W.copies_read_across, 2, args=([small, mid],), timeout=240)
    assert [case[2] for g in got for case in g["rows"]] == [None] * 20
    cma = got[0]["cma"]
    for rank, g in enumerate(got):
        published = {(coll, n): p for coll, n, _, p in g["rows"]}
        for coll in ("allgather", "broadcast", "alltoall", "allreduce", "reduce_scatter"):
            assert published[coll, small] == [False, False], (rank, coll)
        # Peers read allgather's and alltoall's inputs; broadcast's root buffer (rank 1's).
        assert published["allgather", mid] == [cma, False]
        assert published["alltoall", mid] == [cma, False]
        assert published["broadcast", mid] == [cma and rank == 1] * 2
        assert published["allreduce", mid] == published["reduce_scatter", mid] == [False] * 2


@pytest.mark.parametrize("algo", ["direct", "ring", "tree", "blink", "forest"])
@pytest.mark.parametrize("nranks", [3, 4])
def test_every_schedule_family_in_every_buffer_layout(monkeypatch, algo, nranks):
    # Staged output chunks are written through to the user's buffer as they are computed where
    # the schedule allows it (FlatPlan.through_mask): every family's writes and in-place reads
    # must still land right, out of place and in place.
    monkeypatch.setenv("COLLECTX_ALGO", algo)
    got = collectx.launch(W.every_layout, nranks, args=(algo, [1, 13, 70001]), timeout=240)
    assert [b for g in got for b in g] == []


def test_async_torch_bf16_and_out_buffers():
    needs.module("torch")
    assert collectx.launch(W.async_and_torch, 2, args=(1000,), timeout=240) == [[], []]


def test_single_rank_world_runs_in_process():
    with collectx.init() as comm:
        x = np.arange(6, dtype=np.int64)
        assert comm.allreduce(x, op="max") is x
        assert comm.reduce_scatter(x).tolist() == x.tolist()
        assert comm.alltoall(x).tolist() == x.tolist()
        work = comm.allgather(x, async_op=True)
        assert work.wait() and work.result().tolist() == x.tolist()


@pytest.mark.parametrize("call, err", [
    (lambda c: c.allreduce(np.ones(4, np.float32), out=np.ones(3, np.float32)), ArgumentError),
    (lambda c: c.allreduce(np.ones(4, np.complex64)), DTypeError),
    (lambda c: c.allreduce(np.ones((4, 4), np.float32)[:, 0]), ArgumentError),
    (lambda c: c.allreduce(np.ones(4, np.float32), op="xor"), ArgumentError),
    (lambda c: c.broadcast(np.ones(4, np.float32), root=3), ArgumentError),
    (lambda c: c.reduce_scatter(np.ones(4, np.float32), out=np.ones(2, np.float64)), DTypeError),
    (lambda c: c.allreduce(np.ones(4, ">f4")), DTypeError),
    (lambda c: c.allgather(np.ones(4, np.int32), out=np.zeros(4, ">i4")), DTypeError),
])
def test_bad_arguments_raise_value_and_type_errors(call, err):
    with collectx.init() as comm:
        ro = np.ones(4, np.float32)
        ro.flags.writeable = False
        with pytest.raises(err):
            call(comm)
        with pytest.raises(ArgumentError, match="read-only"):
            comm.allreduce(ro)
        x = np.ones(3, np.float32)
        assert comm.allreduce(x).tolist() == [1.0, 1.0, 1.0]  # still usable afterwards


@pytest.mark.parametrize("kw, match", [
    ({"device": "cuda:x"}, "cuda:N"), ({"device": "cpu:0"}, "cuda:N"), ({"device": 5}, "cuda:N"),
    ({"timeout": -1}, "timeout=-1"), ({"timeout": 0}, "seconds > 0"), ({"timeout": "a"}, "'a'"),
])
def test_bad_init_arguments_say_what_was_expected(kw, match):
    # before any rendezvous or GPU check, so no rank waits on a bad argument of another
    with pytest.raises(ArgumentError, match=match):
        collectx.init(**kw)


def test_ranks_and_timeouts_take_numpy_numbers_but_not_bools():
    with collectx.init(timeout=np.float32(30)) as comm:
        x = np.ones(3, np.float32)
        assert comm.broadcast(x, root=np.int64(0)) is x
        assert comm.reduce(x, root=np.int32(0)) is x
        for call in (lambda: comm.broadcast(x, root=True), lambda: comm.reduce(x, root=False)):
            with pytest.raises(ArgumentError, match="not a bool"):
                call()
        with pytest.raises(ArgumentError, match="not a bool"):
            comm.send(x, False)
    with pytest.raises(ArgumentError, match="timeout=True"):
        collectx.init(timeout=True)


def test_closed_communicator_refuses_calls():
    comm = collectx.init()
    comm.close()
    comm.close()
    with pytest.raises(CommError, match="after close"):
        comm.allreduce(np.ones(2, np.float32))


def test_no_segments_left_after_single_rank_use():
    before = {f for f in os.listdir("/dev/shm") if f.startswith("collectx-")}
    with collectx.init() as comm:
        comm.allreduce(np.ones(10, np.float32))
    after = {f for f in os.listdir("/dev/shm") if f.startswith("collectx-")}
    assert after <= before


def test_send_recv_ring_large_and_small():
    assert collectx.launch(W.ring_sendrecv, 2, args=(300_001,), timeout=240) == [[], []]
    assert collectx.launch(W.ring_sendrecv, 4, args=(5,), timeout=240) == [[]] * 4


def test_send_to_self_is_an_argument_error():
    with collectx.init() as comm:
        with pytest.raises(ArgumentError, match="another rank"):
            comm.send(np.ones(2), 0)


def test_zero_copy_window_arrays_over_several_tiles(monkeypatch):
    monkeypatch.setenv("COLLECTX_WINDOW_BYTES", "300000")   # two tiles for 10001 floats
    assert collectx.launch(W.zero_copy, 3, args=(10_001, 3), timeout=240) == [[]] * 3


@pytest.mark.parametrize("nranks", [2, 3])
def test_zero_copy_window_arrays_through_the_fast_call(monkeypatch, nranks):
    # 2 ranks with a CPU each, from 256 KiB: the in-place allreduce reads its input in place too
    monkeypatch.setenv("COLLECTX_WINDOW_BYTES", "4000000")
    monkeypatch.setenv("COLLECTX_TILE_BYTES", "131072")     # the allreduce in 5 tiles
    assert collectx.launch(W.zero_copy, nranks, args=(70_001, 3), timeout=240) == [[]] * nranks


def test_empty_arrays_return_to_the_heap_when_collected():
    with collectx.init() as comm:
        a = comm.empty(1000, np.float64)
        assert comm._heap.in_use >= 8000
        del a
        assert comm._heap.in_use == 0
        with pytest.raises(DTypeError):
            comm.empty(3, np.complex64)
