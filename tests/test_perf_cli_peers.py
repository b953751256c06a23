"""collectx-perf --compare: peers that are missing are skipped with a hint; present ones run."""

import io
import shutil

import pytest

import _needs as needs

from collectx.perf import driver, peers
from collectx.perf.options import parse_args
from collectx.perf.sweep import run_sweep
from collectx.perf.threadcomm import run_threads

SPEC = {"collectives": ("allreduce", "allgather", "sendrecv"), "sizes": (8, 4096),
        "dtype": "float32", "op": "sum", "root": 0, "iters": 1, "warmup": 0, "check": 1,
        "progress": False}


def test_mpi_is_skipped_with_the_install_hint_when_mpirun_is_missing(monkeypatch):
    monkeypatch.setattr(peers.shutil, "which", lambda name: None)
    got = peers.run_peer("mpi", SPEC, 2)
    assert got.rows is None and "mpirun not found" in got.skipped
    assert "pip install collectx[mpi]" in got.hint
    assert "apt-get install openmpi-bin libopenmpi-dev" in got.hint


def test_mpi_is_skipped_when_mpi4py_is_missing(monkeypatch):
    monkeypatch.setattr(peers.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(peers, "_has_module", lambda name: name != "mpi4py")
    got = peers.run_peer("mpi", SPEC, 2)
    assert got.skipped == "mpi4py is not installed" and "collectx[mpi]" in got.hint


def test_gloo_is_skipped_when_torch_is_missing(monkeypatch):
    monkeypatch.setattr(peers, "_has_module", lambda name: name != "torch")
    got = peers.run_peer("gloo", SPEC, 2)
    assert got.skipped == "torch is not installed" and got.hint == "pip install collectx[torch]"


def test_mpi_has_no_half_precision(monkeypatch):
    monkeypatch.setattr(peers.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(peers, "_has_module", lambda name: True)
    got = peers.run_peer("mpi", dict(SPEC, dtype="bfloat16"), 2)
    assert got.rows is None and "bfloat16" in got.skipped


def test_nccl_without_a_gpu_is_skipped(monkeypatch):
    monkeypatch.setattr(peers, "_has_module", lambda name: True)   # torch or not, here
    monkeypatch.setattr(peers, "_nccl_missing", lambda n: "no CUDA GPU visible to torch")
    got = peers.run_peer("nccl", SPEC, 2)
    assert got.rows is None and "no CUDA GPU" in got.skipped and "GPU" in got.hint


def test_a_skipped_peer_never_fails_the_run(monkeypatch):
    monkeypatch.setattr(peers.shutil, "which", lambda name: None)
    monkeypatch.setattr(peers, "_has_module", lambda name: False)
    out = io.StringIO()
    opts = parse_args(["--compare", "mpi,gloo", "-b", "8", "-e", "8", "-I", "1", "-w", "0",
                       "--no-progress"])
    status = driver.run_measured(opts, out=out,
                                 launch=lambda fn, n, args, bind: run_threads(run_sweep, n, args))
    text = out.getvalue()
    assert status == 0
    assert "# peer mpi skipped: mpirun not found on PATH; install: pip install collectx[mpi]" in text
    assert "# peer gloo skipped: torch is not installed; install: pip install collectx[torch]" in text


def test_worker_output_is_parsed_and_failures_become_skips():
    ok = peers.parse_json_lines("mpi", 'banner\n{"row": {"size": 8}}\n{"done": true}\n', 0)
    assert ok.rows == [{"size": 8}]
    bad = peers.parse_json_lines("mpi", '{"error": "CommError: boom"}\n', 1)
    assert bad.rows is None and "boom" in bad.skipped
    crashed = peers.parse_json_lines("gloo", '{"row": {"size": 8}}\n', 134, "Segfault\n")
    assert crashed.rows is None and crashed.skipped == "gloo run failed: Segfault"


def _all_right(result):
    assert result.skipped is None, result.skipped
    cells = [r[v] for r in result.rows for v in ("oop", "ip") if r[v]]
    assert cells and all(c["wrong"] == 0 and c["busbw"] >= 0 for c in cells)
    assert {r["collective"] for r in result.rows} == set(SPEC["collectives"])


@pytest.mark.mpi
@pytest.mark.skipif(not (shutil.which("mpirun") and peers._has_module("mpi4py")),
                    reason=needs.reason("mpi4py"))
def test_open_mpi_runs_the_identical_sweep_of_every_collective():
    every = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall",
             "sendrecv")
    spec = dict(SPEC, collectives=every, op="avg", root=2)  # avg: emulated; root 2: in-place reduce
    result = peers.run_peer("mpi", spec, 3)
    assert result.skipped is None, result.skipped
    assert {r["collective"] for r in result.rows} == set(every)
    assert all(r[v]["wrong"] == 0 for r in result.rows for v in ("oop", "ip") if r[v])


@pytest.mark.skipif(not peers._has_module("torch"), reason=needs.reason("torch"))
def test_gloo_runs_the_identical_sweep_in_bfloat16():
    _all_right(peers.run_peer("gloo", dict(SPEC, dtype="bfloat16"), 2))
