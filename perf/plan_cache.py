"""Planning paid once: the first call of a new size class on 8 ranks of a DGX-1V allocation,
with an empty plan cache (rank 0 plans and shares through the store) and with a warm one (rank
0 reads the disk cache), against every rank planning alone (before plans were shared).

What is timed is how long a rank takes to hold the schedule of a new size class
(``collectx.runtime.plan_share.SharedPlans.get``, the engines' planning path), not the
collective. Each measurement starts fresh processes, so no planner memo of an earlier run
helps:

* by default ``--ranks`` processes (8) through ``collectx.launch``, each a Communicator on
  ``COLLECTX_TOPO_FILE=<preset>`` (the CPU runtime planning on that machine's graph) making the
  first call after a barrier; the engines report their times;
* with ``--threads``, ``--ranks`` thread ranks of one process over a FileStore (the launcher's
  rendezvous store), each calling ``SharedPlans.get`` with the CPU engine's planner call
  (``--executor cuda``: the CUDA engine's, ``cuda_schedule``). Lighter, but the waiting
  threads take the GIL from rank 0 and from each other.

Columns: ``alone`` is one make_schedule in a fresh process (before plans were shared every rank
paid that, in parallel where it had a core of its own); ``receive`` what a rank other than 0
then spends on it, alone on a core (parse the published entry and ``Schedule.from_packed``);
``cold`` and ``warm`` are rank 0's time and the slowest rank's (as threads, the planner's
modules are imported before the clock starts, as a Communicator imports them at init, before
its rendezvous: 0.4 s on a 2-core VM, scipy's optimizers most of it). Each is the median of
``--repeat`` runs. Targets: cold <= 1 s, warm <= 50 ms. With fewer cores than ranks the other
ranks queue for them: as processes the slowest rank's warm time is about rank 0's plus
``receive`` times the ranks per core; as threads the ranks decode the published bytes once
between them (``plan_cache.DECODED``), and on a warm start not at all (rank 0's disk read
filled the memo). Prints a table, and with ``--json`` one JSON line per row.

On a 2-core VM, ``python perf/plan_cache.py --executor cuda --collectives broadcast --sizes 64M
--repeat 5 --threads`` (median of three such runs, interleaved): warm 24.5 ms on rank 0 and
121.8 ms for the slowest rank at d2319c4, each thread decoding the 6,007-instruction schedule
in turn under the GIL; 21.8 / 23.5 ms with the shared decode (docs/cuda.md has the table).

Run: ``python perf/plan_cache.py`` or e.g.
``python perf/plan_cache.py --collectives allreduce --sizes 64M --repeat 5 --threads``.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce_scatter")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="dgx1v", help="topology preset (default dgx1v)")
    p.add_argument("--ranks", type=int, default=8, help="ranks: its first N GPUs (default 8)")
    p.add_argument("--collectives", default="allreduce,allgather,broadcast",
                   help=f"comma-separated, of {', '.join(COLLECTIVES)}")
    p.add_argument("--sizes", default="1M,64M", help="bytes per rank, K/M/G allowed")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell (median)")
    p.add_argument("--executor", choices=("cpu", "cuda"), default="cpu",
                   help="whose planner call: the CPU engine's or the CUDA engine's (cuda: "
                        "ranks as threads, since launched ranks run the CPU runtime)")
    p.add_argument("--threads", action="store_true",
                   help="ranks as threads of one process (lighter), not launched processes")
    p.add_argument("--json", action="store_true", help="also print one JSON line per row")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- one measurement (a fresh process) ----------------------------------------------------------
def planner_call(executor: str, collective: str, nranks: int, nbytes: int):
    """The engine's planner call: what rank 0 runs on a cache miss."""
    if executor == "cuda":
        from collectx.runtime.cuda.planning import cuda_schedule
        return lambda topo: cuda_schedule(topo, collective, nranks, nbytes)
    from collectx.planner import make_schedule
    return lambda topo: make_schedule(topo, collective, nranks, nbytes)


def measure_threads(spec: dict) -> dict:
    """Ranks as threads: seconds until rank 0, and the slowest rank, hold the schedule."""
    import collectx.planner  # noqa: F401  (as a Communicator's init does, before the clock)
    from collectx.runtime.plan_share import SharedPlans
    from collectx.runtime.store import FileStore
    from collectx.topology import load
    topo, n = load(spec["preset"]), spec["ranks"]
    plan = planner_call(spec["executor"], spec["collective"], n, spec["nbytes"])
    if spec["mode"] == "alone":
        t0 = time.perf_counter()
        schedule = plan(topo)
        alone = time.perf_counter() - t0
        return {"rank0_s": alone, "slowest_s": alone, "receive_s": receive_time(schedule)}
    with tempfile.TemporaryDirectory() as rdzv:
        store, start, done = FileStore(rdzv), threading.Barrier(n), [0.0] * n
        planned = []

        def rank(r):
            shared = SharedPlans(spec["executor"], r, n, store, "bench", 120.0,
                                 spec["cache_dir"])
            start.wait()
            t0 = time.perf_counter()
            got = shared.get(spec["collective"], spec["nbytes"], 0, lambda: topo, plan)
            done[r] = time.perf_counter() - t0
            if r == 0:
                planned.append(got.source)
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"rank0_s": done[0], "slowest_s": max(done), "source": planned[0]}


