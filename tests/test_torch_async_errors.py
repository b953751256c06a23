"""async_op=True overlaps, futures complete with the outputs, and failures raise instead of hang."""

from __future__ import annotations

import os
import time

import _needs as needs

torch = needs.module("torch")
import torch.distributed as dist  # noqa: E402

from collectx.integrations.torch_testing import run_ranks  # noqa: E402

LATE_S = 1.5      # how long the late rank sleeps before joining the collective
SHORT_TIMEOUT = {"COLLECTX_TIMEOUT": "15"}


def _async_while_peer_is_late(rank, world):
    x = torch.full((1 << 16,), float(rank + 1))
    if rank == 1:
        time.sleep(LATE_S)
    start = time.perf_counter()
    work = dist.all_reduce(x, async_op=True)
    returned_s = time.perf_counter() - start
    done_at_return = work.is_completed()
    loops = _python_for(LATE_S / 4) if rank == 0 else 0
    done_after_python = work.is_completed()
    callback_seen = []
    chained = work.get_future().then(lambda fut: callback_seen.append(fut.value()[0][0].item()))
    work.wait()
    chained.wait()
    return {"returned_s": returned_s, "done_at_return": done_at_return,
            "waited_s": time.perf_counter() - start, "value": x[0].item(),
            "all_equal": bool((x == x[0]).all()), "callback": callback_seen,
            "future_is_output": work.get_future().value()[0] is x, "python_loops": loops,
            "done_after_python": done_after_python}


def _python_for(seconds: float) -> int:
    """Spin the interpreter for ``seconds``; returns how many loop turns it managed."""
    turns, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        turns += 1
    return turns


def test_async_returns_before_a_late_peer_joins():
    first, late = run_ranks(_async_while_peer_is_late, 2, timeout_s=120)
    assert first["returned_s"] < LATE_S / 3, first
    assert first["done_at_return"] is False
    # The collective waits for the late peer off this thread with the GIL released: Python kept
    # running meanwhile, and had finished its loop while the collective was still pending.
    assert first["python_loops"] > 1000 and first["done_after_python"] is False, first
    assert first["waited_s"] >= LATE_S / 2, "wait() returned before the late peer joined"
    for result in (first, late):
        assert result["value"] == 3.0 and result["all_equal"]
        assert result["callback"] == [3.0]
        assert result["future_is_output"]


def _queued_in_order(rank, world):
    """Several async collectives in flight at once complete in order with the right values."""
    xs = [torch.full((1000 + i,), float(rank + i)) for i in range(6)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    gathered = torch.empty(2 * world)
    works.append(dist.all_gather_into_tensor(gathered, torch.tensor([rank, -rank], dtype=torch.float),
                                             async_op=True))
    for work in works:
        work.wait()
    return [x[0].item() for x in xs], gathered.tolist()


def test_async_queue_keeps_call_order():
    for sums, gathered in run_ranks(_queued_in_order, 2, timeout_s=120):
        assert sums == [float(2 * i + 1) for i in range(6)]
        assert gathered == [0.0, 0.0, 1.0, -1.0]


def _size_mismatch(rank, world):
    from collectx.errors import CollectXError
    x = torch.ones(8 if rank == 0 else 24)
    start = time.perf_counter()
    try:
        dist.all_reduce(x)
    except RuntimeError as err:
        return {"type": type(err).__name__, "collectx": isinstance(err, CollectXError),
                "message": str(err), "seconds": time.perf_counter() - start}
    return {"type": None, "message": "no error"}


def test_mismatched_sizes_raise_runtime_error():
    for result in run_ranks(_size_mismatch, 2, timeout_s=120, env=SHORT_TIMEOUT):
        assert result["type"] is not None, "a size mismatch went unnoticed"
        assert result["collectx"], result
        assert result["message"]


def _peer_dies(rank, world):
    from collectx.errors import CollectXError
    x = torch.ones(1024)
    dist.all_reduce(x)                 # everyone is connected and healthy
    if rank == 1:
        os._exit(3)                    # dies without a word
    time.sleep(0.5)
    errors = []
    for _ in range(2):                 # the second call must fail fast, not hang
        start = time.perf_counter()
        try:
            dist.all_reduce(x)
            errors.append(None)
        except RuntimeError as err:
            errors.append((type(err).__name__, isinstance(err, CollectXError), str(err),
                           time.perf_counter() - start))
    return errors


def test_dead_peer_raises_instead_of_hanging():
    first, dead = run_ranks(_peer_dies, 2, timeout_s=120, env=SHORT_TIMEOUT, may_exit=(1,))
    assert dead is None
    assert all(error is not None for error in first), first
    (name, is_collectx, message, _), (_, again_collectx, _, again_s) = first
    assert is_collectx and again_collectx, first
    assert message
    assert again_s < 5.0, "a second collective on a broken group should fail fast"
