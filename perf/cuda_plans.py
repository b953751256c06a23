"""What the CUDA executor gets on DGX-1 allocations without an NVLink ring (simulated).

For every DGX-1V (and with ``--presets dgx1v,dgx1p`` DGX-1P) allocation of 3..8 GPUs whose
GPUs cannot be ordered in a ring of direct NVLinks, at ``--size`` (256 MiB): the schedule the
CUDA engine builds (``cuda_plan``: ``plan(..., host_relays=False)``, no host staging), its
efficiency against the bound without host staging (``peer_bounds``, what ``collectx plan
--device cuda`` prints), and its predicted busbw over the ring a ring-only choice gives there
(``algo="ring"``, no host staging either). Targets: efficiency >= 0.9 and never below the ring.

Prints one table row per preset and collective (worst and median), the worst allocations, and
with ``--json FILE`` one JSON line per allocation.

Run: ``python perf/cuda_plans.py`` (all 142 DGX-1V allocations, about half an hour on two
cores) or ``python perf/cuda_plans.py --limit 5`` for a sample.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import json
import statistics
import sys

import collectx.topology as T
from collectx.cli.plan import parse_size
from collectx.planner import plan
from collectx.runtime.cuda.planning import cuda_plan
from planner import allocations, has_nvlink_ring


def measure(G, name: str, gpus, coll: str, nbytes: int) -> dict:
    ids = [T.gpus(G)[g] for g in gpus]
    chosen = cuda_plan(G, coll, nbytes, gpus=ids)
    ring = plan(G, coll, nbytes, gpus=ids, algo="ring", host_relays=False, verify=False)
    return {"preset": name, "gpus": list(gpus), "collective": coll,
            "algorithm": chosen.algorithm, "efficiency": chosen.efficiency,
            "bound_GBps": chosen.bound.bound_busbw,
            "busbw_GBps": chosen.predicted.busbw_GBps,
            "ring_busbw_GBps": ring.predicted.busbw_GBps,
            "over_ring": chosen.predicted.busbw_GBps / ring.predicted.busbw_GBps,
            "planning_s": chosen.planning_time_s, "verified": chosen.verified}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="dgx1v")
    ap.add_argument("--collectives", default="allreduce,allgather,broadcast")
    ap.add_argument("--size", default="256M")
    ap.add_argument("--limit", type=int, default=0, help="allocations per GPU count (0: all)")
    ap.add_argument("--json", help="write one JSON line per allocation to this file")
    args = ap.parse_args(argv)
    nbytes = parse_size(args.size)
    rows = []
    sink = open(args.json, "w") if args.json else None
    for name in args.presets.split(","):
        G = T.load(name)
        allocs = [g for g in allocations(G, range(3, 9), args.limit) if not has_nvlink_ring(G, g)]
        print(f"# {name}: {len(allocs)} allocations without an NVLink ring", flush=True)
        for gpus in allocs:
            for coll in args.collectives.split(","):
                row = measure(G, name, gpus, coll, nbytes)
                rows.append(row)
                if sink:
                    sink.write(json.dumps(row) + "\n")
    if sink:
        sink.close()
    print(f"\n{'preset':7s} {'collective':10s} {'plans':>5s} {'worst eff':>9s} {'median':>7s} "
          f"{'<0.9':>4s} {'min x ring':>10s} {'median x ring':>13s} {'slowest s':>9s}")
    for key in sorted({(r["preset"], r["collective"]) for r in rows}):
        sel = [r for r in rows if (r["preset"], r["collective"]) == key]
        eff = [r["efficiency"] for r in sel]
        over = [r["over_ring"] for r in sel]
        print(f"{key[0]:7s} {key[1]:10s} {len(sel):5d} {min(eff):9.3f} "
              f"{statistics.median(eff):7.3f} {sum(e < 0.9 for e in eff):4d} {min(over):10.2f} "
              f"{statistics.median(over):13.2f} {max(r['planning_s'] for r in sel):9.2f}")
    print("\nworst allocations:")
    for r in sorted(rows, key=lambda r: r["efficiency"])[:5]:
        print(f"  {r['preset']} {r['gpus']} {r['collective']}: {r['algorithm']} "
              f"{r['efficiency']:.3f} of {r['bound_GBps']:.1f} GB/s, {r['over_ring']:.2f}x ring")
    return 0 if all(r["efficiency"] >= 0.9 and r["over_ring"] >= 0.999 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
