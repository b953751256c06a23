"""Rank functions for the launcher tests (module level so launch() can pickle them)."""

from __future__ import annotations

import os
import time


def whoami(tag: str) -> tuple:
    return (int(os.environ["COLLECTX_RANK"]), int(os.environ["COLLECTX_WORLD_SIZE"]), tag,
            os.path.isdir(os.environ["COLLECTX_RDZV_DIR"]))


def fail_on_rank(bad: int) -> int:
    rank = int(os.environ["COLLECTX_RANK"])
    if rank == bad:
        raise ZeroDivisionError(f"rank {rank} divides by zero")
    time.sleep(60)       # the launcher must stop us long before this
    return rank


def rdzv_dir() -> str:
    return os.environ["COLLECTX_RDZV_DIR"]


def affinity() -> list:
    return sorted(os.sched_getaffinity(0))


def init_again() -> list:
    """Two communicators at once, then a third after closing the first: each its own."""
    import numpy as np

    import collectx
    first, second = collectx.init(), collectx.init()
    x = np.full(1000, first.rank + 1, np.float32)
    y = np.full(5000, 10 * (first.rank + 1), np.float32)
    first.allreduce(x)
    second.allreduce(y)
    first.close()
    third = collectx.init()
    z = np.full(3, third.rank, np.int64)
    third.allreduce(z)
    got = [float(x[0]), float(y[-1]), int(z[0])]
    second.close()
    third.close()
    return got
