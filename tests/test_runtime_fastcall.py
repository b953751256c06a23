"""The compiled fast calls of the Communicator (collectx._fastpath.FastCall).

Once an in-place allreduce of a plain numpy array has run, later calls with the same dtype,
element count and op run through one C call; likewise allreduce, allgather, reduce_scatter and
alltoall into an ``out=`` array (disjoint, or NCCL's in-place blocks), broadcast and reduce.
These tests check it is the path taken (its call counter), that results are right for every op
and several dtypes and shapes, that it declines everything else untouched, and that
mismatches, aborted calls, dead peers and timeouts raise as on the checked path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import _fastcall_workers as W
import collectx
from collectx.errors import ArgumentError, CommError, DTypeError
from collectx.runtime.engine import _fast_module

pytestmark = pytest.mark.skipif(_fast_module() is None,
                                reason="collectx._fastpath (with FastCall) is not built")

OPS = ("sum", "prod", "min", "max", "avg")


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_every_op_and_several_dtypes_run_through_the_fast_call(nranks):
    cases = [(d, o, n) for o in OPS for d, n in (("float32", 2), ("float64", 5), ("int32", 17),
                                                 ("int8", 3))]
    cases += [("float32", "sum", 1000), ("float16", "max", 64), ("uint8", "min", 7),
              ("int64", "avg", 9), ("float32", "sum", 0)]
    per_rank = collectx.launch(W.results_per_signature, nranks, args=(cases,), timeout=240)
    for rank, results in enumerate(per_rank):
        for (dtype, op, n), (failures, fast) in zip(cases, results):
            assert failures == [], (rank, failures)
            assert fast == 3, (rank, dtype, op, n, fast)  # the first call arms it


@pytest.mark.parametrize("kind", ["op", "size", "dtype", "collective"])
def test_mismatch_against_a_fast_call_raises_on_every_rank(kind):
    results = collectx.launch(W.mismatch_on_fast_call, 2, args=(kind,), timeout=120)
    for rank, (name, message, fast, after) in enumerate(results):
        assert name == "CollectiveMismatch", (rank, name, message)
        assert "rank 0:" in message and "rank 1:" in message
        assert after == [3.0] * 8          # still usable, and in step
    assert results[0][2] == 1                 # rank 0's side ran through the fast call


def test_peer_death_during_a_fast_call_raises_peer_failure_promptly(tmp_path):
    with pytest.raises(collectx.errors.RankFailed, match="rank 1 was killed by signal SIGKILL"):
        collectx.launch(W.peer_dies_during_fast_call, 2, args=(str(tmp_path),), grace=20,
                        timeout=120)
    name, rank, seconds, fast, later = json.loads((tmp_path / "rank0.json").read_text())
    assert (name, rank) == ("PeerFailure", 1)
    assert seconds < 5.0
    assert fast == 1                          # the failed call was the fast one
    assert later == "CommError"               # poisoned: the fast call is disabled too


def test_peer_abort_reaches_a_fast_call_and_both_stay_in_step():
    results = collectx.launch(W.peer_aborts_fast_call, 2, timeout=120)
    assert results[1][:2] == ["ArgumentError", None]
    assert results[0][:3] == ["PeerAborted", 1, 1]
    assert all(r[-1] == [6.0] * 4 for r in results)   # (1 + 2), then doubled


def test_missing_peer_times_out_in_a_fast_call():
    results = collectx.launch(W.never_arrives_on_fast_call, 2, args=(1.5,), timeout=120)
    name, seconds, fast = results[0]
    assert name == "Timeout" and fast == 1
    assert 1.4 < seconds < 6.0


def test_async_calls_run_first_and_the_fast_call_comes_back():
    results = collectx.launch(W.async_then_fast, 2, timeout=120)
    for vals, x, fast in results:
        assert vals == [0.0, 2.0, 4.0]
        assert x == [16.0] * 4                # ones, doubled by each of four calls
        assert fast == 1


def _one_rank_fast_call():
    comm = collectx.init(0, 1)
    x = np.arange(6, dtype=np.float32)
    comm.allreduce(x)
    return comm, x


def test_fast_call_declines_other_arrays_and_ops_untouched():
    comm, x = _one_rank_fast_call()
    fast = comm._fast
    assert fast(x, None, "sum") is True and fast.calls == 1
    ro = x.copy()
    ro.flags.writeable = False
    declined = [x.astype(np.float64), x[::2].copy(), np.arange(12, dtype=np.float32)[::2],
                ro, x.astype(">f4"), x[:5].copy(), x.tolist(), memoryview(x)]
    for y in declined:
        before = np.array(y, copy=True)
        assert fast(y, None, "sum") is False
        np.testing.assert_array_equal(np.asarray(y), before)
    assert fast(x, None, "max") is False and fast(x, None, 0) is False
    assert fast(x, x.copy(), "sum") is False         # in place only: an out declines
    assert fast(x.reshape(2, 3), None, "sum") is True  # same dtype and count, any C shape
    assert fast.calls == 2
    with pytest.raises(TypeError):
        fast(x)
    comm.close()


def test_checked_path_errors_are_unchanged():
    comm, x = _one_rank_fast_call()
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        comm.allreduce(ro)
    with pytest.raises(ArgumentError, match="op="):
        comm.allreduce(x, op="median")
    assert comm.allreduce(x) is x                     # still in step after the aborted calls
    comm.close()
    with pytest.raises(CommError):
        comm.allreduce(x)
    assert comm._fast(x, None, "sum") is False


def test_heap_arrays_take_the_fast_call_too():
    with collectx.init(0, 1) as comm:
        x = comm.empty(6, np.float32)
        x[:] = 2
        comm.allreduce(x)
        assert comm._fast(x, None, "sum") is True and x.tolist() == [2.0] * 6
        y = np.ones(6, np.float32)
        assert comm._fast(y, None, "sum") is True
        out = comm.empty(6, np.float32)
        comm.allreduce(y, out=out)
        assert comm._fast_allreduce(x, out, "sum") is True and out.tolist() == [2.0] * 6


def test_fast_call_declines_while_the_engine_lock_is_held():
    comm, x = _one_rank_fast_call()
    lock = comm._engine._lock
    with lock:
        assert lock.locked()
        assert comm._fast(x, None, "sum") is False    # the checked path would wait for it
    assert not lock.locked()
    assert comm._fast(x, None, "sum") is True
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()
    comm.close()


def test_engine_lock_waits_without_the_gil():
    import threading
    comm, x = _one_rank_fast_call()
    lock, order = comm._engine._lock, []
    lock.acquire()
    t = threading.Thread(target=lambda: (comm.allreduce(x), order.append("call")))
    t.start()
    t.join(0.2)                                       # blocked on the lock, GIL free
    order.append("main")
    lock.release()
    t.join(10)
    assert order == ["main", "call"] and x.tolist() == list(range(6))
    comm.close()


def test_a_dropped_communicator_and_its_fast_call_are_collected():
    import gc
    import weakref
    comm, x = _one_rank_fast_call()
    assert comm.allreduce(x) is x and comm._fast.calls == 1
    engine = weakref.ref(comm._engine)
    del comm
    gc.collect()
    assert engine() is None                           # the engine <-> fast call cycle is freed


# -- allreduce(x, out=), allgather(x, out=), reduce_scatter(x, out=) --------------------------

WITH_OUT = ("allreduce", "allgather", "reduce_scatter", "alltoall")


@pytest.mark.parametrize("nranks", [2, 3])
def test_calls_with_out_run_through_their_fast_calls(nranks):
    cases = [("allreduce", d, o, n) for d, o, n in (
        ("float32", "sum", 5), ("float64", "prod", 3), ("int32", "min", 17), ("int8", "max", 4),
        ("int64", "avg", 9), ("float16", "sum", 64), ("float32", "avg", 6))]
    cases += [("allgather", d, None, n) for d, n in (
        ("float32", 5), ("int64", 3), ("uint8", 1000), ("float16", 2), ("int8", 1))]
    cases += [("reduce_scatter", d, o, n) for d, o, n in (
        ("float32", "sum", 5), ("float64", "avg", 3), ("int32", "max", 7), ("int8", "min", 2),
        ("uint8", "sum", 3), ("int64", "prod", 4))]
    cases += [("alltoall", d, None, n) for d, n in (("float32", 5), ("int64", 2), ("uint8", 9))]
    per_rank = collectx.launch(W.results_with_out, nranks, args=(cases,), timeout=240)
    for rank, results in enumerate(per_rank):
        for case, (failures, fast) in zip(cases, results):
            assert failures == [], (rank, failures)
            assert fast == 3, (rank, case, fast)           # the first call arms it


def _one_rank_fast_call_with_out(coll):
    comm = collectx.init(0, 1)
    x, out = np.arange(6, dtype=np.float32), np.empty(6, np.float32)
    W.run_with_out(comm, coll, x, out, "sum")
    return comm, x, out, getattr(comm, W.SLOTS[coll])


def _op_of(coll):
    return None if coll in ("allgather", "alltoall") else "sum"


@pytest.mark.parametrize("coll", WITH_OUT)
def test_fast_call_with_out_declines_other_arrays_untouched(coll):
    comm, x, out, fast = _one_rank_fast_call_with_out(coll)
    op = _op_of(coll)
    assert fast(x, out, op) is True and fast.calls == 1
    ro = out.copy()
    ro.flags.writeable = False
    shared = np.zeros(9, np.float32)
    heap = comm.empty(6, np.float32)
    heap[:] = 5
    bad_outs = [np.empty(5, np.float32), np.empty(7, np.float32), out.astype(np.float64), ro,
                np.empty(12, np.float32)[::2], out.astype(">f4"), x, out.tolist(),
                memoryview(out), None]
    bad_inputs = [x.astype(np.float64), np.arange(12, dtype=np.float32)[::2], x[:5].copy(),
                  x.astype(">f4"), x.tolist()]
    calls = [(x, y) for y in bad_outs] + [(y, out) for y in bad_inputs]
    calls += [(shared[:6], shared[3:]), (shared[3:], shared[:6]), (out, out)]  # overlapping
    for a, b in calls:
        before = [np.array(v, copy=True) for v in (a, b, x, out) if v is not None]
        assert fast(a, b, op) is False, (a, b)
        after = [np.asarray(v) for v in (a, b, x, out) if v is not None]
        for u, v in zip(before, after):
            np.testing.assert_array_equal(u, v)
    assert fast(x, out, "max" if op else "sum") is False and fast(x, out, 0) is False
    assert fast(x.reshape(2, 3), out.reshape(3, 2), op) is True  # any C shape
    assert fast(heap, out, op) is True and out.tolist() == [5.0] * 6   # window memory too
    assert fast.calls == 3
    with pytest.raises(TypeError):
        fast(x, out)
    comm.close()


@pytest.mark.parametrize("coll", WITH_OUT)
def test_checked_path_errors_with_out_are_unchanged(coll):
    comm, x, out, fast = _one_rank_fast_call_with_out(coll)
    op = _op_of(coll)
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises(ArgumentError, match="expected 6"):
        W.run_with_out(comm, coll, x, np.empty(7, np.float32), op)
    with pytest.raises(DTypeError, match="same dtype"):
        W.run_with_out(comm, coll, x, out.astype(np.float64), op)
    with pytest.raises(ArgumentError, match="read-only"):
        W.run_with_out(comm, coll, x, ro, op)
    with pytest.raises(ArgumentError, match="non-contiguous"):
        W.run_with_out(comm, coll, x, np.empty(12, np.float32)[::2], op)
    if op is not None:
        with pytest.raises(ArgumentError, match="op="):
            W.run_with_out(comm, coll, x, out, "median")
    assert fast.calls == 0
    shared = np.arange(9, dtype=np.float32)             # overlapping: staged by the checked path
    W.run_with_out(comm, coll, shared[:6], shared[3:], op)
    assert shared.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5]
    assert W.run_with_out(comm, coll, x, out, op) is out and fast.calls == 1  # still in step
    comm.close()
    with pytest.raises(CommError):
        W.run_with_out(comm, coll, x, out, op)
    assert fast.enabled is False
    assert getattr(comm, W.SLOTS[coll])(x, out, op) is False


def test_async_calls_drop_the_fast_calls_until_a_synchronous_one():
    comm, x, out, fast = _one_rank_fast_call_with_out("allgather")
    work = comm.allgather(x, out=out, async_op=True)
    assert all(getattr(comm, slot)(x, out, None) is False for slot in W.SLOTS.values())
    comm.allgather(x, out=out)                          # drains the queue on the checked path
    assert work.result() is out and fast.calls == 0
    assert comm._fast_allgather is fast                 # armed again, the same cached call
    assert comm.allgather(x, out=out) is out and fast.calls == 1
    comm.close()


@pytest.mark.parametrize("coll", WITH_OUT)
def test_mismatch_and_peer_abort_reach_a_fast_call_with_out(coll):
    results = collectx.launch(W.mismatch_and_abort_on_fast_call_with_out, 2, args=(coll,),
                              timeout=120)
    want = [1.0] * 8 if coll in ("allgather", "alltoall") else [2.0] * 4
    for rank, (mismatch, abort, after) in enumerate(results):
        name, message, _ = mismatch
        assert name == "CollectiveMismatch", (rank, name, message)
        assert "rank 0:" in message and "rank 1:" in message
        assert after == want                               # still usable, and in step
    assert results[0][0][2] == 1                           # rank 0's side ran the fast call
    assert results[1][1][:2] == ["ArgumentError", None]
    assert results[0][1] == ["PeerAborted", 1, 1]


@pytest.mark.parametrize("coll", WITH_OUT)
def test_peer_death_during_a_fast_call_with_out_raises_peer_failure(tmp_path, coll):
    with pytest.raises(collectx.errors.RankFailed, match="rank 1 was killed by signal SIGKILL"):
        collectx.launch(W.peer_dies_during_fast_call_with_out, 2, args=(str(tmp_path), coll),
                        grace=20, timeout=120)
    name, rank, seconds, fast, later = json.loads((tmp_path / "rank0.json").read_text())
    assert (name, rank) == ("PeerFailure", 1)
    assert seconds < 5.0
    assert fast == 1
    assert later == "CommError"


def test_missing_peer_times_out_in_a_fast_call_with_out():
    results = collectx.launch(W.never_arrives_on_fast_call_with_out, 2,
                              args=(1.0, "reduce_scatter"), timeout=120)
    name, seconds, fast = results[0]
    assert name == "Timeout" and fast == 1
    assert 0.9 < seconds < 6.0


# -- broadcast, reduce, and allgather / reduce_scatter in place (NCCL style) --------------------

@pytest.mark.parametrize("nranks", [2, 3])
def test_rooted_and_in_place_calls_run_through_their_fast_calls(nranks):
    last = nranks - 1
    cases = [("broadcast", d, None, n, root) for d, n, root in (
        ("float32", 5, 0), ("int64", 3, last), ("uint8", 1000, 1), ("float16", 64, 0))]
    cases += [(kind, d, o, n, root) for kind in ("reduce", "reduce_out") for d, o, n, root in (
        ("float32", "sum", 5, 0), ("float64", "avg", 3, last), ("int32", "max", 17, 1),
        ("int8", "min", 4, 0))]
    cases += [("allgather_inplace", d, None, n, 0) for d, n in (("float32", 5), ("int64", 1))]
    cases += [("reduce_scatter_inplace", d, o, n * nranks, 0) for d, o, n in (
        ("float32", "sum", 5), ("int32", "prod", 2), ("float64", "avg", 3))]
    per_rank = collectx.launch(W.results_rooted_and_in_place, nranks, args=(cases,), timeout=240)
    for rank, results in enumerate(per_rank):
        for case, (failures, fast) in zip(cases, results):
            assert failures == [], (rank, failures)
            assert fast == 3, (rank, case, fast)           # the first call arms it


def test_rooted_and_in_place_fast_calls_decline_other_layouts_untouched():
    comm = collectx.init(0, 1)
    x, out = np.arange(6, dtype=np.float32), np.empty(6, np.float32)
    comm.broadcast(x, 0)
    bcast = comm._fast_broadcast
    assert bcast(x, None, None, 0) is True and bcast.calls == 1
    assert bcast(x, None, None, 1) is False and bcast(x, None, None, np.int64(0)) is False
    assert bcast(x, None, None) is True                  # no root given: root 0
    assert bcast(x, out, None, 0) is False and bcast(x, x, None, 0) is True  # out=x: the same
    comm.reduce(x, 0, out=out, op="max")
    red = comm._fast_reduce
    assert red(x, out, "max", 0) is True
    assert red(x, None, "max", 0) is False               # in place is another layout
    assert red(x, out, "sum", 0) is False and red(x, out, "max", 1) is False
    with pytest.raises(TypeError):
        bcast(x, None, None, 0, 1)
    comm.close()
    assert bcast(x, None, None, 0) is False and red(x, out, "max", 0) is False


def test_in_place_fast_calls_decline_other_blocks_untouched():
    results = collectx.launch(W.in_place_fast_calls_decline, 2, timeout=120)
    for rank, (answers, untouched, ran) in enumerate(results):
        assert answers == [True, False, False, False, False, True, False, False], rank
        assert untouched and ran == [1, 1]


def test_root_mismatch_against_a_fast_broadcast_raises_on_every_rank():
    results = collectx.launch(W.root_mismatch_on_fast_broadcast, 2, timeout=120)
    for rank, (name, message, ran, after) in enumerate(results):
        assert name == "CollectiveMismatch", (rank, name, message)
        assert "root" in message
        assert after == [5.0] * 4                         # still usable, in step: root 0's x
    assert results[0][2] == 1                             # rank 0's side was the fast call


def test_root_death_during_a_fast_broadcast_raises_peer_failure(tmp_path):
    with pytest.raises(collectx.errors.RankFailed, match="rank 1 was killed by signal SIGKILL"):
        collectx.launch(W.root_dies_during_fast_broadcast, 2, args=(str(tmp_path),), grace=20,
                        timeout=120)
    name, rank, seconds, fast = json.loads((tmp_path / "rank0.json").read_text())
    assert (name, rank) == ("PeerFailure", 1)
    assert seconds < 5.0 and fast == 1
