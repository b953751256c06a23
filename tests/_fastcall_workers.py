"""Rank functions for the compiled allreduce fast-call tests (module level so launch() can
pickle them). Each returns what it saw, including how many calls the fast call ran."""

from __future__ import annotations

import json
import os
import signal
import time
import zlib

import numpy as np

import collectx

REDUCE = {"sum": np.add.reduce, "prod": np.multiply.reduce, "min": np.minimum.reduce,
          "max": np.maximum.reduce}


def _input(seed: int, rank: int, n: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-3, 4 if dtype != "uint8" else 3, n).astype(dtype)


def _expected(seed: int, size: int, n: int, dtype: str, op: str) -> np.ndarray:
    stack = np.stack([_input(seed, r, n, dtype) for r in range(size)])
    red = REDUCE["sum" if op == "avg" else op](stack, axis=0).astype(dtype)
    if op != "avg":
        return red
    if stack.dtype.kind == "f":
        return (red * stack.dtype.type(1.0 / size)).astype(dtype)
    return np.trunc(red / size).astype(dtype)


def _fast_calls(comm) -> int:
    return getattr(comm._fast, "calls", -1)


def results_per_signature(cases: list) -> list:
    """Every (dtype, op, n) case four times in a row, fresh data each time; per case: the
    failures and how many of the four calls the fast call ran."""
    comm = collectx.init(timeout=60)
    out = []
    for dtype, op, n in cases:
        failures, fast = [], 0
        for rep in range(4):
            seed = zlib.crc32(f"{dtype}{op}{n}{rep}".encode())  # equal on every rank
            x = _input(seed, comm.rank, n, dtype).reshape(-1, 1) if n % 2 == 0 else \
                _input(seed, comm.rank, n, dtype)
            before = _fast_calls(comm)
            got = comm.allreduce(x, op=op)
            fast += int(_fast_calls(comm) == before + 1 and before >= 0)
            if got is not x or not np.array_equal(x.reshape(-1), _expected(seed, comm.size, n,
                                                                          dtype, op)):
                failures.append((dtype, op, n, rep, x.reshape(-1)[:4].tolist()))
        out.append((failures, fast))
    comm.close()
    return out


def mismatch_on_fast_call(kind: str) -> list:
    """Both ranks arm the fast call, then rank 1 makes a different call (``kind``) while rank 0
    repeats the armed one; then both go on with the armed call."""
    comm = collectx.init(timeout=60)
    x = np.ones(8, np.float32)
    comm.allreduce(x)
    comm.allreduce(x)
    odd = comm.rank == 1
    calls = {"op": lambda: comm.allreduce(x, op="max" if odd else "sum"),
             "size": lambda: comm.allreduce(np.ones(9 if odd else 8, np.float32)),
             "dtype": lambda: comm.allreduce(np.ones(8, np.float64) if odd else x),
             "collective": lambda: comm.allgather(x) if odd else comm.allreduce(x)}
    before = _fast_calls(comm)
    try:
        calls[kind]()
        got = [None]
    except Exception as e:
        got = [type(e).__name__, str(e)]
    got.append(_fast_calls(comm) - before)
    y = np.full(8, comm.rank + 1.0, np.float32)
    comm.allreduce(y)
    got.append(y.tolist())
    comm.close()
    return got


def peer_dies_during_fast_call(path: str) -> None:
    """Rank 1 SIGKILLs itself while rank 0 waits in the armed fast call; rank 0 writes what it
    saw to ``path``/rank0.json."""
    comm = collectx.init(timeout=60)
    x = np.ones(4, np.float32)
    comm.allreduce(x)
    comm.allreduce(x)
    if comm.rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    before = _fast_calls(comm)
    t0 = time.monotonic()
    try:
        comm.allreduce(x)
        got = [None]
    except Exception as e:
        got = [type(e).__name__, getattr(e, "rank", None), time.monotonic() - t0]
    got.append(_fast_calls(comm) - before)
    try:
        comm.allreduce(x)
        got.append(None)
    except Exception as e:
        got.append(type(e).__name__)
    with open(os.path.join(path, "rank0.json"), "w") as f:
        json.dump(got, f)


def peer_aborts_fast_call() -> list:
    """Rank 1 passes a read-only array (ArgumentError, its call aborted) while rank 0 runs the
    armed fast call; then both run it again."""
    comm = collectx.init(timeout=60)
    x = np.ones(4, np.float32)
    comm.allreduce(x)
    comm.allreduce(x)
    before = _fast_calls(comm)
    try:
        if comm.rank == 1:
            ro = np.ones(4, np.float32)
            ro.flags.writeable = False
            comm.allreduce(ro)
        else:
            comm.allreduce(x)
        got = [None]
    except Exception as e:
        got = [type(e).__name__, getattr(e, "rank", None)]
    got.append(_fast_calls(comm) - before)
    y = np.full(4, comm.rank + 1.0, np.float32)
    comm.allreduce(y)
    comm.allreduce(y)
    got.append(y.tolist())
    return got


