"""collectx vs Open MPI (mpi4py, shared-memory path) vs gloo on this machine: busbw and latency.

Same machine, same run: every backend runs the same sizes with the same iteration rule, and one
table is printed with ratio columns (collectx / MPI, collectx / gloo). Benchmark, not a test.

    python perf/compare_cpu.py                         # 2 and 4 ranks, allreduce/allgather/rs
    python perf/compare_cpu.py --ranks 2 --colls allreduce --sizes 8,1M,64M --json out.jsonl
    python perf/compare_cpu.py --ranks 2 --colls allreduce --repeat 3   # medians of 3 rounds
    python perf/compare_cpu.py --ranks 2 --colls allreduce --staged    # + COLLECTX_CMA=0 column
    python perf/compare_cpu.py --colls broadcast,reduce,allgather_inplace,reduce_scatter_inplace

On a shared machine, --repeat N runs the backends round-robin N times (collectx, MPI, gloo,
collectx, ...) and reports each backend's median time per point, so a burst of load from other
work shifts one round, not one backend. Before each round a probe of the machine itself (two
processes exchanging 1 MiB through shared memory with numpy, :mod:`_probe`) is timed and printed
under the table: on this VM it swings by about 3x for seconds at a time, and a round that ran
while it was slow says so.

busbw follows nccl-tests: allreduce 2(n-1)/n, allgather/reduce_scatter (n-1)/n of the full
buffer (allgather output, reduce_scatter input).

Binding: mpirun binds each rank to a core by default when there are at least as many cores as
ranks, and on a shared machine where a rank sits matters more than any code path (two unbound
ranks that land on one core while other work holds the other take turns on it: hundreds of
microseconds per small allreduce, for every backend). So every backend gets the same policy:
``--bind core`` (the default) pins rank r to the r-th allowed CPU when the ranks fit, which is
what mpirun does (``collectx.launch(..., bind="core")`` for collectx and gloo, ``--bind-to core``
for mpirun); ``--bind none`` leaves placement to the scheduler everywhere.

``--staged`` adds collectx with ``COLLECTX_CMA=0`` as one more backend of every round: peers
then read staged copies in the shared window, never each other's buffers across processes, so
the ``cx/staged`` column shows what cross-process reads bring, measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from _checkout import ROOT  # this checkout's collectx first (also for the mpirun workers)
from _probe import exchange_us

FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
          "reduce": lambda n: 1.0}
# NCCL-style in place: allgather's input is the rank's block of the output, reduce_scatter's
# output the rank's block of the input (MPI_IN_PLACE for Open MPI)
FACTOR |= {"allgather_inplace": FACTOR["allgather"],
           "reduce_scatter_inplace": FACTOR["reduce_scatter"]}


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B") or "0"
    return int(float(t[:-1]) * mult[t[-1]]) if t[-1] in mult else int(t)


def iterations(nbytes: int, budget_s: float) -> int:
    """Iterations for a size: about budget_s of work at an assumed 2 GB/s, within [3, 2000]."""
    return int(min(2000, max(3, budget_s * 2e9 / max(nbytes, 64))))


def elements(coll: str, nbytes: int, n: int) -> tuple[int, int]:
    """(input elements, output elements) of float32 for a collective of nbytes (nccl-tests)."""
    e = max(1, nbytes // 4)
    if coll in ("allreduce", "broadcast", "reduce"):
        return e, e
    per = max(1, e // n)
    return (per, per * n) if coll.startswith("allgather") else (per * n, per)


# -- one timed loop per backend ---------------------------------------------------------------
def time_loop(run, barrier, iters: int, touch=None) -> float:
    """Seconds per ``run()``. With ``touch``, each call is preceded by ``touch()`` (rewriting
    the input, as a training step rewrites its gradients), and the time of the touches alone,
    measured the same way, is subtracted."""
    def loop(fn) -> float:
        for _ in range(2):
            fn()
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        barrier()
        return (time.perf_counter() - t0) / iters
    if touch is None:
        return loop(run)
    both = loop(lambda: (touch(), run()))
    return max(both - loop(touch), 0.0)


def _input_of(coll: str, x, y, rank: int, ni: int):
    """The buffer a rank's call reads as its input (what --touch rewrites)."""
    return y[rank * ni:(rank + 1) * ni] if coll == "allgather_inplace" else x


