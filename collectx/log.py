"""``COLLECTX_DEBUG``: what collectx chose and did, on stderr, in the spirit of ``NCCL_DEBUG``.

* ``WARN``: choices that cost speed or room: a shared window cut to fit /dev/shm; ranks that may
  not read each other's memory, so every large buffer goes through staged copies.
* ``INFO``: also each rank's window and transport as its communicator starts, and the schedule
  chosen the first time a collective of a size class runs, planned or read from the plan cache
  and in how long (rank 0 only: it plans, the other ranks receive its schedule).
* ``TRACE``: also every collective call. Repeated calls otherwise take a compiled path that
  never comes back to Python; under TRACE every call takes the checked path, which is slower.

Records go to the standard ``logging.getLogger("collectx")``, which an application may also
configure itself; ``COLLECTX_DEBUG`` adds a handler that writes lines such as
``myhost:4242 collectx INFO rank 0/2: window 64.0 MiB ...`` to stderr.

>>> configure("")          # unset: logging stays as the application set it
>>> tracing()
False
"""

from __future__ import annotations

import logging
import socket
import sys

TRACE = 5
logging.addLevelName(TRACE, "TRACE")

logger = logging.getLogger("collectx")
logger.addHandler(logging.NullHandler())  # silent unless asked, as a library should be
_LEVELS = {"WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": TRACE}
_handler: logging.Handler | None = None


def configure(level: str) -> None:
    """Write collectx's records at ``level`` ("WARN", "INFO" or "TRACE") and above to stderr;
    "" changes nothing. ``collectx.init`` calls it with ``COLLECTX_DEBUG``; idempotent."""
    global _handler
    if not level:
        return
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        host = socket.gethostname().split(".")[0]
        _handler.setFormatter(logging.Formatter(f"{host}:%(process)d collectx %(levelname)s "
                                                f"%(message)s"))
        logger.addHandler(_handler)
    logger.setLevel(_LEVELS[level])


def tracing() -> bool:
    """Whether every call is logged (calls then skip the compiled fast path)."""
    return logger.isEnabledFor(TRACE)


def mib(n: int) -> str:
    """Bytes as MiB for messages.

    >>> mib(3 << 19)
    '1.5 MiB'
    """
    return f"{n / (1 << 20):.1f} MiB"
