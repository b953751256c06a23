"""collectx.runtime: run planned collectives across processes over shared memory.

``init()`` joins the ranks (rendezvous from the launcher's environment), ``launch()`` starts
them, :class:`Communicator` runs the collectives, :class:`Work` is an asynchronous handle.
"""

from __future__ import annotations

from .communicator import Communicator
from .launcher import launch
from .work import Work

__all__ = ["init", "launch", "Communicator", "Work"]


def init(rank: int | None = None, world_size: int | None = None, *, store=None, topology=None,
         timeout: float | None = None, device: str = "cpu") -> Communicator:
    """Join the communicator of all ranks and return it.

    Parameters
    ----------
    rank, world_size : int, optional
        Default: from the launcher's environment (collectx.launch / python -m collectx.run,
        torchrun, mpirun, srun); a lone process is a world of one.
    store : Store or torch.distributed.Store, optional
        Rendezvous to use instead of the launcher's (then rank and world_size are required).
    topology : networkx.DiGraph, optional
        The host topology to plan on; default ``collectx.topology.host(world_size)`` (or
        ``COLLECTX_TOPO_FILE``).
    timeout : float, optional
        Seconds before a collective raises Timeout; default ``COLLECTX_TIMEOUT`` (300).
    device : str, optional
        ``"cpu"`` (default) or ``"cuda"`` / ``"cuda:N"``: a
        :class:`~collectx.runtime.cuda.CudaCommunicator` on GPU N (default rank % GPUs); raises
        :class:`~collectx.errors.CudaUnavailable` without CUDA objects or a GPU.

    Returns
    -------
    Communicator

    Examples
    --------
    >>> import numpy as np, collectx
    >>> comm = collectx.init()
    >>> comm.rank, comm.size
    (0, 1)
    >>> comm.close()
    """
    from ..config import get_config
    from ..log import configure
    configure(get_config().debug)
    from .bootstrap import bootstrap, timeout_s
    t = timeout_s(timeout)
    kind, _, index = str(device).partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdecimal())):
        from ..errors import ArgumentError
        raise ArgumentError(f"device={device!r}: expected 'cpu', 'cuda' or 'cuda:N' (N a GPU "
                            f"index)")
    if kind == "cuda":
        from . import cuda
        return cuda.init(rank, world_size, store=store, topology=topology, timeout=t,
                         device=int(index) if index else None)
    if store is None and rank is None and world_size is None:
        from .multinode import maybe_init   # COLLECTX_HOSTS or several hosts: shm + engine
        hier = maybe_init(t)
        if hier is not None:
            return hier
    rank, world_size, store, ready, release = bootstrap(rank, world_size, store, t)
    comm = Communicator(rank, world_size, store, topology=topology, timeout=t, on_close=release)
    ready()
    return comm
