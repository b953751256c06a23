"""COLLECTX_DEBUG: the lines a run writes at WARN, INFO and TRACE."""

import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import collectx
from collectx import log
from collectx.runtime import segment, window as window_mod
from collectx.runtime.segment import Layout
from collectx.runtime.store import HashStore
from collectx.runtime.window import Window

from _threads import on_threads


@pytest.fixture
def records(caplog):
    caplog.set_level(log.TRACE, logger="collectx")
    yield caplog
    logging.getLogger("collectx").setLevel(logging.NOTSET)


def _threads(nranks, fn):
    """fn(rank) on nranks threads; their results, re-raising the first error."""
    results, errors = on_threads(nranks, fn)
    for e in errors:
        if e is not None:
            raise e
    return results


def _messages(caplog, level):
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_cut_window_and_a_refused_cma_are_warnings(records, monkeypatch):
    monkeypatch.setattr(window_mod, "shm_free", lambda path: 4 * Layout.of(4 << 20, 2).total)
    monkeypatch.setattr(segment, "_held", set())   # windows other tests left open
    monkeypatch.setattr(Window, "_probe_cma", lambda self, *a: False)
    store = HashStore()
    windows = _threads(2, lambda r: Window(r, 2, store, "w", 64 << 20, 10.0, cma=True))
    for w in windows:
        w.close()
    warned = _messages(records, logging.WARNING)
    assert len(warned) == 2   # rank 0 only
    assert "shared windows cut from 64.0 MiB to 4.0 MiB per rank to fit /dev/shm" in warned[0]
    assert "may not read each other's memory" in warned[1]
    info = _messages(records, logging.INFO)
    assert sorted(m.split(":")[0] for m in info) == ["rank 0/2", "rank 1/2"]
    assert all("peers read large buffers from staged copies" in m for m in info)


def test_info_names_each_schedule_once_and_trace_every_call(records):
    store = HashStore()

    def rank_fn(rank):
        with collectx.init(rank, 2, store=store) as comm:
            x = np.ones(1 << 16, np.float32)
            for _ in range(3):
                comm.allreduce(x)
            return comm._fast is not None and comm._fast.__name__ == "_decline"
    declined = _threads(2, rank_fn)
    plans = [m for m in _messages(records, logging.INFO) if "schedule" in m]
    assert len(plans) == 1 and plans[0].startswith("rank 0/2: allreduce of 262144-524287 bytes")
    calls = _messages(records, log.TRACE)
    assert len(calls) == 6 and all("allreduce count=65536 dtype=float32 op=sum" in m
                                   for m in calls)
    assert declined == [True, True]   # under TRACE no call takes the compiled path


def test_collectx_debug_writes_to_stderr():
    code = ("import collectx, numpy as np\n"
            "with collectx.init() as c: c.allreduce(np.ones(4, np.float32))\n")
    env = dict(os.environ, COLLECTX_DEBUG="INFO")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert re.search(r"collectx INFO rank 0/1: window [0-9.]+ MiB", run.stderr), run.stderr
    env["COLLECTX_DEBUG"] = ""
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120)
    assert quiet.returncode == 0 and "collectx" not in quiet.stderr
