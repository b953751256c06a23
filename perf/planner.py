"""Planner quality benchmark (simulated): efficiency vs the cut bound, ring-only baseline,
small-message choice, planning time.

Sections (``--sections``, default all):

a. quality at ``--size`` (1 GiB) for allreduce, allgather, broadcast on every allocation of
   2..8 GPUs of dgx1v and dgx1p (247 each) and on the full dgx2, dgx_a100, dgx_h100,
   mi250_16gcd, mi300x and pcie_gen4_8gpu: min/median efficiency and the count below 0.95;
   also checks that allgather/broadcast never beat 1.001 x bound and allreduce never beats
   1.001 x ceiling (a violation means the simulator or the bound is wrong);
b. the dgx1v allocations of 3..8 GPUs with no NVLink ring: chosen busbw / ring-only busbw
   (min and median; target median >= 3x, never below 1x), against the ring a ring-only library
   falls back to there (one ring, hops without NVLink through PCIe and host memory, as NCCL
   does) and against collectx's own ring packing;
c. at 8 KiB the chosen predicted time is <= ring's and tree's on every preset;
d. median planning time per allocation size on dgx1v, and for the full dgx2 and mi250_16gcd
   (targets <= 1 s for 8-GPU allocations, <= 5 s for dgx2/mi250); with ``--real-dumps``
   also every dump of ``topology/real``, whole machine (the same targets by GPU count), for
   allreduce or the ``--dump-collectives``, then per GPU count the median, the slowest and
   how many plans miss their target; with section a, also the slowest plans of each
   allocation preset, re-timed.

``--no-host-relays`` plans every section as the CUDA engine does (``plan(...,
host_relays=False)``: no tree edge staged through host memory, against bounds without host
staging); by default plans may stage through host memory, as the CPU executor's do.

``--retime TOPOLOGY:COLLECTIVE:GPUS ...`` re-times named plans alone (median of 5 runs); a
topology is a preset, a topology file, or a dump of ``topology/real`` by its file name, so
that machines outside the presets (switched ones with host staging plan slowest) are timed
the same way.

Every plan is made with ``collectx.planner.plan`` exactly as users get it (cost-model choice,
simulated prediction); ``--limit`` samples allocations evenly when the full sweep is too slow.
``--jsonl FILE`` also writes one JSON line per plan (algbw/busbw included) for later plotting.

Run: ``python perf/planner.py`` (full), or e.g.
``python perf/planner.py --sections a,b --limit 10 --presets dgx1v``.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import collectx.topology as T
from collectx.planner import plan
from collectx.planner._build import forget_remembered
from fallback_ring import plan_fallback_ring
from collectx.planner.ring_search import _hamiltonian
from collectx.topology.model import GPU_LINK_TYPES

ALLOC_PRESETS = ("dgx1v", "dgx1p")
FULL_PRESETS = ("dgx2", "dgx_a100", "dgx_h100", "mi250_16gcd", "mi300x", "pcie_gen4_8gpu")
REAL = Path(__file__).resolve().parent.parent / "topology" / "real"
COLLECTIVES = ("allreduce", "allgather", "broadcast")
SMALL = 8 << 10


def allocations(G, sizes, limit=None):
    """Every GPU subset of the given sizes (evenly sampled down to ``limit`` per size)."""
    ids = T.gpus(G)
    for k in sizes:
        combos = list(itertools.combinations(range(len(ids)), k))
        if limit and len(combos) > limit:
            step = len(combos) / limit
            combos = [combos[int(i * step)] for i in range(limit)]
        yield from combos


def has_nvlink_ring(G, gpus) -> bool:
    """Whether the GPUs can be ordered in a ring of direct NVLink/xGMI links."""
    ids = [T.gpus(G)[g] for g in gpus]
    hops = {(i, j): 1.0 for i, a in enumerate(ids) for j, b in enumerate(ids)
            if i != j and G.has_edge(a, b) and G.edges[a, b]["type"] in GPU_LINK_TYPES}
    return len(ids) < 3 or _hamiltonian(len(ids), hops) is not None


def record(G, name, gpus, coll, nbytes, algo=None, verify=False, host_relays=True) -> dict:
    forget_remembered()   # timed as a first plan of its allocation: nothing remembered
    p = plan(G, coll, nbytes, gpus=list(gpus) if gpus is not None else None, algo=algo,
             verify=verify, host_relays=host_relays)
    d = p.summary()
    d.update(topology=name, gpus=list(gpus) if gpus is not None else "all")
    return d


def quality(args, out) -> list[dict]:
    rows = []
    jobs = [(n, tuple(g)) for n in args.presets if n in ALLOC_PRESETS
            for g in allocations(T.load(n), range(2, 9), args.limit)]
    jobs += [(n, None) for n in args.presets if n in FULL_PRESETS]
    for name, gpus in jobs:
        G = T.load(name)
        for coll in COLLECTIVES:
            rows.append(record(G, name, gpus, coll, args.size, verify=args.verify,
                               host_relays=args.host_relays))
            out(rows[-1])
    print("\n(a) quality at %d bytes (simulated), efficiency = predicted busbw / bound" % args.size)
    print(f"{'topology':<16}{'collective':<11}{'plans':>6}{'min':>8}{'median':>8}{'<0.95':>7}"
          f"{'over':>6}  algorithms")
    for name in args.presets:
        for coll in COLLECTIVES:
            sel = [r for r in rows if r["topology"] == name and r["collective"] == coll]
            if sel:
                _quality_row(name, coll, sel)
    return rows


def _quality_row(name, coll, sel):
    eff = [r["efficiency"] for r in sel if r["efficiency"] is not None]
    cap = "ceiling_busbw_GBps" if coll == "allreduce" else "bound_busbw_GBps"
    over = sum(1 for r in sel if r[cap] and r["predicted_busbw_GBps"] > 1.001 * r[cap])
    algos = statistics.multimode([r["algorithm"] for r in sel])
    counts = {a: sum(r["algorithm"] == a for r in sel) for a in sorted({r["algorithm"]
                                                                        for r in sel})}
    print(f"{name:<16}{coll:<11}{len(sel):>6}{min(eff, default=0):>8.3f}"
          f"{statistics.median(eff) if eff else 0:>8.3f}{sum(e < 0.95 for e in eff):>7}"
          f"{over:>6}  {counts if len(counts) > 1 else algos[0]}")


def ring_only(args, rows, out):
    """Chosen busbw over two ring-only baselines on the dgx1v allocations with no NVLink ring:
    collectx's own ring packing (its hops may run over other GPUs' NVLinks), and the ring a
    ring-only library falls back to (NCCL: one ring, hops without NVLink through PCIe and host
    memory; perf/fallback_ring.py), the baseline the 3x target is set against."""
    print("\n(b) dgx1v allocations of 3..8 GPUs with no NVLink ring: chosen / ring-only busbw")
    G = T.load("dgx1v")
    by_key = {(tuple(r["gpus"]), r["collective"]): r for r in rows if r["topology"] == "dgx1v"}
    allocs = [g for g in allocations(G, range(3, 9), args.limit) if not has_nvlink_ring(G, g)]
    for coll in COLLECTIVES:
        ratios = {"ring": [], "fallback": []}
        for g in allocs:
            chosen = by_key.get((g, coll)) or record(G, "dgx1v", g, coll, args.size,
                                                     host_relays=args.host_relays)
            for base, algo in (("ring", "ring"), ("fallback", plan_fallback_ring)):
                ring = record(G, "dgx1v", g, coll, args.size, algo=algo,
                              host_relays=args.host_relays)
                out(ring)
                ratios[base].append(chosen["predicted_busbw_GBps"] / ring["predicted_busbw_GBps"])
        for base, what in (("fallback", "NCCL-style fallback ring"),
                           ("ring", "collectx ring packing")):
            r = ratios[base]
            if r:
                print(f"  {coll:<10} {len(r):>4} allocations  vs {what:<25} min {min(r):6.2f}x"
                      f"  median {statistics.median(r):6.2f}x  below 1x: {sum(x < 1 for x in r)}")


def small_messages(args, out):
    print(f"\n(c) {SMALL} bytes on every preset (full machine): chosen time vs ring and tree")
    worse = 0
    for name in ALLOC_PRESETS + FULL_PRESETS:
        G = T.load(name)
        for coll in COLLECTIVES:
            chosen = record(G, name, None, coll, SMALL, host_relays=args.host_relays)
            line = [f"  {name:<15}{coll:<10} chosen {chosen['algorithm']:<7}"
                    f"{chosen['predicted_time_us']:9.1f} us"]
            for base in ("ring", "tree"):
                if base == "tree" and coll == "allgather":
                    continue
                b = record(G, name, None, coll, SMALL, algo=base,
                           host_relays=args.host_relays)
                out(b)
                ok = chosen["predicted_time_us"] <= b["predicted_time_us"] * (1 + 1e-9)
                worse += not ok
                line.append(f"{base} {b['predicted_time_us']:9.1f} us{'' if ok else ' (!)'}")
            print("  ".join(line))
    print(f"  chosen slower than a baseline: {worse}")


def planning_time(args, rows, out):
    print("\n(d) median planning time (plan(), simulation of every candidate included)")
    G = T.load("dgx1v")
    for k in range(2, 9):
        times = [record(G, "dgx1v", g, "allreduce", args.size,
                         host_relays=args.host_relays)["planning_time_s"]
                 for g in allocations(G, [k], args.limit or 8)]
        print(f"  dgx1v {k} GPUs: {statistics.median(times):7.3f} s over {len(times)}")
    for name in ("dgx2", "mi250_16gcd"):
        r = record(T.load(name), name, None, "allreduce", args.size,
                   host_relays=args.host_relays)
        out(r)
        print(f"  {name} full: {r['planning_time_s']:7.3f} s ({r['algorithm']})")
    if args.real_dumps:
        real_dumps(args, out)
    slowest_allocations(args, rows)


def real_dumps(args, out):
    """Every dump of topology/real, whole machine: the targets hold on machines the planner
    was not shaped on, or the table shows where not."""
    colls = args.dump_collectives.split(",")
    print(f"  real dumps, whole machine ({', '.join(colls)}):")
    timed = []
    for path in sorted(p for p in REAL.iterdir() if p.suffix in (".xml", ".txt")):
        G = T.load(path)
        n = len(T.gpus(G))
        for coll in colls:
            r = record(G, path.name, None, coll, args.size, host_relays=args.host_relays)
            out(r)
            timed.append((n, r["planning_time_s"]))
            eff = "" if r["efficiency"] is None else f", {r['efficiency']:.3f} of the bound"
            what = f"{path.name:<54}" + ("" if len(colls) == 1 else f" {coll:<10}")
            print(f"    {what}{n:>3} GPUs {r['planning_time_s']:8.3f} s "
                  f"({r['algorithm']}{eff})")
    for label, sizes, goal in (("2-7 GPUs", range(2, 8), 1.0), ("8 GPUs", (8,), 1.0),
                               ("9-16 GPUs", range(9, 17), 5.0)):
        times = [t for n, t in timed if n in sizes]
        if times:
            print(f"  {label}: median {statistics.median(times):.2f} s, slowest {max(times):.2f}"
                  f" s, {sum(t > goal for t in times)} of {len(times)} over {goal:g} s")


SLOWEST = 5       # plans of section (a) re-timed per preset
RETIMES = 5       # runs of each, the median reported


def slowest_allocations(args, rows):
    """The slowest plans of section (a) on each allocation preset, re-timed alone: the
    target is per allocation, and (a)'s single runs are noisy."""
    for name in [n for n in args.presets if n in ALLOC_PRESETS]:
        mine = [r for r in rows if r["topology"] == name]
        if not mine:
            continue
        G = T.load(name)
        print(f"  {name}: the {SLOWEST} slowest of {len(mine)} plans in (a), median of "
              f"{RETIMES} runs each")
        for r in sorted(mine, key=lambda r: -r["planning_time_s"])[:SLOWEST]:
            print(_retimed(G, name, r["gpus"], r["collective"], args.size, args.host_relays))


