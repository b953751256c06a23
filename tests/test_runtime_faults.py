"""Reliability: dead peers, mismatched calls, missing ranks, bad arguments, shm hygiene."""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import pytest

import _runtime_fault_workers as F
import collectx
from collectx.errors import RankFailed
from collectx.runtime import window

# A shell that starts a command in the background without job control (``cmd &``, nohup)
# ignores SIGINT in it, and Python then installs no KeyboardInterrupt handler to chain to.
default_sigint = pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
    reason="SIGINT is ignored in this process (started in the background by a shell); run the "
           "tests in the foreground to check Ctrl-C")


def _segments() -> set[str]:
    return {f for f in os.listdir(window.SHM_DIR) if f.startswith(window.PREFIX)}


def test_sigkilled_rank_makes_every_survivor_raise_peer_failure(tmp_path):
    with pytest.raises(RankFailed, match="rank 2 was killed by signal SIGKILL"):
        collectx.launch(F.killed_mid_collective, 4, args=(str(tmp_path), 2), grace=20,
                        timeout=120)
    for r in (0, 1, 3):
        rep = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert rep["error"] == "PeerFailure" and rep["rank"] == 2, rep
        assert rep["seconds"] < 5.0, rep


def test_sigkilled_rank_during_large_calls_read_across_processes(tmp_path):
    # 16 MiB: peers read each other's user buffers across processes (where allowed), and a
    # read of the dead rank's memory must report it as promptly as a wait on its flags.
    with pytest.raises(RankFailed, match="rank 0 was killed by signal SIGKILL"):
        collectx.launch(F.killed_mid_collective, 3, args=(str(tmp_path), 0, 1 << 22), grace=20,
                        timeout=120)
    for r in (1, 2):
        rep = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert rep["error"] == "PeerFailure" and rep["rank"] == 0, rep
        assert rep["seconds"] < 5.0, rep


@pytest.mark.parametrize("kind", ["collective", "dtype", "op", "size", "root"])
def test_mismatched_calls_raise_collective_mismatch_on_every_rank(kind):
    results = collectx.launch(F.mismatched, 3, args=(kind,), timeout=120)
    for r, got in enumerate(results):
        assert got[0] == "CollectiveMismatch", (r, got)
        assert "rank 1:" in got[1] and "rank 0:" in got[1]
        assert got[2] == [6.0] * 4


def test_rank_that_never_arrives_gives_timeout():
    results = collectx.launch(F.never_arrives, 2, args=(1.5,), timeout=120)
    name, seconds = results[0]
    assert name == "Timeout"
    assert 1.4 < seconds < 6.0
    assert results[1] == ["skipped"]


@default_sigint
def test_ctrl_c_ends_a_wait_for_a_peer_that_does_not_come():
    results = collectx.launch(F.signalled_while_waiting, 2, args=("default", 4.0), timeout=120)
    name, seconds, _ = results[0]
    assert name == "KeyboardInterrupt" and 0.9 < seconds < 3.0, results
    # The peer comes later and finds the communicator aborted, not data that may have changed
    assert results[1][0] == "PeerAborted", results


def test_a_handler_that_returns_gets_interrupted_not_a_hang():
    results = collectx.launch(F.signalled_while_waiting, 2, args=("record", 4.0), timeout=120)
    assert results[0][0] == "Interrupted" and results[0][1] < 3.0 and results[0][2] == 1, results
    assert results[1][0] == "PeerAborted", results


def test_a_signal_during_a_call_that_completes_soon_leaves_it_alone():
    # A program that shuts down gracefully on Ctrl-C (finish the step, then exit) keeps working
    # collectives: the call waited under a second and completes; the handler runs after it.
    results = collectx.launch(F.signalled_while_waiting, 2, args=("record", 0.4), timeout=120)
    assert [r[0] for r in results] == ["completed", "completed"], results
    assert results[0][2] == 1, results


def test_a_handler_installed_just_before_a_recv_is_chained_by_the_wait():
    # Calls re-chain at most every 100 ms (two system calls each time); the wait itself re-chains
    # every 10 ms, so the handler installed right after init still sees the wait give up.
    results = collectx.launch(F.signalled_while_waiting, 2, args=("record", 0.0, True),
                              timeout=120)
    assert results[0][0] == "Interrupted" and 0.9 < results[0][1] < 3.0, results
    assert results[0][2] == 1 and results[1][0] == "PeerAborted", results


