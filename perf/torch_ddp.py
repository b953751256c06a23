"""torch.distributed over collectx vs gloo, in the same processes: all_reduce busbw and DDP steps.

    python perf/torch_ddp.py --nranks 2 --max-bytes 256M

For each message size (1 KiB .. --max-bytes, x4 steps) every rank times ``dist.all_reduce`` on
the default collectx group (blocking, and ``async_op=True`` then ``wait()``), on a gloo group
(``new_group(backend="gloo")``), and the collectx Communicator under the group called directly on
a numpy view of the same tensor (what the backend adds is the difference). With ``--repeat N``
the whole sweep runs N times, interleaved, and each cell is the median, so that every path sees
the same machine load. Then both backends time DDP training steps of an MLP. Prints one JSON line
per measurement, then a side-by-side table with collectx/gloo ratios. busbw follows nccl-tests:
``2 (n-1)/n * bytes / time``.

``--overhead`` instead prints the per-call CPU time (this thread's, so a busy machine does not
inflate it) of a 1 KiB all_reduce on a world of one: through torch.distributed on a group that does
nothing, the Communicator alone, and the collectx backend blocking and async.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import _checkout  # noqa: F401  (this checkout's collectx first)
from collectx.integrations.torch_testing import run_ranks

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """``"64K"`` -> 65536."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def _time_loop(call, agree_max, budget_s: float) -> float:
    """Mean seconds per ``call()`` over enough iterations to fill ``budget_s`` (3 to 200).

    ``agree_max(tensor)`` makes every rank run the same count (the max over ranks).
    """
    call()                                                 # warm-up (and first-touch of pages)
    start = time.perf_counter()
    call()
    once = time.perf_counter() - start
    count = torch.tensor([max(3, min(200, int(budget_s / max(once, 1e-6))))])
    agree_max(count)
    agree_max(torch.zeros(1, dtype=torch.int64))          # a barrier on the same path
    start = time.perf_counter()
    for _ in range(int(count)):
        call()
    return (time.perf_counter() - start) / int(count)


def _paths(x, gloo):
    """name -> (call, agree_max): the ways one all_reduce of ``x`` is timed."""
    comm = dist.group.WORLD.communicator()
    view = x.numpy()                                       # the tensor's memory, no copy

    def torch_max(group):
        return lambda t: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return {
        "collectx": (lambda: dist.all_reduce(x), torch_max(None)),
        "async": (lambda: dist.all_reduce(x, async_op=True).wait(), torch_max(None)),
        "gloo": (lambda: dist.all_reduce(x, group=gloo), torch_max(gloo)),
        "direct": (lambda: comm.allreduce(view), lambda t: comm.allreduce(t.numpy(), op="max")),
    }
