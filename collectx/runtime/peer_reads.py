"""Letting sibling ranks read this process's memory under Yama's ptrace_scope 1.

Cross-memory attach (``process_vm_readv``) needs the reader to be allowed to ptrace the
owner. Yama's ``ptrace_scope`` 1, Ubuntu's default, allows that only toward the reader's own
descendants: ranks started side by side (by the launcher, torchrun or mpirun) are siblings and
would fall back to staging every large buffer through the window. A 2-rank allreduce of numpy
arrays takes 1.8-2.3x as long from 256 KiB to 16 MiB that way, and 1.4x at 64 MiB
(``perf/compare_cpu.py --staged``): 0.95-1.15x Open MPI's speed at 2-16 MiB, while Open MPI
lifts the restriction for itself. A process may name who reads it (``PR_SET_PTRACER``); only
one pid can be named and a rank has several peers, so a rank names any process of its user, as
Open MPI's shared-memory transport does. It does so only while a window that wants
cross-memory attach is open, and only under scope 1: scope 0 needs nothing, scopes 2 and 3
ignore the exception. ``COLLECTX_CMA=0`` leaves the setting alone.

>>> open_to_peers(scope_file="/nonexistent")   # no Yama: nothing to lift
False
"""

from __future__ import annotations

import threading

from ._lib import native

YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"

_lock = threading.Lock()
_holders = 0  # open windows that lifted the restriction; the last one to close restores it


def yama_scope(scope_file: str | None = None) -> int | None:
    """Yama's ptrace_scope (0-3), or None where the kernel has no Yama."""
    try:
        with open(scope_file or YAMA_SCOPE) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None


def open_to_peers(scope_file: str | None = None) -> bool:
    """Let any process of this user read this one while the caller needs it; True when the
    caller must call :func:`close_to_peers` once done (the restriction was lifted for it)."""
    global _holders
    if yama_scope(scope_file) != 1:
        return False
    with _lock:
        if _holders == 0 and native()[1].cx_exec_allow_peer_reads(1) != 0:
            return False  # e.g. a seccomp filter forbids prctl: peers read staged copies
        _holders += 1
    return True


def close_to_peers() -> None:
    """Undo one :func:`open_to_peers` that returned True; the last one restores the policy."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0:
            native()[1].cx_exec_allow_peer_reads(0)
