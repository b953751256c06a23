"""Train a small MLP with DistributedDataParallel on synthetic data, over collectx or gloo.

    torchrun --nproc-per-node 2 examples/ddp_train.py --backend collectx --steps 50 --out p.pt

Every rank draws its own batches from a generator seeded by (seed, rank), so two runs with the
same seed and world size see the same data; after training, rank 0 saves the parameters (a dict
of name -> tensor) to ``--out``. Running it once with ``--backend collectx`` and once with
``--backend gloo`` must give the same parameters up to floating-point reassociation.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("collectx", "gloo"), default="collectx")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=128, help="hidden layer width")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--out", help="write the final parameters here (torch.save)")
    parser.add_argument("--timing", action="store_true",
                        help="print one JSON line with the mean step time (after 5 warm-up steps)")
    return parser.parse_args(argv)


def make_model(width: int, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)      # same initial weights on every rank and for every backend
    model = torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1))
    return model.to(dtype)


def batches(seed: int, rank: int, batch: int, dtype: torch.dtype):
    """Endless synthetic regression batches: y = sum(sin(x)) + noise, different per rank."""
    gen = torch.Generator().manual_seed(seed * 7919 + rank)
    while True:
        x = torch.randn(batch, 32, generator=gen, dtype=dtype)
        y = torch.sin(x).sum(dim=1, keepdim=True) + 0.1 * torch.randn(batch, 1, generator=gen,
                                                                      dtype=dtype)
        yield x, y


def train(args) -> dict[str, torch.Tensor]:
    dtype = getattr(torch, args.dtype)
    ddp = DistributedDataParallel(make_model(args.width, dtype, args.seed))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    data = batches(args.seed, dist.get_rank(), args.batch, dtype)
    step_times = []
    for _ in range(args.steps):
        x, y = next(data)
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()          # DDP allreduces gradient buckets here, overlapped with backward
        optimizer.step()
        step_times.append(time.perf_counter() - start)
    if args.timing and dist.get_rank() == 0:
        timed = step_times[5:] or step_times
        print(json.dumps({"backend": args.backend, "world_size": dist.get_world_size(),
                          "steps": len(timed), "step_ms": 1e3 * sum(timed) / len(timed),
                          "final_loss": loss.item()}))
    return {name: p.detach().clone() for name, p in ddp.module.named_parameters()}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.backend == "collectx":
        import collectx.torch  # noqa: F401  (registers the "collectx" backend)
    dist.init_process_group(args.backend)       # env:// rendezvous, as torchrun sets it up
    params = train(args)
    if args.out and dist.get_rank() == 0:
        torch.save(params, args.out)
    dist.barrier()      # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
