"""The machine probe that perf/compare_cpu.py prints beside each benchmark round."""

import importlib.util
import os
from pathlib import Path


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