def bench_collectx(cases, budget, window=False, touch=False):
    """``window``: buffers from ``comm.empty`` (in the shared window: no staging copies)."""
    import collectx
    comm = collectx.init()
    out = []
    for coll, nbytes in cases:
        ni, no = elements(coll, nbytes, comm.size)
        if window:   # the heap is as large as the window (COLLECTX_WINDOW_BYTES): free as we go
            x = comm.empty((ni,), np.float32)
            y = x if coll == "allreduce" else comm.empty((no,), np.float32)
            x[:] = 1
        else:
            x, y = np.ones(ni, np.float32), np.empty(no, np.float32)
        r = comm.rank
        fn = {"allreduce": lambda: comm.allreduce(x),
              "allgather": lambda: comm.allgather(x, out=y),
              "reduce_scatter": lambda: comm.reduce_scatter(x, out=y),
              "broadcast": lambda: comm.broadcast(x, root=0),
              "reduce": lambda: comm.reduce(x, root=0),
              "allgather_inplace": lambda: comm.allgather(y[r * ni:(r + 1) * ni], out=y),
              "reduce_scatter_inplace":
                  lambda: comm.reduce_scatter(x, out=x[r * no:(r + 1) * no])}[coll]
        src = _input_of(coll, x, y, r, ni)
        out.append(time_loop(fn, comm.barrier, iterations(nbytes, budget),
                             (lambda: src.fill(1.0)) if touch else None))
        del x, y, fn, src
    comm.close()
    return out


