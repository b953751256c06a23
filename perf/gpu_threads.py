"""Collectives of ranks as threads of one process on one GPU, against the GPU's memory limit.

Ranks as threads (each on its own stream) measure the executor, not the driver's time slice
between processes. With k ranks on one GPU, a collective must move at least this many bytes
through HBM, reads plus writes (S: bytes per rank of the allreduce buffer, of the allgather
input, of the reduce_scatter output):

    allreduce        2 k S        every input read once, every output written once
    allgather        k S + k^2 S  every input read once, every rank's k S output written once
    reduce_scatter   k^2 S + k S  every rank's k S input read once, every output written once

``frac`` is that traffic over the call's time, divided by the same run's device-to-device copy
rate (a torch copy of 1 GiB, reads plus writes): 1.0 is the memory limit. Every call's result is
checked once against the exact answer before it is timed (``ok``).

    python perf/gpu_threads.py --ranks 2,4,8 --sizes 64M,512M --dtypes float32,bfloat16
    python perf/gpu_threads.py --latency --ranks 2,8     # 8-byte allreduce, back to back
    python perf/gpu_threads.py --latency --graphs        # ... and replayed from a CUDA graph

Needs torch with CUDA and a libcollectx with CUDA objects.
"""

from __future__ import annotations

import os

# Each thread rank drives two streams; more streams than hardware queues can deadlock
# (collectx/runtime/cuda/window.py). Set before CUDA starts.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import _checkout  # noqa: E402,F401  (this checkout's collectx first)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from gpu_roofline import parse_bytes  # noqa: E402


def traffic(coll: str, k: int, nbytes: int) -> int:
    """Least HBM bytes (reads + writes) of one call on one GPU (see the module notes).

    >>> [traffic(coll, 2, 100) for coll in ("allreduce", "allgather", "reduce_scatter")]
    [400, 600, 600]
    """
    return {"allreduce": 2 * k * nbytes, "allgather": k * nbytes + k * k * nbytes,
            "reduce_scatter": k * k * nbytes + k * nbytes}[coll]


def copy_rate(torch, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Device-to-device copy rate in bytes per second, reads plus writes (median of iters)."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return 2 * nbytes / statistics.median(times)


def on_thread_ranks(k: int, job) -> list:
    """``job(comm, barrier)`` on k thread ranks of GPU 0, each on its own stream."""
    import torch
    from collectx.runtime.cuda import CudaCommunicator
    from collectx.runtime.store import HashStore
    store, barrier = HashStore(), threading.Barrier(k)
    results, errors = [None] * k, []

    def rank_main(r):
        try:
            torch.cuda.set_device(0)
            with torch.cuda.stream(torch.cuda.Stream()):
                with CudaCommunicator(r, k, store, device=0, timeout=20.0) as comm:
                    results[r] = job(comm, barrier)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            barrier.abort()
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def buffers(torch, comm, coll: str, n: int, dtype):
    """(input, output, expected output) of rank comm.rank for n elements per rank."""
    k, r = comm.size, comm.rank
    total = k * (k + 1) // 2
    if coll == "allreduce":
        x = torch.full((n,), r + 1, dtype=dtype, device="cuda")
        return x, x, torch.full((n,), total, dtype=dtype, device="cuda")
    if coll == "allgather":
        x = torch.full((n,), r + 1, dtype=dtype, device="cuda")
        want = torch.arange(1, k + 1, dtype=dtype, device="cuda").repeat_interleave(n)
        return x, torch.empty(k * n, dtype=dtype, device="cuda"), want
    x = torch.full((k * n,), r + 1, dtype=dtype, device="cuda")
    return x, torch.empty(n, dtype=dtype, device="cuda"), torch.full((n,), total, dtype=dtype,
                                                                     device="cuda")


def load_kernels(torch, dtypes: list[str], colls: list[str]) -> None:
    """Runs every torch kernel the ranks use once, here, before any rank starts. Kernels load
    lazily by default, and a first launch waits for the context to go idle, which it never does
    while a peer thread's collective kernel spins waiting for this one (docs/cuda.md)."""
    from types import SimpleNamespace
    fake = SimpleNamespace(size=2, rank=0)
    for name in dtypes:
        for coll in colls:
            x, out, want = buffers(torch, fake, coll, 64, getattr(torch, name))
            torch.equal(out, want)
    torch.ones(2, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()


def call(comm, coll: str, x, out):
    if coll == "allreduce":
        comm.allreduce(x)
    elif coll == "allgather":
        comm.allgather(x, out)
    else:
        comm.reduce_scatter(x, out)


def bandwidth_job(coll: str, nbytes: int, dtype_name: str, iters: int):
    """A job: check one call, then time ``iters`` calls; (ok, seconds per call) of a rank."""
    def job(comm, barrier):
        import torch
        dtype = getattr(torch, dtype_name)
        n = nbytes // torch.empty(0, dtype=dtype).element_size()
        x, out, want = buffers(torch, comm, coll, n, dtype)
        call(comm, coll, x, out)
        ok = bool(torch.equal(out, want))
        for _ in range(2):
            call(comm, coll, x, out)
        comm.synchronize()
        barrier.wait()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call(comm, coll, x, out)
        stop.record()
        stop.synchronize()
        comm.synchronize()
        return ok, start.elapsed_time(stop) / 1e3 / iters
    return job


def latency_job(iters: int):
    """A job: back-to-back 8-byte allreduces; (device s, host s) per call of a rank."""
    def job(comm, barrier):
        import torch
        x = torch.ones(2, dtype=torch.float32, device="cuda")
        for _ in range(50):
            comm.allreduce(x)
        comm.synchronize()
        barrier.wait()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(iters):
            comm.allreduce(x)
        stop.record()
        stop.synchronize()
        host = time.perf_counter() - t0
        comm.synchronize()
        return start.elapsed_time(stop) / 1e3 / iters, host / iters
    return job


def profile(torch, k: int, trace: str) -> None:
    """k thread ranks' back-to-back 8-byte allreduces under torch.profiler: where device time
    goes per call (kernels, copies, the gaps between them in the trace)."""
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        on_thread_ranks(k, latency_job(200))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12), flush=True)
    prof.export_chrome_trace(trace)


