"""Run a function on N local ranks under torch.distributed, for tests and quick experiments.

:func:`run_ranks` starts one spawned process per rank, initialises the default group with the
requested backend over a ``file://`` rendezvous, calls ``fn(rank, world_size, *args)`` and returns
each rank's return value. A rank that raises, dies or outlives the timeout fails the whole run
with the rank's traceback, and leftover ranks are killed, so a hung collective cannot hang a test.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import time
import traceback
from typing import Any, Callable

from ..errors import CommError, Timeout


def run_ranks(fn: Callable[..., Any], world_size: int, *args, backend: str = "collectx",
              timeout_s: float = 120.0, env: dict[str, str] | None = None,
              may_exit: tuple[int, ...] = ()) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; return the results.

    Parameters
    ----------
    fn : callable
        A module-level function (it is pickled by reference into the spawned ranks).
    world_size : int
        Number of ranks.
    backend : str
        Backend of the default group; ``"collectx"`` imports :mod:`collectx.torch` first.
    timeout_s : float
        Wall-clock limit for the whole run.
    env : dict, optional
        Extra environment variables for the ranks; ``OMP_NUM_THREADS`` also sizes torch's
        intra-op thread pool.
    may_exit : tuple of int
        Ranks allowed to exit without a result (their result is None), for failure tests.

    Returns
    -------
    list
        ``fn``'s return value per rank, in rank order.

    Raises
    ------
    CommError
        A rank raised or exited without a result (the message carries its traceback).
    Timeout
        Some rank was still running after ``timeout_s``.
    """
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="cx-torch-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(fn, rank, world_size, args, backend, init_file, env or {},
                                   results))
                 for rank in range(world_size)]
        for proc in procs:
            proc.start()
        try:
            return _collect(results, procs, timeout_s, set(may_exit))
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                proc.join(5)


def _collect(results, procs, timeout_s: float, may_exit: set[int]) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    values: dict[int, Any] = {}
    while len(values) < len(procs):
        try:
            rank, ok, value = results.get(timeout=0.2)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise Timeout(f"ranks {sorted(set(range(len(procs))) - set(values))} still running "
                              f"after {timeout_s:.0f} s; expected all to finish") from None
            dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in values]
            values.update({r: None for r in dead if r in may_exit})
            dead = [r for r in dead if r not in may_exit]
            if dead and results.empty():
                time.sleep(0.5)     # a result may still be in the pipe of a rank that just ended
                if results.empty():
                    raise CommError(f"rank(s) {dead} exited without a result (exit codes "
                                    f"{[procs[r].exitcode for r in dead]})")
            continue
        if not ok:
            raise CommError(f"rank {rank} failed:\n{value}")
        values[rank] = value
    return [values[r] for r in range(len(procs))]


def _rank_main(fn, rank, world_size, args, backend, init_file, env, results) -> None:
    os.environ.update(env)
    try:
        if "OMP_NUM_THREADS" in env:
            # torch sized its intra-op pool when the spawned rank imported it (unpickling ``fn``
            # imports its module), before the variable was set here: apply it explicitly.
            import torch
            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
        import torch.distributed as dist
        if backend == "collectx":
            import collectx.torch  # noqa: F401  (registers the backend)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size)
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
        if dist.is_initialized():
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 -- reported to the parent with the traceback
        results.put((rank, False, traceback.format_exc()))
