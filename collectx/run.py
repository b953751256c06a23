"""``python -m collectx.run -n N script.py [args]``: start N ranks of a script on this host.

Like ``torchrun --standalone``: every rank runs ``python script.py args`` with
``COLLECTX_RANK``, ``COLLECTX_WORLD_SIZE``, ``COLLECTX_LOCAL_RANK`` and ``COLLECTX_RDZV_DIR`` set,
so ``collectx.init()`` inside it joins the others. When a rank fails, the others get a grace
period to notice and are then terminated; SIGINT/SIGTERM are forwarded; the exit status is the
first failing rank's. The rendezvous directory and shared-memory segments are always cleaned up.
``--bind-to core`` pins rank r to the r-th allowed CPU when the ranks fit, as mpirun does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

from .runtime.affinity import BIND_POLICIES, bind_process
from .runtime.bootstrap import rendezvous_dir
from .runtime.launcher import DEFAULT_GRACE_S, rank_env
from .runtime.window import sweep_stale


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m collectx.run", description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    ap.add_argument("--grace", type=float, default=DEFAULT_GRACE_S,
                    help="seconds the other ranks get after one fails (default %(default)s)")
    ap.add_argument("--bind-to", dest="bind", choices=BIND_POLICIES, default="none",
                    help="core: pin rank r to the r-th allowed CPU when the ranks fit, as "
                         "mpirun does (default %(default)s)")
    ap.add_argument("-m", dest="module", action="store_true",
                    help="run the target as a module (python -m target)")
    ap.add_argument("target", help="script path (or module name with -m)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    ns = ap.parse_args(argv)
    if ns.nproc < 1:
        ap.error(f"-n {ns.nproc}: expected at least 1 rank")
    cmd = [sys.executable] + (["-m"] if ns.module else []) + [ns.target] + ns.args
    return run_group(cmd, ns.nproc, ns.grace, ns.bind)


def run_group(cmd: list[str], nproc: int, grace: float, bind: str = "none") -> int:
    """Run ``cmd`` as ``nproc`` ranks; the first failing rank's exit status, or 0."""
    rdzv = rendezvous_dir()
    procs: list[subprocess.Popen] = []
    old = {}

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, forward)
        for r in range(nproc):
            procs.append(subprocess.Popen(cmd, env={**os.environ, **rank_env(r, nproc, rdzv)}))
            # Pinned from here rather than in a preexec_fn (unsafe in a threaded parent): the
            # rank is still starting its interpreter, and the threads it starts inherit the mask.
            bind_process(r, nproc, bind, pid=procs[-1].pid)
        return _watch(procs, grace)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        _terminate(procs)
        shutil.rmtree(rdzv, ignore_errors=True)
        sweep_stale(pids={p.pid for p in procs})


def _watch(procs: list[subprocess.Popen], grace: float) -> int:
    first_fail: tuple[int, int] | None = None
    fail_at = 0.0
    while any(p.poll() is None for p in procs):
        if first_fail is None:
            for r, p in enumerate(procs):
                if p.returncode not in (None, 0):
                    first_fail, fail_at = (r, p.returncode), time.monotonic()
                    print(f"collectx.run: rank {r} failed ({_describe(p.returncode)}); stopping "
                          f"the other ranks", file=sys.stderr)
                    break
        elif time.monotonic() - fail_at > grace:
            break
        time.sleep(0.02)
    if first_fail is None:
        for r, p in enumerate(procs):
            if p.returncode not in (None, 0):
                first_fail = (r, p.returncode)
                print(f"collectx.run: rank {r} failed ({_describe(p.returncode)})",
                      file=sys.stderr)
                break
    if first_fail is None:
        return 0
    code = first_fail[1]
    return 128 - code if code < 0 else code


def _describe(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


def _terminate(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + 1.0
    for p in procs:
        try:
            p.wait(max(0.01, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
