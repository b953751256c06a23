"""collectx.runtime.cuda: the planned collectives on NVIDIA GPUs, over CUDA IPC windows.

The fourth interpreter of the schedule IR (native/cuda/executor.cu): one thread block per lane
walks the same flat plan the CPU executor runs. :func:`init` joins the ranks like
``collectx.init`` and returns a :class:`CudaCommunicator`; without CUDA objects in the library,
or without a visible GPU, it raises :class:`~collectx.errors.CudaUnavailable`.
"""

from __future__ import annotations

from .communicator import CudaCommunicator, require_gpu
from .work import CudaWork

__all__ = ["init", "CudaCommunicator", "CudaWork", "require_gpu"]


def init(rank: int | None = None, world_size: int | None = None, *, store=None, topology=None,
         timeout: float | None = None, device: int | None = None) -> CudaCommunicator:
    """Join the CUDA communicator of all ranks (see :func:`collectx.runtime.init`).

    ``device`` picks the GPU of this rank; default ``rank % device_count()``. The GPU check comes
    before the rendezvous, so a machine without one fails at once on every rank.
    """
    from ..bootstrap import bootstrap, timeout_s
    t = timeout_s(timeout)
    require_gpu()
    rank, world_size, store, ready, release = bootstrap(rank, world_size, store, t)
    comm = CudaCommunicator(rank, world_size, store, device=device, topology=topology, timeout=t,
                            on_close=release)
    ready()
    return comm
