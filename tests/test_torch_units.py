"""In-process checks of the torch backend's parts: op mapping, staging, runner, work, p2p."""

from __future__ import annotations

import datetime
import sys
import threading
import time

import pytest

import _needs as needs

torch = needs.module("torch")
import torch.distributed as dist  # noqa: E402

from collectx import errors  # noqa: E402
from collectx.integrations import torch_backend  # noqa: E402
from collectx.integrations.torch_ops import (Flat, concat, device_type, reduce_op,  # noqa: E402
                                             same_dtype, scatter_back, split_rows)
from collectx.integrations.torch_p2p import StoreP2P  # noqa: E402
from collectx.integrations.torch_work import CollectxWork, SerialRunner  # noqa: E402


def test_import_collectx_does_not_import_torch():
    import subprocess
    code = "import sys, collectx; collectx.CollectXError; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert out.stdout.strip() == "False", out.stderr


def test_register_is_idempotent_and_names_the_devices():
    import collectx.torch  # noqa: F401
    torch_backend.register()
    assert dist.is_backend_available("collectx")
    assert dist.Backend.backend_capability["collectx"] == ["cpu", "cuda"]


@pytest.mark.parametrize("op, name", [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"),
                                      (dist.ReduceOp.PRODUCT, "prod"), (dist.ReduceOp.MIN, "min"),
                                      (dist.ReduceOp.MAX, "max")])
def test_reduce_ops_map_to_collectx_names(op, name):
    assert reduce_op(op) == (name, None)


def test_premul_sum_carries_its_factor_and_bitwise_ops_are_refused():
    assert reduce_op(dist._make_nccl_premul_sum(3.0)) == ("sum", 3.0)
    with pytest.raises(errors.DTypeError, match="BAND|bitwise"):
        reduce_op(dist.ReduceOp.BAND)


def test_flat_stages_strided_tensors_and_writes_back():
    base = torch.zeros(4, 2)
    column = base[:, 1]
    flat = Flat(column)
    assert flat.staged and flat.data.is_contiguous()
    flat.data.fill_(7)
    flat.commit()
    assert base[:, 1].tolist() == [7.0] * 4 and base[:, 0].tolist() == [0.0] * 4
    dense = torch.ones(3)
    assert not Flat(dense).staged and Flat(dense).data.data_ptr() == dense.data_ptr()


def test_concat_pads_and_scatter_back_inverts():
    parts = [torch.tensor([1, 2]), torch.tensor([3])]
    padded = concat(parts, pad_to=3)
    assert padded.tolist() == [1, 2, 0, 3, 0, 0]
    outs = [torch.empty(2, dtype=torch.int64), torch.empty(1, dtype=torch.int64)]
    scatter_back(padded, outs, stride=3)
    assert [o.tolist() for o in outs] == [[1, 2], [3]]


def test_argument_checks_name_what_was_seen():
    with pytest.raises(errors.ArgumentError, match="split sizes"):
        split_rows(torch.zeros(5, 2), [1, 1], 2)
    with pytest.raises(errors.ArgumentError, match="evenly"):
        split_rows(torch.zeros(5), [], 2)
    with pytest.raises(errors.DTypeError, match="one dtype"):
        same_dtype([torch.zeros(1), torch.zeros(1, dtype=torch.int64)], "allgather")
    with pytest.raises(errors.ArgumentError, match="meta"):
        device_type([torch.zeros(1, device="meta")])


def test_cuda_without_a_cuda_communicator_is_a_clear_error(monkeypatch):
    import collectx
    monkeypatch.setattr(collectx, "cuda_available", lambda: False, raising=False)
    with pytest.raises(errors.NativeUnavailable, match="CUDA"):
        torch_backend._make_communicator(dist.HashStore(), 0, 1, None, device="cuda")


def test_only_an_explicit_timeout_is_forwarded():
    from torch.distributed.constants import default_pg_timeout
    assert not torch_backend._explicit_timeout(default_pg_timeout)
    assert not torch_backend._explicit_timeout(None)
    assert torch_backend._explicit_timeout(datetime.timedelta(seconds=20))


