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
