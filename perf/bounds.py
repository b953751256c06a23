"""Planner quality: simulated busbw of the packed-tree planners against the bounds.

For every allocation of ``--sizes`` GPUs of a preset (default all 2..8 of DGX-1V/DGX-1P), plans
each collective with ``blink`` and ``forest`` (where they apply), simulates ``--nbytes`` and prints
one JSON line per (allocation, collective): best busbw, bound, efficiency, planning seconds.

    python perf/bounds.py --topo dgx1v --collectives allgather allreduce broadcast
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import itertools
import json
import statistics
import sys
import time

import collectx.topology as topo
from collectx.planner.trees import BLINK, FOREST, plan_blink, plan_forest
from collectx.planner.bounds import bounds
from collectx.schedule import simulate


def measure(G, ranks, collective, nbytes) -> dict:
    view = topo.subset(G, list(ranks))
    b = bounds(view, collective, gpus=list(ranks))
    best, best_algo, plan_s = 0.0, None, {}
    for name, fn, served in (("blink", plan_blink, BLINK), ("forest", plan_forest, FOREST)):
        if collective not in served:
            continue
        t = time.perf_counter()
        s = fn(view, tuple(ranks), collective, nbytes)
        plan_s[name] = round(time.perf_counter() - t, 3)
        busbw = simulate(s, view, nbytes, ranks=list(ranks)).busbw_GBps
        if busbw > best:
            best, best_algo = busbw, name
    top = b.ceiling_busbw if collective == "allreduce" else b.bound_busbw
    return {"gpus": list(ranks), "collective": collective, "algo": best_algo,
            "busbw": round(best, 2), "bound": round(b.bound_busbw, 2),
            "efficiency": round(best / b.bound_busbw, 4), "over_limit": best > top * 1.001,
            "plan_s": plan_s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topo", default="dgx1v")
    ap.add_argument("--sizes", type=int, nargs="*", default=list(range(2, 9)))
    ap.add_argument("--collectives", nargs="*", default=["allgather", "allreduce", "broadcast"])
    ap.add_argument("--nbytes", type=int, default=1 << 30)
    ap.add_argument("--full", action="store_true", help="only the whole machine")
    args = ap.parse_args(argv)
    G = topo.load(args.topo)
    gpus = topo.gpus(G)
    allocs = [tuple(gpus)] if args.full else [
        c for k in args.sizes for c in itertools.combinations(gpus, k)]
    effs: dict = {c: [] for c in args.collectives}
    for ranks in allocs:
        for coll in args.collectives:
            row = measure(G, ranks, coll, args.nbytes)
            effs[coll].append(row["efficiency"])
            print(json.dumps({"topo": args.topo, **row}), flush=True)
    for coll, e in effs.items():
        print(json.dumps({"topo": args.topo, "collective": coll, "allocations": len(e),
                          "min": min(e), "median": statistics.median(e)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
