"""collectx-perf end to end on the real runtime: its own ranks, and a launcher's ranks."""

import os
import subprocess
import sys

import pytest

import collectx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(collectx.__file__)))


def _native_ready():
    try:
        collectx.build_info()
    except Exception:  # noqa: BLE001 (any failure means: no usable native library here)
        return False
    return True


pytestmark = pytest.mark.skipif(not _native_ready(), reason="native library not built")


def _run(args, timeout=240):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for name in ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "RANK", "COLLECTX_RANK"):
        env.pop(name, None)  # this test starts the ranks itself
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def test_every_collective_on_three_ranks_checks_clean():
    done = _run(["-m", "collectx.cli.perf", "--collective", "all", "-n", "3", "-b", "1",
                 "-e", "4K", "-f", "64", "--no-progress"])
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "# Out of bounds values : 0 OK" in out
    for collective in ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce",
                       "alltoall"):
        assert f"# Collective: {collective}" in out
    rows = [ln.split() for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert rows and all(r[8] in ("0", "N/A") and r[12] in ("0", "N/A") for r in rows)


def test_under_collectx_run_the_launchers_ranks_are_used():
    done = _run(["-m", "collectx.run", "-n", "2", "-m", "collectx.cli.perf", "-b", "8", "-e",
                 "64", "-I", "2", "--no-progress"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("# Out of bounds values : 0 OK") == 1  # rank 0 reports, once
    assert "nranks 2" in done.stdout


def test_buffers_too_big_for_the_default_window_get_a_window_that_holds_them():
    from collectx.perf.window import window_for
    spec = {"collectives": ["allreduce"], "sizes": [40 << 20], "dtype": "float32"}
    done = _run(["-m", "collectx.cli.perf", "-n", "2", "-b", "40M", "-e", "40M", "-w", "1",
                 "-I", "1", "--no-progress"])
    assert done.returncode == 0, done.stderr[-2000:]
    # 80 MiB of buffers: in the window when /dev/shm has room (and no window size is forced)
    want = "comm.empty" if window_for(spec, 2) else "ordinary memory"
    assert f"# collectx buffers: {'arrays from ' if want == 'comm.empty' else ''}{want}" \
        in done.stdout, done.stdout