def bench_gloo(cases, budget, rdzv, touch=False):
    import torch
    import torch.distributed as dist
    rank, size = int(os.environ["COLLECTX_RANK"]), int(os.environ["COLLECTX_WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{rdzv}/gloo", rank=rank,
                            world_size=size)
    out = []
    for coll, nbytes in cases:
        ni, no = elements(coll, nbytes, size)
        x, y = torch.ones(ni), torch.empty(no)
        fn = {"allreduce": lambda: dist.all_reduce(x),
              "allgather": lambda: dist.all_gather_into_tensor(y, x),
              "reduce_scatter": lambda: dist.reduce_scatter_tensor(y, x),
              "broadcast": lambda: dist.broadcast(x, src=0),
              "reduce": lambda: dist.reduce(x, dst=0),
              "allgather_inplace":
                  lambda: dist.all_gather_into_tensor(y, y[rank * ni:(rank + 1) * ni]),
              "reduce_scatter_inplace":
                  lambda: dist.reduce_scatter_tensor(x[rank * no:(rank + 1) * no], x)}[coll]
        src = _input_of(coll, x, y, rank, ni)
        try:
            out.append(time_loop(fn, dist.barrier, max(3, iterations(nbytes, budget) // 4),
                                 (lambda: src.fill_(1.0)) if touch else None))
        except RuntimeError:  # gloo lacks reduce_scatter_tensor on CPU in some versions
            out.append(float("nan"))
    dist.destroy_process_group()
    return out


def bench_mpi(cases, budget, touch=False):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    out = []
    for coll, nbytes in cases:
        ni, no = elements(coll, nbytes, comm.size)
        x, y = np.ones(ni, np.float32), np.empty(no, np.float32)
        root = comm.rank == 0
        fn = {"allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM),
              "allgather": lambda: comm.Allgather(x, y),
              "reduce_scatter": lambda: comm.Reduce_scatter_block(x, y, op=MPI.SUM),
              "broadcast": lambda: comm.Bcast(x, root=0),
              "reduce": lambda: comm.Reduce(MPI.IN_PLACE if root else x, x if root else None,
                                            op=MPI.SUM, root=0),
              "allgather_inplace": lambda: comm.Allgather(MPI.IN_PLACE, y),
              "reduce_scatter_inplace":
                  lambda: comm.Reduce_scatter_block(MPI.IN_PLACE, x, op=MPI.SUM)}[coll]
        src = _input_of(coll, x, y, comm.rank, ni)
        out.append(time_loop(fn, comm.Barrier, iterations(nbytes, budget),
                             (lambda: src.fill(1.0)) if touch else None))
    return out if comm.rank == 0 else None


# -- drivers ------------------------------------------------------------------------------------
def _rank0(results):
    return results[0]


def run_collectx(n, cases, budget, bind, window=False, cma=True, touch=False):
    """``cma=False``: the ranks run with COLLECTX_CMA=0 (otherwise the environment decides)."""
    import collectx
    before = os.environ.get("COLLECTX_CMA")
    if not cma:
        os.environ["COLLECTX_CMA"] = "0"   # the spawned ranks read it at init
    try:
        return _rank0(collectx.launch(bench_collectx, n, args=(cases, budget, window, touch),
                                      bind=bind))
    finally:
        if before is None:
            os.environ.pop("COLLECTX_CMA", None)
        else:
            os.environ["COLLECTX_CMA"] = before


def run_gloo(n, cases, budget, bind, touch=False):
    import collectx
    rdzv = tempfile.mkdtemp(prefix="cmp-gloo-")
    try:
        return _rank0(collectx.launch(bench_gloo, n, args=(cases, budget, rdzv, touch),
                                      bind=bind))
    finally:
        shutil.rmtree(rdzv, ignore_errors=True)


def run_mpi(n, cases, budget, bind, touch=False):
    from collectx.runtime.affinity import effective_policy
    if not shutil.which("mpirun"):
        return [float("nan")] * len(cases)
    with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to",
               effective_policy(bind, n), "-n", str(n), sys.executable,
               __file__, "--mpi-worker", f.name, "--budget", str(budget),
               "--cases", json.dumps(cases)] + (["--touch"] if touch else [])
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": ROOT})
        return json.load(open(f.name))


def rounds(n, cases, budget, skip, repeat, bind, probes=None, window=False, touch=False):
    """Median time per case of each backend over ``repeat`` round-robin rounds. ``probes``
    (a dict) collects :func:`_probe.exchange_us` taken before each backend's round."""
    none = [float("nan")] * len(cases)
    runs = {"cx": [], "staged": [], "mpi": [], "gloo": []}
    probes = {} if probes is None else probes
    run = {"cx": functools.partial(run_collectx, window=window, touch=touch),
           "mpi": functools.partial(run_mpi, touch=touch),
           "staged": functools.partial(run_collectx, window=window, cma=False, touch=touch),
           "gloo": functools.partial(run_gloo, touch=touch)}
    for _ in range(repeat):
        for k in ("cx", "staged", "mpi", "gloo"):
            if k in skip:
                runs[k].append(none)
                continue
            probes.setdefault(k, []).append(exchange_us())
            runs[k].append(run[k](n, cases, budget, bind))
    return [[float(np.median(col)) for col in zip(*runs[k])]
            for k in ("cx", "staged", "mpi", "gloo")]


def probe_lines(n, probes) -> str:
    """One line per backend: the machine probe before each of its rounds."""
    names = {"cx": "collectx", "staged": "staged", "mpi": "Open MPI", "gloo": "gloo"}
    return "\n".join(f"  {n} ranks, before {names[k]:<8} rounds: "
                     + " ".join(f"{t:.0f}" for t in ts) for k, ts in probes.items())


def table(rows, staged: bool = False) -> str:
    """The result table; ``staged`` adds the COLLECTX_CMA=0 backend's time and ratio."""
    extra = staged and rows
    head = (f"{'coll':<15}{'ranks':>5}{'bytes':>11}{'collectx us':>13}"
            + (f"{'staged us':>11}" if extra else "") + f"{'MPI us':>11}"
            f"{'gloo us':>11}{'cx busbw':>10}{'MPI busbw':>10}{'gloo busbw':>11}"
            f"{'cx/MPI':>8}{'cx/gloo':>9}" + (f"{'cx/staged':>11}" if extra else ""))
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['coll']:<15}{r['ranks']:>5}{r['bytes']:>11}{r['collectx_us']:>13.1f}"
                     + (f"{r['staged_us']:>11.1f}" if extra else "")
                     + f"{r['mpi_us']:>11.1f}{r['gloo_us']:>11.1f}"
                     f"{r['collectx_busbw']:>10.2f}{r['mpi_busbw']:>10.2f}{r['gloo_busbw']:>11.2f}"
                     f"{r['ratio_mpi']:>8.2f}{r['ratio_gloo']:>9.1f}"
                     + (f"{r['ratio_staged']:>11.2f}" if extra else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--colls", default="allreduce,allgather,reduce_scatter",
                    help="comma list of: " + ", ".join(FACTOR) + " (the _inplace ones: the "
                         "input is the rank's block of the output, or the reverse)")
    ap.add_argument("--sizes", default="8,64K,1M,16M,64M,256M")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of work per point")
    ap.add_argument("--skip", default="", help="backends to skip: mpi,gloo")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of all backends; each point reports the median round")
    ap.add_argument("--bind", choices=("core", "none"), default="core",
                    help="pin rank r to the r-th allowed CPU when the ranks fit, for every "
                         "backend (mpirun's default), or leave placement to the scheduler")
    ap.add_argument("--buffers", choices=("numpy", "window"), default="numpy",
                    help="collectx's buffers: numpy arrays (staged through the shared window, "
                         "like every other backend's) or comm.empty arrays in the window")
    ap.add_argument("--staged", action="store_true",
                    help="also run collectx with COLLECTX_CMA=0 (peers read staged copies)")
    ap.add_argument("--touch", action="store_true",
                    help="every rank rewrites its input before each call, as a training step "
                         "rewrites its gradients (the rewrite's own time, measured alone, is "
                         "subtracted); by default the same buffer is reduced again and again, "
                         "as nccl-tests do")
    ap.add_argument("--json", help="also write JSON lines here")
    ap.add_argument("--mpi-worker", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    unknown = set(a.colls.split(",")) - set(FACTOR)
    if unknown and not a.mpi_worker:
        ap.error(f"--colls {','.join(sorted(unknown))}: expected some of {', '.join(FACTOR)}")
    if a.mpi_worker:
        res = bench_mpi([tuple(c) for c in json.loads(a.cases)], a.budget, a.touch)
        if res is not None:
            json.dump(res, open(a.mpi_worker, "w"))
        return 0
    rows, notes = [], []
    skip = {k.strip() for k in a.skip.split(",")} & {"mpi", "gloo"}
    if not a.staged:
        skip.add("staged")
    for n in map(int, a.ranks.split(",")):
        cases = [(c, parse_size(s)) for c in a.colls.split(",") for s in a.sizes.split(",")]
        probes: dict = {}
        cx, staged, mpi, gloo = rounds(n, cases, a.budget, skip, max(1, a.repeat), a.bind,
                                       probes, window=a.buffers == "window", touch=a.touch)
        notes.append(probe_lines(n, probes))
        for (coll, nbytes), t_cx, t_st, t_mpi, t_gl in zip(cases, cx, staged, mpi, gloo):
            f = FACTOR[coll](n)
            bw = lambda t: nbytes / t * f / 1e9 if t == t and t > 0 else float("nan")  # noqa
            rows.append({"coll": coll, "ranks": n, "bytes": nbytes, "bind": a.bind,
                         "collectx_us": t_cx * 1e6, "mpi_us": t_mpi * 1e6, "gloo_us": t_gl * 1e6,
                         "collectx_busbw": bw(t_cx), "mpi_busbw": bw(t_mpi),
                         "gloo_busbw": bw(t_gl), "ratio_mpi": t_mpi / t_cx,
                         "ratio_gloo": t_gl / t_cx, "staged_us": t_st * 1e6,
                         "ratio_staged": t_st / t_cx})
    print(table(rows, a.staged))
    print("\nmachine probe (us per 1 MiB exchange between the first two CPUs, numpy only; "
          "rounds that ran on a steadier or faster machine show here):")
    print("\n".join(notes))
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