@default_sigint
def test_ctrl_c_ends_two_ranks_that_both_receive_first():
    results = collectx.launch(F.signalled_while_waiting, 2, args=("default", 0.0, True),
                              timeout=120)
    assert results[0][0] == "KeyboardInterrupt" and results[0][1] < 3.0, results
    assert results[1][0] == "PeerAborted" and results[1][1] < 5.0, results


@default_sigint
def test_the_watch_chains_in_front_of_each_new_python_handler():
    import signal
    from collectx.runtime._lib import native
    lib = native()[1]
    old = signal.getsignal(signal.SIGINT)
    rewatch = 0.15                                       # calls re-chain every 100 ms at most
    try:
        time.sleep(rewatch)
        assert lib.cx_exec_watch_signals() >= 1          # Python's SIGINT handler
        signal.signal(signal.SIGINT, lambda *a: None)    # replaces the chain
        time.sleep(rewatch)
        assert lib.cx_exec_watch_signals() >= 1          # chained again
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # nothing to chain to
        time.sleep(rewatch)
        assert lib.cx_exec_watch_signals() == (1 if callable(signal.getsignal(signal.SIGTERM))
                                               else 0)
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_call_no_peer_will_make_fails_once_the_peer_closes():
    results = collectx.launch(F.extra_call_after_peer_closed, 2, timeout=120)
    name, who, seconds, message = results[0]
    assert (name, who) == ("PeerAborted", 1) and seconds < 3.0, results
    assert "closed the communicator" in message
    assert results[1] == ["closed"]


def test_bad_arguments_on_one_rank_abort_the_call_on_its_peers():
    results = collectx.launch(F.bad_args_on_one_rank, 3, timeout=120)
    assert results[1][0] == "ArgumentError" and results[1][3] is True
    for r in (0, 2):
        name, who, seconds, _ = results[r][:4]
        assert (name, who) == ("PeerAborted", 1)
        assert seconds < 5.0
    assert all(res[-1] == [3.0, 3.0, 3.0] for res in results)


def test_no_segments_left_after_normal_exit_and_exception():
    before = _segments()
    assert collectx.launch(F.mismatched, 2, args=("op",), timeout=120)
    with pytest.raises(RankFailed, match="KeyError") as info:
        collectx.launch(F.raise_after_init, 2, timeout=120)
    assert info.value.exc_type == "KeyError" and "boom" in info.value.remote_traceback
    assert _segments() <= before


@pytest.mark.parametrize("stage", ["setup", "after_init"])
def test_no_segments_left_when_every_rank_is_sigkilled(stage):
    before = _segments()
    with pytest.raises(RankFailed, match="SIGKILL"):
        collectx.launch(F.sigkill_all, 2, args=(stage,), grace=5, timeout=120)
    assert _segments() <= before


def test_stale_segment_of_a_dead_process_is_swept(tmp_path):
    import subprocess
    dead = subprocess.run(["true"]).returncode == 0 and _dead_pid()
    name = f"{window.PREFIX}{dead}-00ff"
    fd = os.open(os.path.join(window.SHM_DIR, name), os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    assert name in window.sweep_stale()
    assert name not in _segments()


def test_segments_are_private_to_the_user():
    name, mm, fd = window._create_segment(8192)
    os.close(fd)
    try:
        mode = os.stat(os.path.join(window.SHM_DIR, name)).st_mode
        assert stat.S_IMODE(mode) == 0o600
        assert name.startswith(f"{window.PREFIX}{os.getpid()}-") and len(name) > 30
    finally:
        os.unlink(os.path.join(window.SHM_DIR, name))
        mm.close()


def _dead_pid() -> int:
    import subprocess
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_rank_reaped_before_its_pipe_is_read_is_still_reported(monkeypatch):
    # The last rank's exit can be seen before its pipe's end of file: the launcher must read
    # the pipe still, and report the death, not fail on the missing result.
    from collectx.runtime import launcher

    class Proc:
        sentinel, exitcode = object(), -signal.SIGKILL

        def join(self, timeout=None):
            pass

    class Conn:
        def poll(self):
            return True   # its end of file is there, but not in the first wait's answer

        def recv_bytes(self):
            raise EOFError

    proc, conn = Proc(), Conn()
    answers = iter([[proc.sentinel], [conn]])
    monkeypatch.setattr(launcher, "mp_wait", lambda objs, timeout: next(answers, []))
    with pytest.raises(RankFailed, match="rank 0 was killed by signal SIGKILL"):
        launcher._collect([proc], [conn], grace=1.0, timeout=10.0)