def never_arrives_on_fast_call(timeout: float) -> list:
    comm = collectx.init(timeout=timeout)
    x = np.ones(4, np.float32)
    comm.allreduce(x)
    comm.allreduce(x)
    if comm.rank == 1:
        time.sleep(timeout + 2)
        return ["skipped"]
    before = _fast_calls(comm)
    t0 = time.monotonic()
    try:
        comm.allreduce(x)
        return [None]
    except Exception as e:
        return [type(e).__name__, time.monotonic() - t0, _fast_calls(comm) - before]


def async_then_fast() -> list:
    """Queued async calls run before a later synchronous one (which declines the fast call
    while they are pending), in call order."""
    comm = collectx.init(timeout=60)
    x = np.ones(4, np.float32)
    comm.allreduce(x)
    comm.allreduce(x)                       # armed
    works = [comm.allreduce(np.full(4, float(i), np.float32), async_op=True) for i in range(3)]
    comm.allreduce(x)                       # drains the queue, then runs
    vals = [w.result().tolist()[0] for w in works]
    before = _fast_calls(comm)
    comm.allreduce(x)
    return [vals, x.tolist(), _fast_calls(comm) - before]


# -- out-of-place fast calls: allreduce(x, out=), allgather(x, out=), reduce_scatter(x, out=) --

SLOTS = {"allreduce": "_fast_allreduce", "allgather": "_fast_allgather",
         "reduce_scatter": "_fast_reduce_scatter", "alltoall": "_fast_alltoall"}


def _slot_calls(comm, coll: str) -> int:
    return getattr(getattr(comm, SLOTS[coll]), "calls", -1)


def run_with_out(comm, coll: str, x, out, op=None):
    """``coll`` of ``x`` into ``out`` (``op`` for the reductions); returns what the call did."""
    if coll in ("allgather", "alltoall"):
        return getattr(comm, coll)(x, out=out)
    return getattr(comm, coll)(x, out=out, op=op)


def with_out_shapes(coll: str, size: int, n: int) -> tuple[int, int]:
    """(input, output) element counts of ``coll`` with ``n`` elements per rank's block."""
    return {"allreduce": (n, n), "allgather": (n, n * size),
            "reduce_scatter": (n * size, n), "alltoall": (n * size, n * size)}[coll]


def _expected_with_out(coll, seed, size, rank, n, dtype, op) -> np.ndarray:
    if coll == "allgather":
        return np.concatenate([_input(seed, r, n, dtype) for r in range(size)])
    if coll == "allreduce":
        return _expected(seed, size, n, dtype, op)
    if coll == "alltoall":     # block q of the output: block `rank` of rank q's input
        return np.concatenate([_input(seed, q, n * size, dtype)[rank * n:(rank + 1) * n]
                               for q in range(size)])
    return _expected(seed, size, n * size, dtype, op)[rank * n:(rank + 1) * n]


def results_with_out(cases: list) -> list:
    """Every (collective, dtype, op, n) case four times in a row into a fresh ``out``, fresh
    data each time; per case: the failures (wrong result, input changed, result not ``out``)
    and how many of the four calls the collective's fast call ran."""
    comm = collectx.init(timeout=60)
    results = []
    for coll, dtype, op, n in cases:
        n_in, n_out = with_out_shapes(coll, comm.size, n)
        failures, fast = [], 0
        for rep in range(4):
            seed = zlib.crc32(f"{coll}{dtype}{op}{n}{rep}".encode())  # equal on every rank
            x = _input(seed, comm.rank, n_in, dtype)
            if n_in % 2 == 0:
                x = x.reshape(2, -1)                      # any C-contiguous shape
            kept = x.copy()
            out = np.full(n_out, 99, dtype)
            before = _slot_calls(comm, coll)
            got = run_with_out(comm, coll, x, out, op)
            fast += int(_slot_calls(comm, coll) == before + 1 and before >= 0)
            want = _expected_with_out(coll, seed, comm.size, comm.rank, n, dtype, op)
            if got is not out or not np.array_equal(out, want) or not np.array_equal(x, kept):
                failures.append((coll, dtype, op, n, rep, out[:4].tolist()))
        results.append((failures, fast))
    comm.close()
    return results


def _armed_with_out(comm, coll: str, n: int = 4):
    """A function repeating an 8-element float32 ``coll`` call of ones into ``out``, run twice
    so that its fast call is armed, its input and its ``out``."""
    n_in, n_out = with_out_shapes(coll, comm.size, n)
    x, out = np.ones(n_in, np.float32), np.empty(n_out, np.float32)
    repeat = lambda: run_with_out(comm, coll, x, out, "sum")  # noqa: E731
    repeat()
    repeat()
    return repeat, x, out


