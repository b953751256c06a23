"""collectx.launch and python -m collectx.run: environment, results, failures, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import _needs as needs

import _launcher_workers as L
import collectx
from collectx.errors import ArgumentError, CommError, RankFailed
from collectx.runtime import bootstrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_launch_returns_results_by_rank_and_removes_the_rendezvous_dir():
    got = collectx.launch(L.whoami, 3, args=("t",), timeout=120)
    assert got == [(0, 3, "t", True), (1, 3, "t", True), (2, 3, "t", True)]
    assert not os.path.exists(collectx.launch(L.rdzv_dir, 1, timeout=120)[0])


def test_first_failure_is_reraised_with_rank_and_remote_traceback_and_others_are_stopped():
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as info:
        collectx.launch(L.fail_on_rank, 3, args=(1,), grace=0.5, timeout=120)
    err = info.value
    assert isinstance(err, CommError) and err.rank == 1 and err.exc_type == "ZeroDivisionError"
    assert "divides by zero" in str(err) and "fail_on_rank" in err.remote_traceback
    assert isinstance(err.__cause__, ZeroDivisionError)
    assert time.monotonic() - t0 < 40   # not the 60 s the other ranks would sleep


def test_init_again_in_a_rank_makes_a_new_communicator():
    # a second init() used to count its store keys from the first's again and map its
    # (unlinked) segments: FileNotFoundError
    assert collectx.launch(L.init_again, 3, timeout=120) == [[6.0, 60.0, 3]] * 3


def test_a_second_torch_bootstrap_reuses_the_launcher_store(monkeypatch):
    needs.module("torch.distributed")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    for k in ("COLLECTX_RANK", "COLLECTX_RDZV_DIR", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(bootstrap, "_LAUNCHER_STORES", {})
    first = bootstrap.bootstrap(None, None, None, 10.0)
    again = bootstrap.bootstrap(None, None, None, 10.0)   # a second server would not bind
    assert first[:2] == again[:2] == (0, 1) and again[2] is first[2]


@pytest.mark.parametrize("call, match", [
    (lambda: collectx.launch(L.whoami, 0), "nprocs=0"),
    (lambda: collectx.launch(L.whoami, True), "nprocs=True"),
    (lambda: collectx.launch(3, 2), "expected a callable"),
    (lambda: collectx.launch(L.whoami, 2, args=5), "args=5"),
    (lambda: collectx.launch(L.whoami, 2, args=("t",), timeout=-5), "timeout=-5"),
    (lambda: collectx.launch(L.whoami, 2, args=("t",), grace="long"), "grace='long'"),
    (lambda: collectx.launch(lambda: 1, 2), "define fn at module level"),
])
def test_launch_refuses_a_bad_call_before_starting_ranks(call, match):
    with pytest.raises(ArgumentError, match=match):
        call()


def test_launch_binds_rank_r_to_the_rth_allowed_cpu_when_asked_and_the_ranks_fit():
    cpus = sorted(os.sched_getaffinity(0))
    n = min(2, len(cpus))
    assert collectx.launch(L.affinity, n, bind="core", timeout=120) == [[c] for c in cpus[:n]]
    assert collectx.launch(L.affinity, n, timeout=120) == [cpus] * n       # default: unbound
    # more ranks than CPUs: nothing is pinned (mpirun refuses to bind then)
    over = len(cpus) + 1
    assert collectx.launch(L.affinity, over, bind="core", timeout=120) == [cpus] * over


def test_launch_rejects_an_unknown_binding_before_starting_ranks():
    with pytest.raises(ArgumentError, match="bind='socket'"):
        collectx.launch(L.whoami, 1, args=("t",), bind="socket")


def test_detect_reads_the_launcher_from_the_environment():
    assert bootstrap.detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h",
                             "MASTER_PORT": "1"}) == "torch"
    assert bootstrap.detect({"SLURM_PROCID": "3"}) == "mpi"
    assert bootstrap.detect({"PMI_RANK": "0"}) == "mpi"


SCRIPT = textwrap.dedent("""
    import sys, numpy as np, collectx
    comm = collectx.init()
    x = np.full(3, comm.rank + 1.0)
    comm.allreduce(x)
    print(f"rank {comm.rank}/{comm.size} sum {x[0]:g} args {sys.argv[1:]}", flush=True)
    if "fail" in sys.argv and comm.rank == 1:
        sys.exit(7)
    if "hang" in sys.argv:
        import time; time.sleep(60)
    comm.close()
""")


def _run(tmp_path, opts, script_args=(), **kw):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.Popen([sys.executable, "-m", "collectx.run", *opts, str(script),
                             *script_args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kw)


def test_run_cli_starts_n_ranks_that_find_each_other(tmp_path):
    p = _run(tmp_path, ["-n", "3"])
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    # ranks share one pipe, so their lines may interleave: look for each one's report
    for r in range(3):
        assert f"rank {r}/3 sum 6 args []" in out


def test_run_cli_bind_to_core_pins_each_rank(tmp_path):
    script = tmp_path / "where.py"
    # one os.write per rank: a line under PIPE_BUF reaches the shared pipe whole, where print
    # may split it into several writes (it does when PYTHONUNBUFFERED is set)
    script.write_text("import os; os.write(1, (os.environ['COLLECTX_RANK'] + ' ' + "
                      "str(sorted(os.sched_getaffinity(0))) + '\\n').encode())\n")
    cpus = sorted(os.sched_getaffinity(0))
    n = min(2, len(cpus))
    p = subprocess.run([sys.executable, "-m", "collectx.run", "-n", str(n), "--bind-to", "core",
                        str(script)], env={**os.environ, "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == [f"{r} [{cpus[r]}]" for r in range(n)]


def test_run_cli_returns_the_failing_rank_status(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    p = subprocess.run([sys.executable, "-m", "collectx.run", "-n", "2", "--grace", "1",
                        str(script), "fail"], env={**os.environ, "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 7
    assert "rank 1 failed (exit status 7)" in p.stderr


def test_run_cli_forwards_sigterm_to_the_ranks(tmp_path):
    p = _run(tmp_path, ["-n", "2"], ["hang"], start_new_session=True)
    deadline = time.monotonic() + 120
    line = p.stdout.readline()        # a rank got through allreduce: the group is up
    assert line.startswith("rank"), p.stderr.read()
    assert time.monotonic() < deadline
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert p.returncode != 0


def test_rendezvous_directories_of_dead_processes_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    left = tmp_path / f"collectx-host-{dead}-abc"       # its creator died before closing
    mine = tmp_path / f"collectx-rdzv-{os.getpid()}-abc"
    other = tmp_path / "collectx-host-notapid"
    for d in (left, mine, other):
        d.mkdir()
        (d / "key").write_text("x")
    assert bootstrap.sweep_rendezvous(str(tmp_path)) == [str(left)]
    assert not left.exists() and mine.exists() and other.exists()