def graph_job(calls: int = 100, replays: int = 10):
    """A job: ``calls`` 8-byte allreduces captured into one CUDA graph, replayed ``replays``
    times; device seconds per call of a rank. torch.cuda.graph synchronizes the device as it
    begins, so every rank captures between barriers (no peer spins in a collective then)."""
    def job(comm, barrier):
        import torch
        x = torch.ones(2, dtype=torch.float32, device="cuda")
        comm.allreduce(x, op="max")
        comm.synchronize()
        barrier.wait()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.current_stream(),
                              capture_error_mode="thread_local"):
            for _ in range(calls):
                comm.allreduce(x, op="max")
        barrier.wait()
        graph.replay()
        torch.cuda.current_stream().synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        stop.record()
        stop.synchronize()
        comm.synchronize()
        return start.elapsed_time(stop) / 1e3 / (calls * replays)
    return job


def keep(row: dict, rows: list, path: str | None) -> None:
    """Adds ``row`` to ``rows`` and appends it to the JSON-lines file ``path`` at once, so a run
    cut short by a time limit keeps what it measured."""
    rows.append(row)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4,8", help="thread ranks per run (comma list)")
    ap.add_argument("--sizes", default="64M,512M", help="S per rank (see the notes)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--collectives", default="allreduce,allgather,reduce_scatter")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--latency", action="store_true", help="8-byte allreduce latency instead")
    ap.add_argument("--graphs", action="store_true",
                    help="with --latency: also time calls captured into a CUDA graph, replayed")
    ap.add_argument("--profile", metavar="TRACE",
                    help="with --latency: profile the first k's calls (torch.profiler), print its "
                         "device table and write a Chrome trace here")
    ap.add_argument("--json", help="append one JSON line per row here")
    args = ap.parse_args(argv)
    import torch
    torch.cuda.set_device(0)
    load_kernels(torch, args.dtypes.split(","), args.collectives.split(","))
    rate = copy_rate(torch)
    print(f"device-to-device copy (torch, 1 GiB): {rate / 1e9:.0f} GB/s, reads plus writes",
          flush=True)
    ranks = [int(k) for k in args.ranks.split(",")]
    rows = []
    if args.latency:
        print(f"{'k':>3} {'device us/call':>15} {'host us/call':>13} {'graph us/call':>14}")
        if args.profile:
            profile(torch, ranks[0], args.profile)
        for k in ranks:
            got = on_thread_ranks(k, latency_job(1000))
            dev, host = max(g[0] for g in got), max(g[1] for g in got)
            graph = max(on_thread_ranks(k, graph_job())) if args.graphs else float("nan")
            keep({"k": k, "bytes": 8, "device_us": dev * 1e6, "host_us": host * 1e6,
                  "graph_us": graph * 1e6}, rows, args.json)
            print(f"{k:>3} {dev * 1e6:>15.1f} {host * 1e6:>13.1f} {graph * 1e6:>14.1f}",
                  flush=True)
    else:
        print(f"{'collective':<15} {'k':>2} {'dtype':<9} {'S':>6} {'ms/call':>9} "
              f"{'GB/s':>7} {'frac':>5}  ok")
        for k in ranks:
            for coll in args.collectives.split(","):
                for dtype in args.dtypes.split(","):
                    for size in args.sizes.split(","):
                        nbytes = parse_bytes(size)
                        got = on_thread_ranks(k, bandwidth_job(coll, nbytes, dtype, args.iters))
                        t = max(g[1] for g in got)
                        moved = traffic(coll, k, nbytes) / t
                        row = {"collective": coll, "k": k, "dtype": dtype, "bytes": nbytes,
                               "ms": t * 1e3, "GBps": moved / 1e9, "frac": moved / rate,
                               "ok": all(g[0] for g in got), "copy_GBps": rate / 1e9}
                        keep(row, rows, args.json)
                        print(f"{coll:<15} {k:>2} {dtype:<9} {size:>6} {t * 1e3:>9.3f} "
                              f"{moved / 1e9:>7.0f} {moved / rate:>5.2f}  "
                              f"{'yes' if row['ok'] else 'NO'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
