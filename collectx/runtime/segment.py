"""The size of a rank's shared-memory segment, and a window that fits a small /dev/shm.

A segment (``window.py`` has the picture) is a control block, two staging sets, the
point-to-point area and a heap for ``Communicator.empty``. It is created sparse, and tmpfs
allocates a page when it is first written: a segment bigger than the room left in /dev/shm
maps fine and kills its rank with SIGBUS much later, on the first write past the room. The
usual case is a container (Docker gives /dev/shm 64 MiB unless told ``--shm-size``), where the
default window is bigger than the whole mount. So rank 0 fits the window to the room before
any rank creates its segment (:func:`fit_window_bytes`): every rank of the machine may fill
its segment, and all of them still fit in half the room. The other half is left to whatever
comes next: another communicator (one per torch process group, say), a DataLoader's shared
tensors. Segments the ranks already hold count with what they may still take, not with what
tmpfs has allocated to them so far (:func:`unbacked_bytes`); otherwise a second window would be
fitted to room promised to the first.

>>> Layout.of(1 << 20, 2).total     # 1 MiB, 2 ranks: 16K + 4 x 512K + 4K + 2 x 512K
3166208
>>> fit_window_bytes(64 << 20, size=2, machine_ranks=2, free=64 << 20) / (1 << 20)
6.984375
"""

from __future__ import annotations

import dataclasses
import os

from ..errors import CommError
from ..log import mib

CTL_BYTES = 16384                    # cx_ctl (cx_executor.h) in whole pages
P2P_SLOT_BYTES = 1 << 20             # per peer; send/recv move pieces of half of it
MIN_SET_BYTES = 1 << 16
SHM_SHARE = 2                        # windows take at most 1/SHM_SHARE of the free /dev/shm


def set_bytes_for(window_bytes: int) -> int:
    """Bytes of one staging set for a window budget: half of it, 4 KiB aligned, >= 64 KiB.

    >>> set_bytes_for(1 << 20), set_bytes_for(1000)
    (524288, 65536)
    """
    return max(MIN_SET_BYTES, (int(window_bytes) // 2) & ~4095)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Byte offsets in a rank's segment for a window of ``window_bytes`` among ``size`` ranks.

    A peer's point-to-point slot is P2P_SLOT_BYTES, or a staging set where that is smaller: a
    window cut to fit /dev/shm cuts the slots with it (send/recv then move smaller pieces),
    since with many ranks they would otherwise take most of the room.

    >>> [Layout.of(w, 4).p2p_slot_bytes >> 10 for w in (64 << 20, 1 << 20, 0)]
    [1024, 512, 64]
    """
    set_bytes: int
    p2p_offset: int
    p2p_slot_bytes: int
    heap_offset: int
    heap_bytes: int
    total: int

    @classmethod
    def of(cls, window_bytes: int, size: int) -> "Layout":
        set_bytes = set_bytes_for(window_bytes)
        p2p_offset = CTL_BYTES + 2 * set_bytes
        p2p_header = (size * 128 + 4095) // 4096 * 4096
        slot = min(P2P_SLOT_BYTES, set_bytes)
        heap_offset = p2p_offset + p2p_header + size * slot
        heap_bytes = 2 * set_bytes
        return cls(set_bytes, p2p_offset, slot, heap_offset, heap_bytes, heap_offset + heap_bytes)


def shm_free(shm_dir: str) -> int | None:
    """Bytes that can still be written in ``shm_dir``, or None when it does not say (no such
    directory, or a tmpfs mounted without a size limit)."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if st.f_blocks else None


# This process's own segments, by file descriptor (kept open while the window lives: an
# unlinked tmpfs file still says through fstat how much of it is allocated).
_held: set[int] = set()


def hold(fd: int) -> None:
    """Count the segment open on ``fd`` in :func:`unbacked_bytes` until :func:`release`."""
    _held.add(fd)


def release(fd: int) -> None:
    """Stop counting the segment on ``fd``, and close it."""
    _held.discard(fd)
    os.close(fd)


def unbacked_bytes() -> int:
    """Bytes this process's segments may still take from /dev/shm: their sizes less what
    tmpfs has allocated to them (a page is allocated when first written).

    >>> fd = os.memfd_create("doc"); os.ftruncate(fd, 1 << 20); hold(fd)
    >>> before = unbacked_bytes()
    >>> _ = os.pwrite(fd, b"x" * 4096, 0)      # tmpfs allocates the page written
    >>> before - unbacked_bytes()
    4096
    >>> release(fd)
    """
    total = 0
    for fd in list(_held):
        try:
            st = os.fstat(fd)
        except OSError:   # released by another thread meanwhile
            continue
        total += max(0, st.st_size - st.st_blocks * 512)
    return total


def fit_window_bytes(window_bytes: int, size: int, machine_ranks: int, free: int | None,
                     promised: int = 0) -> int:
    """The largest window up to ``window_bytes`` whose segments, one for each of the
    ``machine_ranks`` ranks of this machine, fit together in 1/SHM_SHARE of the room: ``free``
    bytes less the ``promised`` bytes that segments the ranks already hold may still take.

    Raises :class:`CommError` when not even the smallest window fits.

    >>> fit_window_bytes(64 << 20, size=2, machine_ranks=2, free=None) >> 20   # no limit
    64
    >>> try:
    ...     fit_window_bytes(64 << 20, size=8, machine_ranks=8, free=4 << 20)
    ... except CommError as e:
    ...     print(str(e)[:57])
    /dev/shm has 4.0 MiB free; 8 ranks need at least 12.3 MiB
    """
    share = max(0, free - promised) // SHM_SHARE if free is not None else None

    def fits(window: int) -> bool:
        return share is None or machine_ranks * Layout.of(window, size).total <= share
    if fits(window_bytes):
        return window_bytes
    if not fits(0):
        smallest = Layout.of(0, size).total
        raise CommError(
            f"/dev/shm has {mib(free)} free"
            f"{f' ({mib(promised)} of it promised to windows the ranks hold)' if promised else ''}"
            f"; {machine_ranks} ranks need at least {mib(SHM_SHARE * machine_ranks * smallest)} "
            f"({machine_ranks} x {mib(smallest)}: the smallest window and the point-to-point "
            f"area, in 1/{SHM_SHARE} of the room, the rest left to other users of /dev/shm); "
            f"expected room for every rank's shared window; give the machine more shared "
            f"memory (e.g. docker run --shm-size=1g) or run fewer ranks")
    fit, unfit = MIN_SET_BYTES, set_bytes_for(window_bytes)   # staging set sizes
    while unfit - fit > 4096:
        mid = (fit + unfit) // 2 & ~4095
        fit, unfit = (mid, unfit) if fits(2 * mid) else (fit, mid)
    return 2 * fit
