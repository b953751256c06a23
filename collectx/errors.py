"""The one tree of collectx exceptions.

Every error collectx raises derives from :class:`CollectXError`. Where Python has a natural base
(bad arguments are ``ValueError``/``TypeError``, timeouts are ``TimeoutError``), the collectx class
inherits from it too, so ``except ValueError`` keeps working for callers that do not know collectx.
Messages say what was seen, what was expected, and the fix.
"""

from __future__ import annotations

import numbers


class CollectXError(Exception):
    """Root of every collectx error."""


class ConfigError(CollectXError, ValueError):
    """A ``COLLECTX_*`` setting or option has a value collectx cannot use."""


class ArgumentError(CollectXError, ValueError):
    """A call got an argument it cannot use (wrong size, layout, overlap, ...)."""


class DTypeError(CollectXError, TypeError):
    """A dtype or reduction op that collectx does not support for this call."""


class TopologyError(CollectXError, ValueError):
    """A topology could not be read, or does not describe what was asked of it."""


class PlanError(CollectXError, ValueError):
    """A plan was asked for something the planner cannot produce."""


class NoFeasiblePlan(PlanError):
    """No algorithm can serve this collective on this allocation (e.g. it is disconnected)."""


class ScheduleError(CollectXError, ValueError):
    """A schedule is malformed or fails verification; names the first bad instruction."""


class MalformedSchedule(ScheduleError):
    """A schedule names a buffer, chunk, rank or dependency that does not exist, or mismatches."""


class DependencyCycle(ScheduleError):
    """The schedule's dependencies (explicit and lane order) form a cycle: it would deadlock."""


class ReadBeforeWrite(ScheduleError):
    """An instruction reads a chunk before (or not ordered after) the write that fills it."""


class DataRace(ScheduleError):
    """Two unordered instructions touch one chunk and one of them writes it (WAW or WAR)."""


class WrongResult(ScheduleError):
    """The schedule runs but leaves an output chunk without the collective's contributions."""


class NativeError(CollectXError, RuntimeError):
    """The native library returned a failure status."""

    def __init__(self, message: str, code: int = -1):
        super().__init__(message)
        self.code = code


class NativeUnavailable(NativeError):
    """The native library could not be found or loaded."""


class CudaUnavailable(NativeUnavailable):
    """No usable CUDA: the library lacks CUDA objects, or no driver or GPU is visible."""


class CudaError(NativeError):
    """A CUDA runtime call failed; the message carries the runtime's error text."""


class CommError(CollectXError, RuntimeError):
    """A collective failed while running. ``RuntimeError`` so torch users see what they expect."""


class Timeout(CommError, TimeoutError):
    """A collective did not complete within ``COLLECTX_TIMEOUT`` seconds."""


class PeerFailure(CommError):
    """A peer process died during a collective; ``rank`` names it."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


class PeerAborted(CommError):
    """A peer gave up on the collective (bad arguments or an error there) and told us so."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


class Interrupted(CommError):
    """A signal (Ctrl-C, SIGTERM) came while a collective had waited a second or more; the
    communicator is aborted, and its peers raise PeerAborted."""


class CollectiveMismatch(CommError):
    """Ranks called different collectives, dtypes, ops, sizes or roots."""


class RankFailed(CommError):
    """A rank started by collectx.launch / collectx.run failed; carries its remote traceback."""

    def __init__(self, message: str, rank: int | None = None, exc_type: str = "",
                 remote_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback


class EngineError(CommError):
    """The inter-node engine (MPI, torch.distributed, NCCL) failed."""


def command_error(exc: BaseException) -> str | None:
    """What a command prints for ``exc`` after ``error:``: a CollectXError's message, or for a
    file the user named that cannot be read or written (``--json``, ``--draw``, ...) which and
    why; None for anything else, which is a bug and should raise.

    >>> command_error(FileNotFoundError(2, "No such file or directory", "/no/dir/plan.xml"))
    "'/no/dir/plan.xml': No such file or directory; expected a path this process can write or read"
    """
    if isinstance(exc, CollectXError):
        return str(exc)
    if isinstance(exc, OSError) and exc.filename is not None:
        return (f"{str(exc.filename)!r}: {exc.strerror or exc}; expected a path this process can "
                f"write or read")
    return None


def integral(value) -> int | None:
    """``value`` as an int where it is a whole number (a Python or numpy integer), else None.
    Python counts a bool as an int, but ``True`` is never meant as a size, a count or an index,
    so it is None too: callers refuse it as they refuse ``2.0``.

    >>> import numpy as np
    >>> integral(3), integral(np.int64(3)), integral(True), integral(2.0), integral("3")
    (3, 3, None, None, None)
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


__all__ = [name for name, obj in dict(globals()).items()
           if isinstance(obj, type) and issubclass(obj, CollectXError)]
