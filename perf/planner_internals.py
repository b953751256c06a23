"""Planner internals, timed: the flow simulator's event loop, plans in a row, the collection
after a plan, and the tree emitter's flush in C against Python.

Run it in two checkouts one after the other (copy this file into the other one: like every
``perf/`` script it imports the collectx of the checkout it sits in) and compare the lines:

    python perf/planner_internals.py

Each section names the allocation it uses; numbers are wall seconds on this machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import collectx.topology as T  # noqa: E402
from collectx.planner import plan  # noqa: E402

SLOW = ("dgx1p", "allreduce", [0, 1, 3, 4, 6, 7])   # among the slowest DGX-1 plans


def simulations(rounds: int) -> str:
    """Every native simulation one slow plan runs, captured and replayed ``rounds`` times."""
    from collectx.schedule import _taskloop
    sim = sys.modules["collectx.schedule.simulate"]
    seen, real = [], _taskloop.run_arrays

    def capture(*args):
        out = real(*args)
        seen.append((args, out))
        return out
    sim.run_arrays = capture
    name, coll, gpus = SLOW
    plan(T.load(name), coll, 1 << 30, gpus=gpus, verify=False)
    sim.run_arrays = real
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for args, out in seen:
            if real(*args) != out:
                raise AssertionError("a replayed simulation gave another result")
        times.append(time.perf_counter() - t)
    return (f"simulator: the {len(seen)} simulations of {name} {coll} GPUs {gpus}, "
            f"median of {rounds} replays {statistics.median(times):.3f} s")


def in_a_row(count: int) -> str:
    """The same plan ``count`` times in one process, and the collector's work after each (the
    first automatic collection once planning re-enables it)."""
    collected: list = []
    start: dict = {}

    def watch(phase, info):
        if phase == "start":
            start["t"] = time.perf_counter()
        else:
            collected.append(time.perf_counter() - start["t"])
    name, coll, gpus = SLOW
    G = T.load(name)
    plans, after = [], []
    gc.callbacks.append(watch)
    try:
        for _ in range(count):
            collected.clear()
            t = time.perf_counter()
            plan(G, coll, 1 << 30, gpus=gpus, verify=False)
            plans.append(time.perf_counter() - t)
            [[] for _ in range(2000)]   # tracked allocations: the pending collection runs
            after.append(sum(collected))
    finally:
        gc.callbacks.remove(watch)
    return (f"in a row: {name} {coll} GPUs {gpus}, {count} plans: "
            + " ".join(f"{x:.2f}" for x in plans) + " s; collection after each: "
            + " ".join(f"{x:.3f}" for x in after) + " s")


def flush(rounds: int) -> list[str]:
    """TreeEmitter.flush per item, the compiled loop against the Python one, alternating."""
    import collectx.schedule.treesched as ts
    if not hasattr(ts, "compiled_helper"):
        return ["flush: this checkout has no compiled flush"]
    G = T.load("dgx1v")
    gpus = [0, 1, 3, 4, 5, 7]
    real_flush, real_helper = ts.TreeEmitter.flush, ts.compiled_helper
    spent = {"s": 0.0, "n": 0}

    def timed(self):
        n = len(self._items)
        t = time.perf_counter()
        real_flush(self)
        spent["s"] += time.perf_counter() - t
        spent["n"] += n
    ts.TreeEmitter.flush = timed
    lines = []
    try:
        for _ in range(rounds):
            for mode in ("C", "Python"):
                ts.compiled_helper = real_helper if mode == "C" else (lambda name: None)
                spent.update(s=0.0, n=0)
                plan(G, "allgather", 1 << 30, gpus=gpus, verify=False)
                lines.append(f"flush ({mode}): dgx1v allgather GPUs {gpus}, {spent['n']} items, "
                             f"{spent['s'] / spent['n'] * 1e6:.2f} us an item")
    finally:
        ts.TreeEmitter.flush, ts.compiled_helper = real_flush, real_helper
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="replays of the simulations")
    ap.add_argument("--row", type=int, default=8, help="plans in a row")
    args = ap.parse_args(argv)
    print(simulations(args.rounds))
    print(in_a_row(args.row))
    for line in flush(2):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