def mismatch_and_abort_on_fast_call_with_out(coll: str) -> list:
    """Both ranks arm ``coll``'s fast call; then rank 1 calls allreduce of another size, then
    ``coll`` into a read-only out (ArgumentError, its call aborted), while rank 0 repeats the
    armed call each time; then both repeat it. Per round: the exception's name, its message
    (mismatch) or rank (abort), and how many calls the fast call ran; then the last result."""
    comm = collectx.init(timeout=60)
    repeat, x, out = _armed_with_out(comm, coll)
    read_only = out.copy()
    read_only.flags.writeable = False
    odd = [lambda: comm.allreduce(np.ones(3, np.float32)),
           lambda: run_with_out(comm, coll, x, read_only, "sum")]
    got = []
    for round_, call in enumerate(odd):
        before = _slot_calls(comm, coll)
        try:
            call() if comm.rank == 1 else repeat()
            seen = [None, None]
        except Exception as e:
            seen = [type(e).__name__, getattr(e, "rank", None) if round_ else str(e)]
        got.append(seen + [_slot_calls(comm, coll) - before])
    repeat()
    got.append(out.tolist())
    comm.close()
    return got


def peer_dies_during_fast_call_with_out(path: str, coll: str) -> None:
    """Rank 1 SIGKILLs itself while rank 0 waits in ``coll``'s armed fast call; rank 0 writes
    what it saw to ``path``/rank0.json."""
    comm = collectx.init(timeout=60)
    repeat, _, _ = _armed_with_out(comm, coll)
    if comm.rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    before = _slot_calls(comm, coll)
    t0 = time.monotonic()
    try:
        repeat()
        got = [None]
    except Exception as e:
        got = [type(e).__name__, getattr(e, "rank", None), time.monotonic() - t0]
    got.append(_slot_calls(comm, coll) - before)
    try:
        repeat()
        got.append(None)
    except Exception as e:
        got.append(type(e).__name__)
    with open(os.path.join(path, "rank0.json"), "w") as f:
        json.dump(got, f)


def never_arrives_on_fast_call_with_out(timeout: float, coll: str) -> list:
    comm = collectx.init(timeout=timeout)
    repeat, _, _ = _armed_with_out(comm, coll)
    if comm.rank == 1:
        time.sleep(timeout + 2)
        return ["skipped"]
    before = _slot_calls(comm, coll)
    t0 = time.monotonic()
    try:
        repeat()
        return [None]
    except Exception as e:
        return [type(e).__name__, time.monotonic() - t0, _slot_calls(comm, coll) - before]


# -- broadcast, reduce, and allgather / reduce_scatter in place (NCCL style) --------------------

ROOTED_SLOTS = {"broadcast": "_fast_broadcast", "reduce": "_fast_reduce",
                "reduce_out": "_fast_reduce", "allgather_inplace": "_fast_allgather",
                "reduce_scatter_inplace": "_fast_reduce_scatter"}


def run_layout(comm, kind: str, x, buf, op, root):
    """One call of ``kind``; ``buf`` is the out of reduce_out / the whole buffer in place.
    Returns (what the call returned, what it should return, the array holding the result)."""
    r, n = comm.rank, len(x)
    if kind == "broadcast":
        return comm.broadcast(x, root), x, x
    if kind == "reduce":
        return comm.reduce(x, root, op=op), x if r == root else None, x
    if kind == "reduce_out":
        return comm.reduce(x, root, out=buf, op=op), buf if r == root else None, buf
    if kind == "allgather_inplace":
        return comm.allgather(buf[r * n:(r + 1) * n], out=buf), buf, buf
    k = n // comm.size      # reduce_scatter in place: out is block r of x
    out = x[r * k:(r + 1) * k]
    got = comm.reduce_scatter(x, out=out, op=op)
    return got, out, out


