"""Pinning local ranks to cores, the way ``mpirun --bind-to core`` does.

On a machine with few cores, where a rank runs matters more than any code path: two unbound
ranks that the scheduler puts on one core take turns on it, hundreds of microseconds per small
collective, whatever the library. mpirun binds each rank to a core by default when the ranks fit;
the collectx launchers do the same when asked (``launch(..., bind="core")``,
``python -m collectx.run --bind-to core``), so comparisons between them are fair.

Policies: ``"core"`` pins local rank r to the r-th CPU this process may run on, when there are at
least as many such CPUs as ranks (more ranks than CPUs: nothing is pinned, as mpirun refuses to
bind then); ``"none"`` leaves placement to the scheduler.
"""

from __future__ import annotations

import os

from ..errors import ArgumentError

BIND_POLICIES = ("none", "core")


def check_policy(bind: str) -> str:
    """``bind`` itself when it names a policy, else :class:`ArgumentError`.

    >>> check_policy("core")
    'core'
    """
    if bind not in BIND_POLICIES:
        raise ArgumentError(f"bind={bind!r}: expected one of {', '.join(BIND_POLICIES)}")
    return bind


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, in increasing order."""
    return sorted(os.sched_getaffinity(0))


def effective_policy(bind: str, nranks: int, cpus: list[int] | None = None) -> str:
    """What ``bind`` amounts to for ``nranks`` local ranks: "core" only when they fit.

    >>> effective_policy("core", 2, [0, 1]), effective_policy("core", 4, [0, 1])
    ('core', 'none')
    """
    cpus = allowed_cpus() if cpus is None else cpus
    return "core" if check_policy(bind) == "core" and nranks <= len(cpus) else "none"


def core_for(rank: int, nranks: int, bind: str, cpus: list[int] | None = None) -> int | None:
    """The CPU local rank ``rank`` of ``nranks`` is pinned to under ``bind`` (None: unpinned).

    >>> core_for(1, 2, "core", [4, 5]), core_for(1, 3, "core", [4, 5]), core_for(1, 2, "none")
    (5, None, None)
    """
    cpus = allowed_cpus() if cpus is None else cpus
    if effective_policy(bind, nranks, cpus) != "core":
        return None
    return cpus[rank]


def bind_process(rank: int, nranks: int, bind: str, pid: int = 0) -> int | None:
    """Pin process ``pid`` (0: this one) as local rank ``rank`` of ``nranks``; the CPU, or None."""
    cpu = core_for(rank, nranks, bind)
    if cpu is not None:
        os.sched_setaffinity(pid, {cpu})
    return cpu
