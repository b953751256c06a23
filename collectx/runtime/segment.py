"""The size of a rank's shared-memory segment, and a window that fits a small /dev/shm.

A segment (``window.py`` has the picture) is a control block, two staging sets, the
point-to-point area and a heap for ``Communicator.empty``. It is created sparse, and tmpfs
allocates a page when it is first written: a segment bigger than the room left in /dev/shm
maps fine and kills its rank with SIGBUS much later, on the first write past the room. The
usual case is a container (Docker gives /dev/shm 64 MiB unless told ``--shm-size``), where the
default window is bigger than the whole mount. So rank 0 fits the window to the room before
any rank creates its segment (:func:`fit_window_bytes`): every rank of the machine may fill
its segment, and all of them still fit.

>>> Layout.of(1 << 20, 2).total      # 1 MiB window, 2 ranks: 8 KiB + 4 x 512 KiB + 4 KiB + 2 MiB
4206592
>>> fit_window_bytes(64 << 20, size=2, machine_ranks=2, free=64 << 20) / (1 << 20)
14.9921875
"""

from __future__ import annotations

import dataclasses
import os

from ..errors import CommError
from ..log import mib

CTL_BYTES = 8192
P2P_SLOT_BYTES = 1 << 20             # per peer; send/recv move pieces of half of it
MIN_SET_BYTES = 1 << 16


def set_bytes_for(window_bytes: int) -> int:
    """Bytes of one staging set for a window budget: half of it, 4 KiB aligned, >= 64 KiB.

    >>> set_bytes_for(1 << 20), set_bytes_for(1000)
    (524288, 65536)
    """
    return max(MIN_SET_BYTES, (int(window_bytes) // 2) & ~4095)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Byte offsets in a rank's segment for a window of ``window_bytes`` among ``size`` ranks."""
    set_bytes: int
    p2p_offset: int
    heap_offset: int
    heap_bytes: int
    total: int

    @classmethod
    def of(cls, window_bytes: int, size: int) -> "Layout":
        set_bytes = set_bytes_for(window_bytes)
        p2p_offset = CTL_BYTES + 2 * set_bytes
        p2p_header = (size * 128 + 4095) // 4096 * 4096
        heap_offset = p2p_offset + p2p_header + size * P2P_SLOT_BYTES
        heap_bytes = 2 * set_bytes
        return cls(set_bytes, p2p_offset, heap_offset, heap_bytes, heap_offset + heap_bytes)


def shm_free(shm_dir: str) -> int | None:
    """Bytes that can still be written in ``shm_dir``, or None when it does not say (no such
    directory, or a tmpfs mounted without a size limit)."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if st.f_blocks else None


def fit_window_bytes(window_bytes: int, size: int, machine_ranks: int, free: int | None) -> int:
    """The largest window up to ``window_bytes`` whose segments, one for each of the
    ``machine_ranks`` ranks of this machine, fit in ``free`` bytes together.

    Raises :class:`CommError` when not even the smallest window fits.

    >>> fit_window_bytes(64 << 20, size=2, machine_ranks=2, free=None) >> 20   # no limit
    64
    >>> try:
    ...     fit_window_bytes(64 << 20, size=8, machine_ranks=8, free=8 << 20)
    ... except CommError as e:
    ...     print(str(e)[:57])
    /dev/shm has 8.0 MiB free; 8 ranks need at least 66.1 MiB
    """
    if free is None or machine_ranks * Layout.of(window_bytes, size).total <= free:
        return window_bytes
    fixed = Layout.of(0, size).total - 4 * MIN_SET_BYTES   # everything but 4 sets' worth
    room = free // machine_ranks - fixed                   # for 2 staging sets and the heap
    fitted = (room // 4 & ~4095) * 2
    smallest = Layout.of(0, size).total
    if set_bytes_for(fitted) * 4 > room:
        raise CommError(
            f"/dev/shm has {mib(free)} free; {machine_ranks} ranks need at least "
            f"{mib(machine_ranks * smallest)} ({machine_ranks} x {mib(smallest)}: the smallest "
            f"window and the point-to-point area); expected room for every rank's shared "
            f"window; give the machine more shared memory (e.g. docker run --shm-size=1g) or "
            f"run fewer ranks")
    return fitted