def test_a_communicator_made_again_on_a_torch_store_gets_new_keys():
    from collectx.runtime.store import as_store, next_key_prefix
    store = dist.HashStore()     # each group torch builds over it wraps it afresh
    assert [next_key_prefix("comm", as_store(store), r) for r in (0, 1, 0, 1)] == \
        ["collectx/comm0", "collectx/comm0", "collectx/comm1", "collectx/comm1"]
    assert as_store(store).check("collectx/made/comm/0")
    assert not as_store(store).check("collectx/made/cuda/0")


def test_runner_runs_async_work_in_order_off_the_caller_thread():
    runner = SerialRunner("unit")
    seen, gate = [], threading.Event()
    first = runner.submit(lambda: (gate.wait(5), seen.append(threading.current_thread().name)),
                          [], async_op=True)
    second = runner.submit(lambda: seen.append("second"), [], async_op=False)
    assert not first.is_completed()          # queued behind the gate: the call returned early
    gate.set()
    second.wait()
    assert first.is_completed() and seen == ["collectx-unit", "second"]
    runner.close()


def test_runner_fails_fast_after_a_failure():
    runner = SerialRunner("unit")
    work = runner.submit(lambda: (_ for _ in ()).throw(errors.PeerFailure("rank 1 died", 1)),
                         [], async_op=False)
    with pytest.raises(errors.PeerFailure, match="rank 1 died"):
        work.wait()
    assert isinstance(work.exception(), errors.PeerFailure) and not work.is_success()
    with pytest.raises(errors.CommError, match="unusable"):
        runner.submit(lambda: None, [], async_op=True)
    runner.close()
    with pytest.raises(errors.CommError, match="shut down"):
        runner.submit(lambda: None, [], async_op=True)


def test_runner_stays_usable_after_a_refused_argument():
    runner = SerialRunner("unit")
    work = runner.submit(lambda: (_ for _ in ()).throw(errors.DTypeError("dtype bool")), [],
                         async_op=False)
    with pytest.raises(errors.DTypeError, match="bool"):
        work.wait()
    seen = []
    runner.submit(lambda: seen.append("next"), [], async_op=False).wait()
    assert seen == ["next"]
    runner.close()


def test_work_future_holds_the_outputs_and_wait_times_out():
    out = torch.ones(2)
    work = CollectxWork([out])
    with pytest.raises(errors.Timeout, match="0.1 s"):
        work.wait(datetime.timedelta(seconds=0.1))
    work._finish()
    assert work.wait() and work.get_future().value()[0] is out and work.is_success()


def test_store_p2p_matches_messages_by_order():
    store = dist.HashStore()
    a, b = StoreP2P(store, 0, 5.0), StoreP2P(store, 1, 5.0)
    for value in (1.5, 2.5):
        a.send(torch.tensor([value, -value], dtype=torch.bfloat16), 1)
    got = torch.empty(2, dtype=torch.bfloat16)
    b.recv(got, 0)
    assert got.tolist() == [1.5, -1.5]
    b.recv(got, 0)
    assert got.tolist() == [2.5, -2.5]
    with pytest.raises(errors.ArgumentError, match="same size"):
        a.send(torch.zeros(3), 1)
        b.recv(torch.zeros(2), 0)


def test_store_p2p_recv_times_out_naming_the_peer():
    p2p = StoreP2P(dist.HashStore(), 1, 0.2)
    start = time.monotonic()
    with pytest.raises(errors.Timeout, match="rank 0"):
        p2p.recv(torch.zeros(1), 0)
    assert time.monotonic() - start < 5


def test_host_views_contiguous_tensors_without_a_copy():
    from collectx.integrations.torch_ops import host
    dense = torch.arange(6, dtype=torch.float32).view(2, 3)
    view = host(dense)
    assert type(view).__name__ == "ndarray" and view.ctypes.data == dense.data_ptr()
    view[0, 0] = 42.0                                 # writes land in the tensor
    assert dense[0, 0].item() == 42.0
    grad = torch.ones(3, requires_grad=True)          # a leaf that requires grad: still a view
    assert host(grad).ctypes.data == grad.data_ptr()
    for other in (dense[:, 1], torch.ones(2, dtype=torch.bfloat16),
                  torch.ones(2, dtype=torch.bool)):
        assert host(other) is other                   # strided, no numpy dtype, unsupported