def retime(args):
    """``--retime``: the named plans, each re-timed alone (compare with another checkout's
    run of the same command: one plan's time moves 10-20% from run to run here)."""
    print(f"\n(re-timed) median of {RETIMES} runs each")
    for spec in args.retime:
        name, coll, gpus = spec.split(":")
        G = T.load(_topology(name))
        chosen = [int(g) for g in gpus.split(",")] if gpus != "all" else None
        print(_retimed(G, name, chosen, coll, args.size, args.host_relays))


def _topology(name: str) -> str:
    """What ``T.load`` takes for ``--retime``'s ``name``: a dump of topology/real by its file
    name, else the name itself (a preset or a file)."""
    return str(REAL / name) if not Path(name).is_file() and (REAL / name).is_file() else name


def _known(name: str) -> bool:
    return name in T.presets() or Path(_topology(name)).is_file()


def _retimed(G, name, gpus, coll, nbytes, host_relays=True) -> str:
    times = [record(G, name, gpus, coll, nbytes, host_relays=host_relays)["planning_time_s"]
             for _ in range(RETIMES)]
    shown = ",".join(map(str, gpus)) if gpus else "all"
    return (f"    {name:<6} {coll:<10} GPUs {shown:<16}{statistics.median(times):7.3f} s "
            f"(max {max(times):.3f})")