def _expected_layout(kind, seed, size, rank, n, dtype, op, root) -> np.ndarray:
    mine = _input(seed, rank, n, dtype)
    if kind == "broadcast":
        return _input(seed, root, n, dtype)
    if kind in ("reduce", "reduce_out"):
        return _expected(seed, size, n, dtype, op) if rank == root else \
            (mine if kind == "reduce" else None)
    if kind == "allgather_inplace":
        return _expected_with_out("allgather", seed, size, rank, n, dtype, op)
    return _expected_with_out("reduce_scatter", seed, size, rank, n // size, dtype, op)


def results_rooted_and_in_place(cases: list) -> list:
    """Every (kind, dtype, op, n, root) case four times in a row, fresh data each time; per
    case: the failures (wrong result or return value) and how many of the four calls the
    method's fast call ran."""
    comm = collectx.init(timeout=60)
    results = []
    for kind, dtype, op, n, root in cases:
        failures, fast = [], 0
        slot = ROOTED_SLOTS[kind]
        for rep in range(4):
            seed = zlib.crc32(f"{kind}{dtype}{op}{n}{root}{rep}".encode())  # equal on every rank
            x = _input(seed, comm.rank, n, dtype)
            buf = np.full(n * comm.size if kind == "allgather_inplace" else n, 99, dtype)
            if kind == "allgather_inplace":
                buf[comm.rank * n:(comm.rank + 1) * n] = x
            before = getattr(getattr(comm, slot), "calls", -1)
            got, want_got, result = run_layout(comm, kind, x, buf, op, root)
            fast += int(getattr(getattr(comm, slot), "calls", -1) == before + 1 and before >= 0)
            want = _expected_layout(kind, seed, comm.size, comm.rank, n, dtype, op, root)
            if got is not want_got or (want is not None and not np.array_equal(result, want)):
                failures.append((kind, dtype, op, n, root, rep, np.asarray(result)[:4].tolist()))
        results.append((failures, fast))
    comm.close()
    return results


def root_mismatch_on_fast_broadcast() -> list:
    """Both ranks arm broadcast from root 0; then rank 1 broadcasts from root 1 while rank 0
    repeats the armed call; then both broadcast from 0 again. Returns the exception's name and
    message, how many calls the fast call ran, and the last result."""
    comm = collectx.init(timeout=60)
    x = np.full(4, float(comm.rank + 1), np.float32)
    comm.broadcast(x, 0)
    comm.broadcast(x, 0)
    before = comm._fast_broadcast.calls
    try:
        comm.broadcast(x, comm.rank)
        seen = [None, None]
    except Exception as e:
        seen = [type(e).__name__, str(e)]
    ran = comm._fast_broadcast.calls - before
    x[:] = comm.rank + 5
    comm.broadcast(x, 0)
    comm.close()
    return seen + [ran, x.tolist()]


def in_place_fast_calls_decline() -> list:
    """Arms allgather and reduce_scatter in place (NCCL's blocks); asks each fast call for the
    armed layout (runs), for other blocks, shifted or copied buffers (declined), each buffer
    left untouched by a declined call; returns the answers, whether the buffers stayed as they
    were, and how many calls each fast call ran."""
    comm = collectx.init(timeout=60)
    r, n = comm.rank, 6
    buf = np.zeros(2 * n + 1, np.float32)
    out = buf[:2 * n]
    comm.allgather(out[r * n:(r + 1) * n], out=out)
    ag = comm._fast_allgather
    other = 1 - r
    answers = [ag(out[r * n:(r + 1) * n], out, None)]
    before = buf.copy()
    answers += [ag(out[other * n:(other + 1) * n], out, None), ag(buf[r * n + 1:(r + 1) * n + 1],
                out, None), ag(out[r * n:(r + 1) * n].copy(), out, None)]
    x = np.ones(2 * n, np.float32)
    comm.reduce_scatter(x, out=x[r * n:(r + 1) * n])
    rs = comm._fast_reduce_scatter
    answers += [rs(x, x[other * n:(other + 1) * n], "sum")]
    answers += [rs(x, x[r * n:(r + 1) * n], "sum")]
    kept = x.copy()
    answers += [rs(x, x[r * n:(r + 1) * n].copy(), "sum"), rs(x, x[r * n:(r + 1) * n], "max")]
    untouched = bool(np.array_equal(buf, before) and np.array_equal(x, kept))
    ran = [ag.calls, rs.calls]
    ag(out[r * n:(r + 1) * n], out, None)   # both in step: one more of each, on both ranks
    rs(x, x[r * n:(r + 1) * n], "sum")
    comm.close()
    return [answers, untouched, ran]


def root_dies_during_fast_broadcast(path: str) -> None:
    """Both ranks arm a broadcast from root 1; rank 1 then SIGKILLs itself while rank 0 waits
    for its data in the armed fast call; rank 0 writes what it saw to ``path``/rank0.json."""
    comm = collectx.init(timeout=60)
    x = np.ones(4, np.float32)
    comm.broadcast(x, 1)
    comm.broadcast(x, 1)
    if comm.rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    before = comm._fast_broadcast.calls
    t0 = time.monotonic()
    try:
        comm.broadcast(x, 1)
        got = [None]
    except Exception as e:
        got = [type(e).__name__, getattr(e, "rank", None), time.monotonic() - t0]
    got.append(comm._fast_broadcast.calls - before)
    with open(os.path.join(path, "rank0.json"), "w") as f:
        json.dump(got, f)
