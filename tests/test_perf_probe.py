"""The machine probe that perf/compare_cpu.py prints beside each benchmark round, and the C models
of the 2-rank allreduce's data movement that the README quotes."""

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


def _probe():
    path = Path(__file__).resolve().parent.parent / "perf" / "_probe.py"
    spec = importlib.util.spec_from_file_location("collectx_perf_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exchange_probe_times_an_exchange_and_leaves_nothing_in_dev_shm():
    before = set(os.listdir("/dev/shm"))
    t = _probe().exchange_us(iters=20, nbytes=64 << 10)
    if len(os.sched_getaffinity(0)) < 2:
        assert t != t                      # nan: no second CPU to exchange with
    else:
        assert 0 < t < 1e6
    assert set(os.listdir("/dev/shm")) == before


def _run_model(tmp_path, name: str, *args: str):
    """Builds perf/<name>.c and runs it with ``args``: the finished process, or None (after
    checking how it refused) on a machine with fewer than two CPUs."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src = Path(__file__).resolve().parent.parent / "perf" / f"{name}.c"
    exe = tmp_path / name
    subprocess.run([cc, "-O2", "-o", str(exe), str(src)], check=True)
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
    if len(os.sched_getaffinity(0)) < 2:
        assert run.returncode == 1 and "needs two CPUs" in run.stderr
        return None
    return run


def test_exchange_model_builds_and_reports_each_phase(tmp_path):
    # perf/exchange_model.c, the C model of the staged 2-rank allreduce the README quotes.
    run = _run_model(tmp_path, "exchange_model", "0.25")
    if run is None:
        return
    assert run.returncode == 0, run.stderr
    call = re.search(r"256 KiB  call +([\d.]+) us  \(stage ([\d.]+), reduce ([\d.]+), "
                     r"copy ([\d.]+)\)", run.stdout)
    read = re.search(r"128 KiB  remote read +([\d.]+) us, +([\d.]+) GB/s", run.stdout)
    assert call and read, run.stdout
    assert all(float(v) > 0 for v in call.groups() + read.groups())
    bad = subprocess.run([str(tmp_path / "exchange_model"), "0"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "at least 128 bytes" in bad.stderr


def test_cma_push_model_checks_and_times_each_way(tmp_path):
    # perf/cma_push_model.c: pull against push over cross-memory attach, results checked.
    run = _run_model(tmp_path, "cma_push_model", "--touch", "0.25")
    if run is None:
        return
    if run.returncode and "cross-memory attach not allowed" in run.stderr:
        pytest.skip("cross-memory attach is not allowed here")
    assert run.returncode == 0, run.stderr
    ways = re.findall(r"256 KiB  (\S+) +([\d.]+) us", run.stdout)
    assert [w for w, _ in ways] == ["pull", "push", "push-whole"], run.stdout
    assert all(float(t) > 0 for _, t in ways)


def test_window_model_checks_and_times_each_way(tmp_path):
    # perf/window_model.c: the 2-rank allreduce of window arrays, whole and part by part.
    run = _run_model(tmp_path, "window_model", "0.25")
    if run is None:
        return
    assert run.returncode == 0, run.stderr
    ways = re.findall(r"256 KiB  (\S+) +([\d.]+) us", run.stdout)
    assert [w for w, _ in ways] == ["whole", "parts"], run.stdout
    assert all(float(t) > 0 for _, t in ways)
    bad = subprocess.run([str(tmp_path / "window_model"), "0"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "at least 32 KiB" in bad.stderr
