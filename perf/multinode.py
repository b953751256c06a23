"""Hierarchical collectx (shared memory inside a host + MPI between hosts) vs flat Open MPI.

Runs allreduce over ``--hosts`` pseudo-hosts (COLLECTX_HOSTS) on this machine and prints one
JSON line per (implementation, size) with algbw/busbw (nccl-tests conventions), then a table
with both busbw columns and their ratio. Started without mpirun it starts itself under mpirun::

    python perf/multinode.py --hosts 2,2 --min 64K --max 64M
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text[-1] in _SCALE else ""
    return int(text[:len(text) - len(unit)]) * _SCALE[unit]


def options(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="2,2", help="ranks per pseudo-host (COLLECTX_HOSTS)")
    p.add_argument("--min", default="64K", help="smallest message (bytes, K/M suffixes)")
    p.add_argument("--max", default="64M", help="largest message")
    p.add_argument("--iters", type=int, default=0, help="timed iterations (0: by size)")
    p.add_argument("--warmup", type=int, default=2)
    return p.parse_args(argv)


def relaunch(args) -> int:
    """Run this script under mpirun with one rank per pseudo-host slot."""
    n = sum(int(c) for c in args.hosts.split(","))
    env = dict(os.environ, COLLECTX_HOSTS=args.hosts,
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(
                   os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(n), "-x",
           "COLLECTX_HOSTS", "-x", "PYTHONPATH", sys.executable, os.path.abspath(__file__),
           *sys.argv[1:]]
    return subprocess.call(cmd, env=env)


def timed(fn, iters: int, warmup: int, barrier) -> float:
    """Seconds per call: the slowest rank's mean over ``iters`` calls."""
    for _ in range(warmup):
        fn()
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def measure(args) -> None:
    from mpi4py import MPI

    from collectx.runtime.multinode import MPIEngine, init
    world = MPI.COMM_WORLD
    comm = init(MPIEngine(), hosts=args.hosts)
    n, rows = world.size, []
    size = parse_bytes(args.min)
    while size <= parse_bytes(args.max):
        count = size // 4
        x = np.ones(count, np.float32)
        iters = args.iters or max(3, min(50, (256 << 20) // size))
        for impl, fn in (("collectx", lambda: comm.allreduce(x)),
                         ("mpi", lambda: world.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM))):
            t = world.allreduce(timed(fn, iters, args.warmup, world.Barrier), op=MPI.MAX)
            algbw = size / t / 1e9
            row = {"impl": impl, "collective": "allreduce", "nbytes": size, "nranks": n,
                   "hosts": args.hosts, "time_us": t * 1e6, "algbw_GBps": algbw,
                   "busbw_GBps": algbw * 2 * (n - 1) / n, "iters": iters}
            rows.append(row)
            if world.rank == 0:
                print(json.dumps(row), flush=True)
        size *= 2
    if world.rank == 0:
        print(table(rows))
    comm.close()


def table(rows: list[dict]) -> str:
    """Busbw of both implementations per size, and collectx / MPI."""
    by = {(r["impl"], r["nbytes"]): r["busbw_GBps"] for r in rows}
    lines = [f"{'bytes':>10} {'collectx GB/s':>14} {'Open MPI GB/s':>14} {'ratio':>7}"]
    for size in sorted({r["nbytes"] for r in rows}):
        cx, mpi = by[("collectx", size)], by[("mpi", size)]
        lines.append(f"{size:>10} {cx:>14.3f} {mpi:>14.3f} {cx / mpi:>7.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = options(argv)
    if "OMPI_COMM_WORLD_RANK" not in os.environ and "PMI_RANK" not in os.environ:
        return relaunch(args)
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
