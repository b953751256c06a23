"""Bandwidth metrics with nccl-tests conventions: algorithm bandwidth and bus bandwidth.

``algbw = nbytes / time`` and ``busbw = algbw * bus_factor``. The factor turns the algorithm
bandwidth into the bandwidth each rank's busiest link must sustain in an optimal algorithm, so
numbers are comparable across rank counts and collectives (nccl-tests ``doc/PERFORMANCE.md``).

``nbytes`` follows nccl-tests too: allreduce, broadcast, reduce and sendrecv count the buffer;
allgather counts the full *output*; reduce_scatter the full *input*; alltoall the full buffer of
one rank. Bandwidths are in GB/s with GB = 1e9 bytes.

>>> bus_factor("allreduce", 8)
1.75
>>> busbw("allgather", 4, nbytes=4_000_000_000, seconds=1.0)
3.0
"""

from __future__ import annotations

from ..errors import ArgumentError
from .ir import COLLECTIVES

# Collectives whose nccl-tests byte count spans all ranks' slots, so one payload unit (one rank's
# share, see ir.buffer_units) is nbytes / nranks.
_SPLIT_COLLECTIVES = ("allgather", "reduce_scatter", "alltoall")


def _check(collective: str, nranks: int) -> None:
    if collective not in COLLECTIVES:
        raise ArgumentError(f"unknown collective {collective!r}; expected one of "
                            f"{', '.join(COLLECTIVES)}")
    if nranks < 1:
        raise ArgumentError(f"nranks={nranks}: expected at least 1 rank")


def bus_factor(collective: str, nranks: int) -> float:
    """Factor from algorithm bandwidth to bus bandwidth, as nccl-tests defines it.

    Parameters
    ----------
    collective : str
        One of :data:`collectx.schedule.COLLECTIVES`.
    nranks : int
        Number of ranks taking part (>= 1).

    Returns
    -------
    float
        ``2(n-1)/n`` for allreduce; ``(n-1)/n`` for allgather, reduce_scatter, alltoall;
        ``1`` for broadcast, reduce, sendrecv. A single rank moves nothing over the bus, so the
        ``(n-1)`` formulas give 0 there, as nccl-tests reports.

    Examples
    --------
    >>> bus_factor("reduce_scatter", 4), bus_factor("broadcast", 4), bus_factor("allreduce", 1)
    (0.75, 1.0, 0.0)
    """
    _check(collective, nranks)
    if collective == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if collective in _SPLIT_COLLECTIVES:
        return (nranks - 1) / nranks
    return 1.0


def unit_bytes(collective: str, nbytes: float, nranks: int) -> float:
    """Bytes in one payload unit (one rank's share) for an nccl-tests byte count.

    Parameters
    ----------
    collective : str
        The collective.
    nbytes : float
        Message size as nccl-tests counts it (allgather: full output; reduce_scatter: full
        input; alltoall: full buffer of one rank; otherwise the buffer).
    nranks : int
        Number of ranks.

    Returns
    -------
    float
        ``nbytes / nranks`` for allgather, reduce_scatter and alltoall, ``nbytes`` otherwise.
        Multiply by a buffer's :func:`~collectx.schedule.buffer_units` to get its size.

    Examples
    --------
    >>> unit_bytes("allgather", 1024, 4), unit_bytes("allreduce", 1024, 4)
    (256.0, 1024.0)
    """
    _check(collective, nranks)
    if nbytes < 0:
        raise ArgumentError(f"nbytes={nbytes}: expected a size >= 0")
    if collective in _SPLIT_COLLECTIVES:
        return nbytes / nranks
    return float(nbytes)


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: ``nbytes / seconds / 1e9`` (0 for a zero-length time).

    >>> algbw(2e9, 0.5)
    4.0
    """
    if seconds < 0:
        raise ArgumentError(f"seconds={seconds}: expected a duration >= 0")
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw(collective: str, nranks: int, nbytes: float, seconds: float) -> float:
    """Bus bandwidth in GB/s: :func:`algbw` times :func:`bus_factor`.

    >>> busbw("allreduce", 2, nbytes=1e9, seconds=1.0)
    1.0
    """
    return algbw(nbytes, seconds) * bus_factor(collective, nranks)
