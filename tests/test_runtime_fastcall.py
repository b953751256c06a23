"""The compiled fast call of Communicator.allreduce(x) (collectx._fastpath.FastCall).

Once an in-place allreduce of a plain numpy array has run, later calls with the same dtype,
element count and op run through one C call. These tests check it is the path taken (its call
counter), that results are right for every op and several dtypes and shapes, that it declines
everything else untouched, and that mismatches, aborted calls, dead peers and timeouts raise as
on the checked path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import _fastcall_workers as W
import collectx
from collectx.errors import ArgumentError, CommError
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
    assert fast(x, "sum") is True and fast.calls == 1
    ro = x.copy()
    ro.flags.writeable = False
    declined = [x.astype(np.float64), x[::2].copy(), np.arange(12, dtype=np.float32)[::2],
                ro, x.astype(">f4"), x[:5].copy(), x.tolist(), memoryview(x)]
    for y in declined:
        before = np.array(y, copy=True)
        assert fast(y, "sum") is False
        np.testing.assert_array_equal(np.asarray(y), before)
    assert fast(x, "max") is False and fast(x, 0) is False
    assert fast(x.reshape(2, 3), "sum") is True      # same dtype and count, any C shape
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
    assert comm._fast(x, "sum") is False


def test_heap_arrays_take_the_checked_path():
    with collectx.init(0, 1) as comm:
        x = comm.empty(6, np.float32)
        x[:] = 2
        comm.allreduce(x)
        assert comm._fast(x, "sum") is False
        y = np.ones(6, np.float32)
        comm.allreduce(y)
        assert comm._fast(x, "sum") is False and comm._fast(y, "sum") is True
        assert x.tolist() == [2.0] * 6


def test_fast_call_declines_while_the_engine_lock_is_held():
    comm, x = _one_rank_fast_call()
    lock = comm._engine._lock
    with lock:
        assert lock.locked()
        assert comm._fast(x, "sum") is False          # the checked path would wait for it
    assert not lock.locked()
    assert comm._fast(x, "sum") is True
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
