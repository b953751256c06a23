"""Yama's ptrace_scope 1: ranks let their peers read them across processes while a window that
uses cross-memory attach is open, and restore the policy after."""

import errno
import sys

import pytest

from collectx.runtime import peer_reads
from collectx.runtime.store import HashStore
from collectx.runtime.window import Window

from _threads import on_threads


class FakeLib:
    """Records cx_exec_allow_peer_reads calls; answers `status`."""

    def __init__(self, status=0):
        self.calls, self.status = [], status

    def cx_exec_allow_peer_reads(self, allow):
        self.calls.append(allow)
        return self.status


@pytest.fixture
def scope(tmp_path, monkeypatch):
    """Point the module at a fake ptrace_scope file; returns a setter for its value."""
    path = tmp_path / "ptrace_scope"
    monkeypatch.setattr(peer_reads, "YAMA_SCOPE", str(path))

    def set_scope(value):
        path.write_text(f"{value}\n")
    return set_scope


@pytest.fixture
def lib(monkeypatch):
    fake = FakeLib()
    monkeypatch.setattr(peer_reads, "native", lambda: (None, fake))
    return fake


def test_yama_scope_reads_the_value_or_none(scope, tmp_path):
    assert peer_reads.yama_scope() is None  # the fake file does not exist yet: no Yama
    scope(1)
    assert peer_reads.yama_scope() == 1
    assert peer_reads.yama_scope(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("value", [0, 2, 3])
def test_only_scope_1_is_lifted(scope, lib, value):
    scope(value)
    assert not peer_reads.open_to_peers()
    assert lib.calls == []


def test_the_last_holder_restores_the_policy(scope, lib):
    scope(1)
    assert peer_reads.open_to_peers() and peer_reads.open_to_peers()
    assert lib.calls == [1]
    peer_reads.close_to_peers()
    assert lib.calls == [1]
    peer_reads.close_to_peers()
    assert lib.calls == [1, 0]


def test_a_refused_prctl_leaves_nothing_to_undo(scope, monkeypatch):
    scope(1)
    fake = FakeLib(status=errno.EPERM)
    monkeypatch.setattr(peer_reads, "native", lambda: (None, fake))
    assert not peer_reads.open_to_peers()
    assert fake.calls == [1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_native_call_sets_and_clears_the_ptracer():
    lib = peer_reads.native()[1]
    # EINVAL: a kernel without Yama has no such prctl option (this is not an error for us)
    assert lib.cx_exec_allow_peer_reads(1) in (0, errno.EINVAL)
    assert lib.cx_exec_allow_peer_reads(0) in (0, errno.EINVAL)


def _windows(nranks, cma):
    """nranks Windows of one communicator, made by threads of this process (CMA between them
    reads this process's own memory, so the probe passes wherever CMA works at all)."""
    store = HashStore()
    made, errors = on_threads(nranks, lambda r: Window(r, nranks, store, "w", 1 << 20, 10.0,
                                                       cma=cma))
    for w in made:
        if w is not None and any(errors):
            w.close()
    for e in errors:
        if e is not None:
            raise e
    return made


def test_windows_hold_the_policy_lifted_while_open(scope, lib):
    scope(1)
    windows = _windows(2, cma=True)
    try:
        # where CMA does not work at all the windows undo it at once and stage instead
        assert lib.calls == ([1] if windows[0].cma else [1, 0])
    finally:
        windows[0].close()
        assert lib.calls == ([1] if windows[0].cma else [1, 0])
        windows[1].close()
        windows[1].close()  # idempotent: one undo per window
    assert lib.calls == [1, 0]


def test_windows_without_cma_leave_the_policy_alone(scope, lib):
    scope(1)
    for w in _windows(2, cma=False):
        w.close()
    assert lib.calls == []
