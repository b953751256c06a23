"""collectx.runtime.multinode: collectives across hosts (shared memory inside, an engine between).

:func:`init` returns a :class:`HierarchicalCommunicator` over the engine the launcher provides
(MPI under mpirun, a torch.distributed group when given or initialized); ``collectx.init()``
calls :func:`maybe_init` so that ``COLLECTX_HOSTS`` or ranks on several hosts switch to it.

>>> from collectx.runtime.multinode import LoopbackEngine, init
>>> with init(engine=LoopbackEngine()) as comm:
...     comm.size, comm.layout.local_size
(1, 1)
"""

from __future__ import annotations

import socket

from ...config import get_config
from .communicator import HierarchicalCommunicator
from .engines import (InterEngine, LoopbackEngine, MPIEngine, NCCLEngine, TorchEngine,
                      default_engine)
from .hosts import HostLayout, hosts_from_spec

__all__ = ["init", "maybe_init", "HierarchicalCommunicator", "InterEngine", "MPIEngine",
           "TorchEngine", "NCCLEngine", "LoopbackEngine", "default_engine", "HostLayout",
           "hosts_from_spec"]


def init(engine: InterEngine | None = None, *, group=None, hosts: str | None = None,
         timeout: float | None = None) -> HierarchicalCommunicator:
    """Join the hierarchical communicator of all ranks.

    Parameters
    ----------
    engine : InterEngine, optional
        Default :func:`default_engine` (``group`` if given, torch.distributed if initialized,
        MPI under mpirun, else a world of one).
    group : torch.distributed.ProcessGroup, optional
        Run the inter-host stage on this process group (gloo on CPU).
    hosts : str, optional
        Pseudo-hosts such as ``"2,2"`` (default ``COLLECTX_HOSTS``, else real host names).
    timeout : float, optional
        Seconds before an intra-host collective raises Timeout.
    """
    return HierarchicalCommunicator(engine or default_engine(group), hosts=hosts,
                                    timeout=timeout)


def maybe_init(timeout: float | None = None) -> HierarchicalCommunicator | None:
    """The hierarchical communicator if ``COLLECTX_HOSTS`` is set or the launcher's ranks sit
    on several hosts; None otherwise (then one host's Communicator serves)."""
    from ..bootstrap import detect
    cfg = get_config()
    if cfg.hosts is None and detect() != "mpi":
        return None
    engine = default_engine()
    if engine.size < 2:
        return None
    if cfg.hosts is None and len(set(engine.exchange(socket.gethostname()))) < 2:
        return None
    return HierarchicalCommunicator(engine, timeout=timeout)
