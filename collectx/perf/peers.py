"""Who runs the sweep: collectx itself, and the peers beside it (Open MPI, gloo, NCCL).

Each runner returns a :class:`PeerResult`. A peer that is not installed, cannot run this dtype or
crashes comes back *skipped* with the reason and the install hint; it never fails the run.
Peers run in their own processes (``python -m collectx.perf.worker``) so a peer library's
initialisation (MPI_Init, CUDA contexts) never leaks into this process.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import collectx
from collectx.runtime.affinity import effective_policy

MPI_HINT = ("pip install collectx[mpi]  (and the library: apt-get install openmpi-bin "
            "libopenmpi-dev)")
TORCH_HINT = "pip install collectx[torch]"
NCCL_HINT = "needs an NVIDIA GPU with a CUDA build of torch (pip install collectx[torch])"
PEER_TIMEOUT_S = 1800


@dataclasses.dataclass(frozen=True, slots=True)
class PeerResult:
    """Rows of one peer's sweep, or why it was skipped (``rows`` is None then)."""

    name: str
    rows: list | None = None
    skipped: str | None = None
    hint: str | None = None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _env() -> dict:
    # Workers must import this very collectx (a source checkout need not be installed), and one
    # BLAS/OpenMP thread per rank keeps ranks from fighting over the cores.
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(collectx.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _worker_cmd(engine: str, spec: dict) -> list[str]:
    return [sys.executable, "-m", "collectx.perf.worker", "--engine", engine,
            "--spec", json.dumps(spec)]


def parse_json_lines(name: str, text: str, returncode: int, stderr: str = "") -> PeerResult:
    """Rows from a worker's stdout; a missing ``done`` or an ``error`` line skips the peer."""
    rows, done, error = [], False, None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue  # launchers may print banners
        msg = json.loads(line)
        rows += [msg["row"]] if "row" in msg else []
        done = done or bool(msg.get("done"))
        error = msg.get("error", error)
    if done and returncode == 0:
        return PeerResult(name, rows)
    why = error or (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1]
    return PeerResult(name, skipped=f"{name} run failed: {why}")


def run_mpi(spec: dict, nprocs: int) -> PeerResult:
    """The sweep through Open MPI: ``mpirun -n N python -m collectx.perf.worker --engine mpi``."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return PeerResult("mpi", skipped="mpirun not found on PATH", hint=MPI_HINT)
    if not _has_module("mpi4py"):
        return PeerResult("mpi", skipped="mpi4py is not installed", hint=MPI_HINT)
    if spec["dtype"] in ("float16", "bfloat16"):
        return PeerResult("mpi", skipped=f"Open MPI has no {spec['dtype']} reductions")
    # Bound like collectx's own ranks: mpirun's default binding changes with the rank count.
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", str(nprocs),
           "--bind-to", effective_policy(spec.get("bind", "none"), nprocs),
           "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]
    # mpirun forwards stderr line by line, so a carriage-return progress bar cannot redraw
    # through it: announce the run instead.
    cmd += _worker_cmd("mpi", {**spec, "progress": False})
    if spec.get("progress"):
        sys.stderr.write(f"collectx-perf: running the sweep through Open MPI ({nprocs} ranks)\n")
    try:
        done = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return PeerResult("mpi", skipped=f"mpi run exceeded {PEER_TIMEOUT_S} s")
    return parse_json_lines("mpi", done.stdout, done.returncode, done.stderr)


def run_torch(spec: dict, nprocs: int, backend: str = "gloo") -> PeerResult:
    """The sweep through torch.distributed (gloo, or nccl on GPUs), ranks sharing a FileStore."""
    if not _has_module("torch"):
        return PeerResult(backend, skipped="torch is not installed", hint=TORCH_HINT)
    if backend == "nccl":
        reason = _nccl_missing(nprocs)
        if reason:
            return PeerResult("nccl", skipped=reason, hint=NCCL_HINT)
    with tempfile.TemporaryDirectory(prefix="collectx-perf-") as tmp:
        store = os.path.join(tmp, "store")
        procs, logs = [], []
        try:
            for rank in range(nprocs):
                cmd = _worker_cmd(backend, spec) + ["--rank", str(rank), "--world",
                                                    str(nprocs), "--store", store]
                # Other ranks' stderr goes to files: a pipe nobody reads until rank 0 is done
                # could fill up and stall the collective.
                logs.append(None if rank == 0 else open(os.path.join(tmp, f"{rank}.err"), "w+"))
                procs.append(subprocess.Popen(
                    cmd, env=_env(), text=True, stdout=subprocess.PIPE if rank == 0 else
                    subprocess.DEVNULL, stderr=logs[-1]))
            return _collect(backend, procs, logs)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            for log in logs[1:]:
                log.close()


def _collect(name: str, procs: list, logs: list) -> PeerResult:
    try:
        out, _ = procs[0].communicate(timeout=PEER_TIMEOUT_S)
        for proc in procs[1:]:
            proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        return PeerResult(name, skipped=f"{name} run exceeded {PEER_TIMEOUT_S} s")
    errs = ""
    for log in logs[1:]:
        log.seek(0)
        errs += log.read()
    rc = max(abs(p.returncode) for p in procs)
    return parse_json_lines(name, out, rc, errs)


def _nccl_missing(nprocs: int) -> str | None:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    if not dist.is_nccl_available():
        return "this torch build has no NCCL"
    if torch.cuda.device_count() < nprocs:
        return f"{nprocs} ranks need {nprocs} GPUs; torch sees {torch.cuda.device_count()}"
    return None


def run_peer(name: str, spec: dict, nprocs: int) -> PeerResult:
    """Dispatch ``mpi``, ``gloo`` or ``nccl``."""
    if name == "mpi":
        return run_mpi(spec, nprocs)
    return run_torch(spec, nprocs, backend=name)