def add_host_relays_option(ap) -> None:
    """``--no-host-relays`` (``args.host_relays`` False): plan as the CUDA engine does."""
    ap.add_argument("--no-host-relays", dest="host_relays", action="store_false",
                    help="plan as runtimes without host buffers do (the CUDA engine): no tree "
                         "edge staged through host memory, bounds without host staging")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="a,b,c,d")
    ap.add_argument("--presets", default=",".join(ALLOC_PRESETS + FULL_PRESETS))
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--limit", type=int, default=None, help="allocations per size (sampled)")
    ap.add_argument("--verify", action="store_true", help="also verify every schedule")
    ap.add_argument("--jsonl", help="write one JSON line per plan here")
    ap.add_argument("--real-dumps", action="store_true",
                    help="section d: also every dump of topology/real, whole machine "
                         "(16-GPU dumps take a minute or more each)")
    ap.add_argument("--dump-collectives", default="allreduce",
                    help="section d's real dumps: these collectives (comma-separated), each "
                         "timed as its own first plan")
    ap.add_argument("--retime", nargs="*", default=[], metavar="TOPOLOGY:COLLECTIVE:GPUS",
                    help="also re-time these plans alone, e.g. dgx1p:allreduce:1,2,3,4,5,7, "
                         "dgx1v:broadcast:all or hgx_h100_nccl_topo.xml:allreduce:all")
    add_host_relays_option(ap)
    args = ap.parse_args(argv)
    for spec in args.retime:
        if spec.count(":") != 2 or not _known(spec.split(":")[0]):
            ap.error(f"--retime {spec!r}: expected TOPOLOGY:COLLECTIVE:GPUS with a preset "
                     f"({', '.join(T.presets())}), a topology file or a dump of {REAL}, "
                     f"e.g. dgx1v:allreduce:0,1,2")
    args.presets = args.presets.split(",")
    with open(args.jsonl, "w") if args.jsonl else contextlib.nullcontext() as sink:
        return _run(args, sink)


def _run(args, sink) -> int:
    """The sections asked for, each plan also written to ``sink`` (None: nowhere)."""
    def out(row):
        if sink:
            sink.write(json.dumps(row) + "\n")
    t0 = time.perf_counter()
    sections = set(args.sections.split(","))
    rows = quality(args, out) if "a" in sections else []
    if "b" in sections:
        ring_only(args, rows, out)
    if "c" in sections:
        small_messages(args, out)
    if "d" in sections:
        planning_time(args, rows, out)
    if args.retime:
        retime(args)
    print(f"\nbenchmark wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