def _ddp_step_ms(group, steps: int, width: int) -> float:
    from torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    ddp = DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    times = []
    for _ in range(steps + 3):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times[3:])[len(times[3:]) // 2]      # median: robust to a noisy core


def _bench(rank, world, sizes, budget_s, repeat, ddp_steps, width):
    gloo = dist.new_group(backend="gloo")
    factor = 2 * (world - 1) / world
    samples: dict[int, dict[str, list[float]]] = {n: {} for n in sizes}
    for _ in range(repeat):
        for nbytes in sizes:
            x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
            for name, (call, agree_max) in _paths(x, gloo).items():
                samples[nbytes].setdefault(name, []).append(_time_loop(call, agree_max, budget_s))
    rows = []
    for nbytes in sizes:
        row = {"bytes": nbytes}
        for name, times in samples[nbytes].items():
            seconds = statistics.median(times)
            row[name] = {"us": seconds * 1e6, "busbw_gbps": factor * nbytes / seconds / 1e9}
        rows.append(row)
    ddp = {name: _ddp_step_ms(group, ddp_steps, width)
           for name, group in (("collectx", dist.group.WORLD), ("gloo", gloo))}
    return {"allreduce": rows, "ddp_step_ms": ddp} if rank == 0 else None


class _NoopGroup(dist.ProcessGroup):
    """A ProcessGroup whose all_reduce does nothing: torch.distributed's own per-call cost."""

    class _Done(dist.Work):
        def wait(self, timeout=None):
            return True

    def allreduce(self, tensors, opts):
        return self._Done()

    def getBackendName(self):  # noqa: N802 -- torch's name
        return "noop"


def _cpu_us(call, iters: int = 5000) -> float:
    """Median over 5 runs of this thread's CPU time per ``call()``, in us: what the call itself
    costs, unlike wall time not inflated when the machine's other work preempts this thread."""
    for _ in range(200):
        call()
    runs = []
    for _ in range(5):
        start = time.thread_time()
        for _ in range(iters):
            call()
        runs.append((time.thread_time() - start) / iters * 1e6)
    return statistics.median(runs)


def _overhead(rank, world):
    """Per-call CPU cost of a 1 KiB all_reduce on a world of one, path by path."""
    dist.Backend.register_backend("noop", lambda store, r, n, timeout=None: _NoopGroup(r, n),
                                  devices=["cpu"])
    noop = dist.new_group(backend="noop")
    x = torch.ones(256)
    comm, view = dist.group.WORLD.communicator(), x.numpy()
    return {"torch.distributed on a no-op group": _cpu_us(lambda: dist.all_reduce(x, group=noop)),
            "Communicator.allreduce(numpy view)": _cpu_us(lambda: comm.allreduce(view)),
            "collectx dist.all_reduce": _cpu_us(lambda: dist.all_reduce(x)),
            "collectx async_op=True + wait()": _cpu_us(
                lambda: dist.all_reduce(x, async_op=True).wait())}


def _print_table(result, world) -> None:
    print(f"\nall_reduce float32 through torch.distributed, {world} ranks "
          f"(busbw GB/s, time us)")
    print(f"{'size':>9} {'collectx us':>12} {'gloo us':>10} {'collectx bw':>12} "
          f"{'gloo bw':>9} {'ratio':>7} {'async bw':>9} {'direct bw':>10} {'vs direct':>10}")
    for row in result["allreduce"]:
        cx, gl = row["collectx"], row["gloo"]
        print(f"{_human(row['bytes']):>9} {cx['us']:12.1f} {gl['us']:10.1f} "
              f"{cx['busbw_gbps']:12.3f} {gl['busbw_gbps']:9.3f} "
              f"{cx['busbw_gbps'] / gl['busbw_gbps']:6.1f}x {row['async']['busbw_gbps']:9.3f} "
              f"{row['direct']['busbw_gbps']:10.3f} "
              f"{cx['busbw_gbps'] / row['direct']['busbw_gbps']:9.2f}x")
    print("(async: async_op=True then wait(); direct: the same Communicator called on a numpy "
          "view of the tensor, without torch.distributed; vs direct: collectx / direct busbw)")
    ddp = result["ddp_step_ms"]
    print(f"\nDDP step (median ms): collectx {ddp['collectx']:.2f}  gloo {ddp['gloo']:.2f}  "
          f"speed-up {ddp['gloo'] / ddp['collectx']:.2f}x")


def _human(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}iB"
    return f"{nbytes}B"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--min-bytes", default="1K")
    parser.add_argument("--max-bytes", default="256M")
    parser.add_argument("--budget", type=float, default=0.3,
                        help="seconds of timed iterations per size and backend")
    parser.add_argument("--repeat", type=int, default=1,
                        help="sweeps to run, interleaved; each cell is the median")
    parser.add_argument("--ddp-steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=1024, help="DDP MLP hidden width")
    parser.add_argument("--overhead", action="store_true",
                        help="only the per-call CPU cost of a 1 KiB all_reduce on one rank")
    args = parser.parse_args(argv)
    if args.overhead:
        costs = run_ranks(_overhead, 1, env={"OMP_NUM_THREADS": "1"})[0]
        for path, us in costs.items():
            print(json.dumps({"coll": "allreduce", "bytes": 1024, "path": path, "cpu_us": us}))
        return
    sizes, size = [], parse_bytes(args.min_bytes)
    while size <= parse_bytes(args.max_bytes):
        sizes.append(size)
        size *= 4
    result = run_ranks(_bench, args.nranks, sizes, args.budget, args.repeat, args.ddp_steps,
                       args.width,
                       timeout_s=3600, env={"OMP_NUM_THREADS": "1"})[0]
    for row in result["allreduce"]:
        for backend in ("collectx", "async", "gloo", "direct"):
            print(json.dumps({"coll": "allreduce", "backend": backend, "nranks": args.nranks,
                              "bytes": row["bytes"], "time_us": row[backend]["us"],
                              "busbw_gbps": row[backend]["busbw_gbps"]}))
    print(json.dumps({"coll": "ddp_step", "nranks": args.nranks, **result["ddp_step_ms"]}))
    _print_table(result, args.nranks)


if __name__ == "__main__":
    main()
