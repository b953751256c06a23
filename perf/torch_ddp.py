"""torch.distributed over collectx vs gloo, in the same processes: all_reduce busbw and DDP steps.

    python perf/torch_ddp.py --nranks 2 --max-bytes 256M

For each message size (1 KiB .. --max-bytes, x4 steps) every rank times ``dist.all_reduce`` on
the default collectx group and on a gloo group (``new_group(backend="gloo")``), alternating so both
see the same machine load; then both time DDP training steps of an MLP. Prints one JSON line per
measurement, then a side-by-side table with collectx/gloo ratios (and the Communicator called
directly, to show what torch.distributed adds). busbw follows nccl-tests:
``2 (n-1)/n * bytes / time``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from collectx.integrations.torch_testing import run_ranks  # noqa: E402

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """``"64K"`` -> 65536."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def _time_allreduce(x, group, budget_s: float) -> float:
    """Mean seconds per all_reduce over enough iterations to fill ``budget_s`` (min 3)."""
    dist.all_reduce(x, group=group)                       # warm-up (and first-touch of pages)
    start = time.perf_counter()
    dist.all_reduce(x, group=group)
    once = time.perf_counter() - start
    iters = max(3, min(200, int(budget_s / max(once, 1e-6))))
    # All ranks must agree on the count: take rank 0's via the gloo-free max over the group.
    count = torch.tensor([iters])
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(int(count)):
        dist.all_reduce(x, group=group)
    return (time.perf_counter() - start) / int(count)


def _time_direct(comm, x, budget_s: float) -> float:
    """Like :func:`_time_allreduce`, calling the Communicator under the group directly."""
    comm.allreduce(x)
    start = time.perf_counter()
    comm.allreduce(x)
    once = time.perf_counter() - start
    count = torch.tensor([max(3, min(200, int(budget_s / max(once, 1e-6))))])
    comm.allreduce(count, op="max")
    start = time.perf_counter()
    for _ in range(int(count)):
        comm.allreduce(x)
    return (time.perf_counter() - start) / int(count)


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


def _bench(rank, world, sizes, budget_s, ddp_steps, width):
    gloo = dist.new_group(backend="gloo")
    groups = {"collectx": dist.group.WORLD, "gloo": gloo}
    factor = 2 * (world - 1) / world
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        row = {"bytes": nbytes}
        timings = {name: _time_allreduce(x, group, budget_s) for name, group in groups.items()}
        timings["direct"] = _time_direct(dist.group.WORLD.communicator(), x, budget_s)
        for name, seconds in timings.items():
            row[name] = {"us": seconds * 1e6, "busbw_gbps": factor * nbytes / seconds / 1e9}
        rows.append(row)
    ddp = {name: _ddp_step_ms(group, ddp_steps, width) for name, group in groups.items()}
    return {"allreduce": rows, "ddp_step_ms": ddp} if rank == 0 else None


def _print_table(result, world) -> None:
    print(f"\nall_reduce float32 through torch.distributed, {world} ranks "
          f"(busbw GB/s, time us)")
    print(f"{'size':>9} {'collectx us':>12} {'gloo us':>10} {'collectx bw':>12} "
          f"{'gloo bw':>9} {'ratio':>7} {'direct bw':>10}")
    for row in result["allreduce"]:
        cx, gl, direct = row["collectx"], row["gloo"], row["direct"]
        print(f"{_human(row['bytes']):>9} {cx['us']:12.1f} {gl['us']:10.1f} "
              f"{cx['busbw_gbps']:12.3f} {gl['busbw_gbps']:9.3f} "
              f"{cx['busbw_gbps'] / gl['busbw_gbps']:6.1f}x {direct['busbw_gbps']:10.3f}")
    print("(direct: the same Communicator called without torch.distributed, for the "
          "backend's own overhead)")
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
    parser.add_argument("--ddp-steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=1024, help="DDP MLP hidden width")
    args = parser.parse_args(argv)
    sizes, size = [], parse_bytes(args.min_bytes)
    while size <= parse_bytes(args.max_bytes):
        sizes.append(size)
        size *= 4
    result = run_ranks(_bench, args.nranks, sizes, args.budget, args.ddp_steps, args.width,
                       timeout_s=3600, env={"OMP_NUM_THREADS": "1"})[0]
    for row in result["allreduce"]:
        for backend in ("collectx", "gloo", "direct"):
            print(json.dumps({"coll": "allreduce", "backend": backend, "nranks": args.nranks,
                              "bytes": row["bytes"], "time_us": row[backend]["us"],
                              "busbw_gbps": row[backend]["busbw_gbps"]}))
    print(json.dumps({"coll": "ddp_step", "nranks": args.nranks, **result["ddp_step_ms"]}))
    _print_table(result, args.nranks)


if __name__ == "__main__":
    main()