def receive_time(schedule) -> float:
    """What a rank other than 0 spends on a published schedule: parse it, rebuild it."""
    from collectx.runtime.plan_cache import encode, entry_schedule, parse
    blob = encode({"version": "-", "schema": "-"}, schedule, 0)
    t0 = time.perf_counter()
    entry_schedule(parse(blob), {})
    return time.perf_counter() - t0


def first_calls(cases):
    """A launched rank: the first call of each (collective, nbytes); the engine's planning
    time and where its schedule came from."""
    import numpy as np
    import collectx
    out = []
    with collectx.init() as comm:
        for coll, nbytes in cases:
            n = nbytes // 4 * (comm.size if coll == "reduce_scatter" else 1)
            x = np.ones(n, np.float32)
            comm.barrier()   # every rank reaches the call together: time planning, not arrival
            if coll == "broadcast":
                comm.broadcast(x)
            elif coll == "allgather":
                comm.allgather(x)
            elif coll == "reduce_scatter":
                comm.reduce_scatter(x)
            else:
                comm.allreduce(x)
            got = comm._engine._shared.known(coll, nbytes, 0)
            out.append((got.seconds, got.source))
    return out


def measure_launch(spec: dict) -> dict:
    import collectx
    os.environ.update(COLLECTX_TOPO_FILE=spec["preset"], COLLECTX_CACHE_DIR=spec["cache_dir"]
                      or "off")
    per_rank = collectx.launch(first_calls, spec["ranks"],
                               args=([(spec["collective"], spec["nbytes"])],), timeout=600)
    times = [ranks[0][0] for ranks in per_rank]
    return {"rank0_s": times[0], "slowest_s": max(times), "source": per_rank[0][0][1]}


def child(spec: dict) -> dict:
    threads = spec["threads"] or spec["mode"] == "alone" or spec["executor"] == "cuda"
    return measure_threads(spec) if threads else measure_launch(spec)


def in_fresh_process(spec: dict) -> dict:
    run = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                         capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise SystemExit(f"measurement {spec} failed:\n{run.stderr}")
    return json.loads(run.stdout.strip().splitlines()[-1])


# -- the table ----------------------------------------------------------------------------------
def cell(args, collective: str, nbytes: int) -> dict:
    base = {"preset": args.preset, "ranks": args.ranks, "executor": args.executor,
            "collective": collective, "nbytes": nbytes, "threads": args.threads}
    runs = {"alone": [], "cold": [], "warm": []}
    for _ in range(args.repeat):
        runs["alone"].append(in_fresh_process(dict(base, mode="alone", cache_dir=None)))
        with tempfile.TemporaryDirectory() as cache:
            for mode in ("cold", "warm"):   # the cold run fills the cache the warm run reads
                got = in_fresh_process(dict(base, mode=mode, cache_dir=cache))
                want = "planned" if mode == "cold" else "disk cache"
                if got.get("source") != want:
                    raise SystemExit(f"{mode} run: rank 0's schedule came from "
                                     f"{got.get('source')!r}, expected {want!r}")
                runs[mode].append(got)
    med = lambda mode, what: statistics.median(r[what] for r in runs[mode])  # noqa: E731
    return dict(base, alone_s=med("alone", "rank0_s"), receive_s=med("alone", "receive_s"),
                cold_rank0_s=med("cold", "rank0_s"),
                cold_slowest_s=med("cold", "slowest_s"), warm_rank0_s=med("warm", "rank0_s"),
                warm_slowest_s=med("warm", "slowest_s"), repeat=args.repeat)


def parse_size(text: str) -> int:
    from collectx.cli.plan import parse_size as parse
    return parse(text)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    threads = args.threads or args.executor == "cuda"
    how = f"{args.ranks} {'threads' if threads else 'processes'}"
    print(f"first call of a new size class, {args.preset} GPUs 0-{args.ranks - 1}, {how}, "
          f"{args.executor} executor, median of {args.repeat} fresh-process runs")
    print(f"{'collective':<15}{'bytes':>8}{'alone':>10}{'receive':>10}{'cold r0':>10}"
          f"{'cold all':>10}{'warm r0':>10}{'warm all':>10}")
    for coll in args.collectives.split(","):
        for size in args.sizes.split(","):
            row = cell(args, coll, parse_size(size))
            print(f"{coll:<15}{size:>8}" + "".join(
                f"{row[k] * 1e3:>8.1f}ms" for k in ("alone_s", "receive_s", "cold_rank0_s",
                                                   "cold_slowest_s", "warm_rank0_s",
                                                   "warm_slowest_s")), flush=True)
            if args.json:
                print(json.dumps(row), flush=True)
    print(f"targets: cold <= 1000 ms, warm <= 50 ms (the slowest rank); this machine has "
          f"{os.cpu_count()} CPUs for {args.ranks} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
