"""Rank functions for the fault-tolerance tests (module level so launch() can pickle them)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np

import collectx


def _report(path: str, me: int, **fields) -> None:
    with open(os.path.join(path, f"rank{me}.json"), "w") as f:
        json.dump(fields, f)


def killed_mid_collective(path: str, victim: int, n: int = 1 << 16) -> None:
    """The victim SIGKILLs itself while the others are inside an allreduce of n floats."""
    comm = collectx.init(timeout=60)
    x = np.ones(n, np.float32)
    comm.allreduce(x)
    if comm.rank == victim:
        time.sleep(0.5)          # the others are waiting in the next allreduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        comm.allreduce(x)
        _report(path, comm.rank, error=None)
    except Exception as e:
        _report(path, comm.rank, error=type(e).__name__, rank=getattr(e, "rank", None),
                message=str(e), seconds=time.monotonic() - t0)


def mismatched(kind: str) -> list:
    """Rank 1 makes a call that differs in ``kind``; every rank reports what it raised."""
    comm = collectx.init(timeout=60)
    odd = comm.rank == 1
    x32, x64 = np.ones(8, np.float32), np.ones(8, np.float64)
    calls = {
        "collective": lambda: comm.allgather(x32) if odd else comm.allreduce(x32),
        "dtype": lambda: comm.allreduce(x64 if odd else x32),
        "op": lambda: comm.allreduce(x32, op="max" if odd else "sum"),
        "size": lambda: comm.allreduce(np.ones(9 if odd else 8, np.float32)),
        "root": lambda: comm.broadcast(x32, root=1 if odd else 0),
    }
    got = []
    try:
        calls[kind]()
        got.append(None)
    except Exception as e:
        got.append(type(e).__name__)
        got.append(str(e))
    y = np.full(4, comm.rank + 1.0, np.float32)
    comm.allreduce(y)                # the communicator is still usable after a mismatch
    got.append(y.tolist())
    comm.close()
    return got


def never_arrives(timeout: float) -> list:
    comm = collectx.init(timeout=timeout)
    if comm.rank == 1:
        time.sleep(timeout + 2)
        return ["skipped"]
    t0 = time.monotonic()
    try:
        comm.allreduce(np.ones(4, np.float32))
        return [None]
    except Exception as e:
        return [type(e).__name__, time.monotonic() - t0]


def bad_args_on_one_rank() -> list:
    comm = collectx.init(timeout=60)
    t0 = time.monotonic()
    try:
        if comm.rank == 1:
            comm.allreduce(np.ones(8, np.float32), out=np.ones(5, np.float32))
        else:
            comm.allreduce(np.ones(8, np.float32))
        got = [None]
    except Exception as e:
        got = [type(e).__name__, getattr(e, "rank", None), time.monotonic() - t0,
               isinstance(e, ValueError)]
    y = np.ones(3, np.float32)
    comm.allreduce(y)                # the aborted call left every rank in step
    got.append(y.tolist())
    return got


def signalled_while_waiting(handler: str, peer_delay: float, p2p: bool = False) -> list:
    """Rank 0 signals itself (SIGINT) 0.2 s into a call that rank 1 joins after peer_delay
    seconds; handler "default" (KeyboardInterrupt) or "record" (a handler that only notes it).
    Each rank returns [what its call ended with, seconds, handler runs]."""
    comm = collectx.init(timeout=60)
    seen = []
    if handler == "record":
        signal.signal(signal.SIGINT, lambda sig, frame: seen.append(sig))
    x = np.ones(256, np.float32)
    if comm.rank == 0:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    else:
        time.sleep(peer_delay)
    t0 = time.monotonic()
    try:
        if p2p:
            comm.recv(x, 1 - comm.rank)   # both receive first: only a signal ends it
        else:
            comm.allreduce(x)
        got = "completed"
    except KeyboardInterrupt:
        got = "KeyboardInterrupt"
    except collectx.CollectXError as e:
        got = type(e).__name__
    return [got, time.monotonic() - t0, len(seen)]


def extra_call_after_peer_closed() -> list:
    """Rank 0 makes one allreduce more than rank 1, which closes its communicator and lives on."""
    comm = collectx.init(timeout=60)
    x = np.ones(64, np.float32)
    comm.allreduce(x)
    if comm.rank == 1:
        comm.close()
        time.sleep(6)
        return ["closed"]
    t0 = time.monotonic()
    try:
        comm.allreduce(x)
        return ["completed"]
    except collectx.CollectXError as e:
        return [type(e).__name__, getattr(e, "rank", None), time.monotonic() - t0, str(e)]


def raise_after_init() -> None:
    comm = collectx.init()
    comm.allreduce(np.ones(4, np.float32))
    raise KeyError("boom")


def sigkill_all(stage: str) -> None:
    """Every rank SIGKILLs itself, either during setup (rank 1 never joins) or after it."""
    if stage == "setup" and int(os.environ["COLLECTX_RANK"]) == 1:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    if stage == "setup":
        import threading
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
    comm = collectx.init(timeout=30)
    comm.allreduce(np.ones(4, np.float32))
    os.kill(os.getpid(), signal.SIGKILL)
