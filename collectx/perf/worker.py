"""One rank of a peer's sweep: ``python -m collectx.perf.worker --engine mpi|gloo|nccl``.

``collectx-perf --compare`` starts these (under ``mpirun`` for MPI, as plain processes sharing a
FileStore for torch.distributed); rank 0 prints one JSON line per result row on stdout, then
``{"done": true}``, or ``{"error": ...}`` when the sweep failed.
"""

from __future__ import annotations

import argparse
import json
import sys

from .sweep import run_sweep, stderr_progress


def _connect(args, bind: str = "none"):
    if args.engine == "mpi":
        from .adapters import MpiComm
        return MpiComm()
    from ..runtime.affinity import bind_process
    # The policy collectx's ranks ran under, set before torch starts any thread.
    bind_process(args.rank, args.world, bind)
    import torch.distributed as dist
    from .adapters import TorchComm
    store = dist.FileStore(args.store, args.world)
    backend = "nccl" if args.engine == "nccl" else "gloo"
    if backend == "nccl":
        import torch
        torch.cuda.set_device(args.rank % torch.cuda.device_count())
    dist.init_process_group(backend, store=store, rank=args.rank, world_size=args.world)
    return TorchComm("cuda" if backend == "nccl" else "cpu")


def _progress(engine: str):
    return lambda done, total, label: stderr_progress(done, total, f"{engine}: {label}")


def main(argv: list[str] | None = None) -> int:
    """Run the sweep in ``--spec`` (JSON) on this rank; rank 0 reports JSON lines."""
    p = argparse.ArgumentParser(prog="python -m collectx.perf.worker")
    p.add_argument("--engine", choices=("mpi", "gloo", "nccl"), required=True)
    p.add_argument("--spec", required=True, help="the sweep as JSON (Options.spec())")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--store", default=None, help="FileStore path (torch engines)")
    args = p.parse_args(argv)
    spec = json.loads(args.spec)
    comm = _connect(args, spec.get("bind", "none"))
    try:
        progress = _progress(args.engine) if spec.get("progress") else None
        rows = run_sweep(comm, spec, progress=progress)
    except Exception as exc:  # reported to the parent, which shows the peer as failed
        if comm.rank == 0:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    if comm.rank == 0:
        for row in rows:
            print(json.dumps({"row": row}), flush=True)
        print(json.dumps({"done": True}), flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