class _RecordingComm:
    """Stands in for the Communicator: records what each collective was handed."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
        return record


def _group_with_recording_comm():
    group = torch_backend.CollectxProcessGroup(dist.HashStore(), 0, 1)
    group._comms["cpu"].close()
    group._comms["cpu"] = _RecordingComm()
    return group, group._comms["cpu"]


def test_collectives_hand_the_communicator_the_tensors_own_memory():
    from torch._C._distributed_c10d import AllgatherOptions
    group, comm = _group_with_recording_comm()
    x = torch.ones(4, 3)
    out = torch.empty(12)
    opts = [dist.AllreduceOptions(), AllgatherOptions(), dist.BroadcastOptions()]
    for o in opts:
        o.asyncOp = False                             # run inline: recorded on return
    group.allreduce([x], opts[0])
    group._allgather_base(out, x, opts[1])
    group.broadcast([x], opts[2])
    (_, (ar, *_), _), (_, (ag,), ag_kw), (_, (bc,), _) = comm.calls
    assert ar.ctypes.data == x.data_ptr() == ag.ctypes.data == bc.ctypes.data
    assert ag_kw["out"].ctypes.data == out.data_ptr()
    group.shutdown()


def test_work_future_made_before_or_after_completion_settles_once():
    out = torch.ones(2)
    early, late = CollectxWork([out]), CollectxWork([out])
    seen = []
    early.get_future().then(lambda fut: seen.append(fut.value()[0] is out))
    assert seen == [] and not early.is_completed()
    early._finish()
    late._finish()
    late.get_future().then(lambda fut: seen.append(fut.value()[0] is out))
    assert seen == [True, True]
    assert early.get_future() is early.get_future()   # one future per work
    failed = CollectxWork([out])
    failed._finish(errors.PeerFailure("rank 1 died", 1))
    with pytest.raises(errors.PeerFailure, match="rank 1 died"):
        failed.get_future().wait()


def test_wait_blocks_until_another_thread_finishes_the_work():
    work = CollectxWork([])
    threading.Timer(0.2, work._finish).start()
    assert work.wait(datetime.timedelta(seconds=10)) and work.is_completed()


def test_copy_and_zero_move_any_dtype_and_layout():
    from collectx.integrations.torch_ops import copy, zero
    base = torch.zeros(4, 2, dtype=torch.bfloat16)
    copy(base[:, 1], torch.tensor([1.5, 2.5, 3.5, 4.5], dtype=torch.bfloat16))
    assert base[:, 1].tolist() == [1.5, 2.5, 3.5, 4.5] and base[:, 0].tolist() == [0.0] * 4
    flags = torch.zeros(2, 2, dtype=torch.bool)
    copy(flags, torch.tensor([True, False, False, True]))      # shapes differ, counts agree
    assert flags.tolist() == [[True, False], [False, True]]
    wide = torch.ones(3, dtype=torch.float64)
    copy(wide, torch.tensor([1, 2, 3], dtype=torch.int64))       # dtypes differ: torch converts
    assert wide.tolist() == [1.0, 2.0, 3.0]
    zero(base[:, 1])
    assert not base.any()


def test_a_refused_argument_raises_and_leaves_the_group_usable():
    import collectx.torch  # noqa: F401
    dist.init_process_group("collectx", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.ones(4)
        with pytest.raises(errors.DTypeError, match="bool"):
            dist.all_reduce(torch.ones(4, dtype=torch.bool))
        with pytest.raises(errors.ArgumentError, match=r"outputs\[0\] \(this rank's\) has 3"):
            dist.all_gather([torch.empty(3)], x)
        with pytest.raises(errors.ArgumentError, match="reduce_scatter inputs"):
            dist.reduce_scatter(x, [torch.empty(2)])
        with pytest.raises(errors.ArgumentError, match="sparse_coo"):
            dist.all_reduce(x.to_sparse())
        dist.all_reduce(x)
        assert x.tolist() == [1.0] * 4
    finally:
        dist.destroy_process_group()
