"""Room in collectx's shared window for the sweep's buffers.

collectx-perf allocates its buffers with ``comm.empty``: arrays in the shared window, which every
rank uses in place, so no call copies between the user's memory and the window (nccl-tests
likewise allocates device memory). The default window (``COLLECTX_WINDOW_BYTES``, 64 MiB per
rank) holds the buffers of sweeps up to about 32 MiB; the ranks collectx-perf starts itself get
a window that holds the largest buffers when /dev/shm has room for it, unless
``COLLECTX_WINDOW_BYTES`` is set. Otherwise the buffers are ordinary memory, which the runtime
stages or reads across processes, and the table's preamble says so.

>>> spec = {"collectives": ["allreduce"], "sizes": [8, 1 << 20], "dtype": "float32"}
>>> heap_bytes_needed(spec, 2) == 2 * (1 << 20) + HEAP_SLACK
True
>>> window_for(spec, 2, env={}) is None        # fits the default window
True
"""

from __future__ import annotations

import os

from ..config import Config
from ..errors import CommError
from ..runtime.segment import fit_window_bytes, shm_free
from . import buffers
from .sweep import buffer_elems

# Over the buffers themselves: the heap's 64-byte alignment and the sweep's small gather buffers.
HEAP_SLACK = 1 << 20


def heap_bytes_needed(spec: dict, nranks: int) -> int:
    """Bytes of window heap the sweep's largest pair of buffers takes (one pair is alive at a
    time: the sweep frees a collective's buffers before it allocates the next one's)."""
    itemsize = buffers.itemsize(spec["dtype"])
    elems = max(sum(buffer_elems(c, spec["sizes"], itemsize, nranks))
                for c in spec["collectives"])
    return elems * itemsize + HEAP_SLACK


def window_for(spec: dict, nranks: int, env=None, shm: str = "/dev/shm") -> int | None:
    """``COLLECTX_WINDOW_BYTES`` for ``nranks`` local ranks whose heaps must hold the sweep's
    buffers, or None to leave the window as configured: GPU buffers, bfloat16 (which
    ``comm.empty`` does not hold), a window set by the user, buffers that fit the default one,
    or not enough room in ``shm`` for every rank's heap."""
    env = os.environ if env is None else env
    if (spec.get("device", "cpu") != "cpu" or spec["dtype"] == "bfloat16"
            or "COLLECTX_WINDOW_BYTES" in env):
        return None
    need, default = heap_bytes_needed(spec, nranks), Config().window_bytes
    if need <= default:
        return None
    free = shm_free(shm)
    if free is None:   # no room said: do not grow into what may not be there
        return None
    try:    # the runtime would cut a window that does not fit: leave it to the configured one
        return need if fit_window_bytes(need, nranks, nranks, free) == need else None
    except CommError:
        return None
