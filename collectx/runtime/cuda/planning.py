"""What the CUDA executor runs, planned without a GPU: one entry point for the engine and for
``collectx plan --device cuda``, so that what the command reports is what the GPUs run.

>>> from collectx.topology import load
>>> s = cuda_schedule(load("dgx1v"), "allreduce", 8, 256 << 20)
>>> s.nranks, s.uses_host
(8, False)
"""

from __future__ import annotations

from ...errors import ArgumentError
from ...schedule.ir import Schedule


def cuda_schedule(topology, collective: str, nranks: int, nbytes: int, root: int = 0,
                  algo: str | None = None) -> Schedule:
    """The schedule the CUDA engine runs for ``collective`` of ``nbytes`` on the first
    ``nranks`` GPUs of ``topology`` (None: one-hop plan, as when ranks share a GPU).

    The CUDA executor has no host buffers, so no share of the plan is staged through host
    memory (``host_relays=False``); otherwise it is the runtime's ``make_schedule``.

    Parameters
    ----------
    topology : networkx.DiGraph or None
        The machine, GPU ``r`` running rank ``r``.
    collective : str
        allreduce, reduce_scatter, allgather, broadcast, reduce or alltoall.
    nranks, nbytes, root : int
        Ranks, message size in bytes per rank, root rank of broadcast/reduce.
    algo : str, optional
        Force a planner algorithm (COLLECTX_ALGO); default: the planner chooses.

    Returns
    -------
    Schedule

    See Also
    --------
    cuda_plan : the same schedule judged (prediction, bound) on an allocation.

    Examples
    --------
    >>> from collectx.topology import ring
    >>> cuda_schedule(ring(4), "allgather", 4, 1 << 20, algo="ring").algorithm
    'ring'
    """
    from ...planner import make_schedule
    return make_schedule(topology, collective, nranks, nbytes, algo=algo, root=root,
                         host_relays=False)


def cuda_plan(topology, collective: str, nbytes: int, *, gpus=None, algo: str | None = None,
              root: int = 0):
    """:func:`cuda_schedule` on the allocation ``gpus`` of ``topology``, as a
    :class:`~collectx.planner.Plan` (predicted time, bound without host staging,
    verification): ``collectx plan --device cuda``.

    It is ``plan(..., host_relays=False)``: the same choice among the same candidates as the
    engine's ``make_schedule(..., host_relays=False)``, judged against
    :func:`~collectx.planner.bounds.peer_bounds`.

    Raises
    ------
    ArgumentError
        ``gpus`` out of device order: the CUDA runtime runs rank ``r`` on the r-th GPU.

    Examples
    --------
    >>> from collectx.topology import load, subset
    >>> G = load("dgx1v")
    >>> p = cuda_plan(G, "allreduce", 1 << 20, gpus=[0, 1, 2, 5])
    >>> p.schedule == cuda_schedule(subset(G, [0, 1, 2, 5]), "allreduce", 4, 1 << 20)
    True
    """
    from ...planner import plan
    from ...topology import gpus as all_gpus, subset
    from ...topology.model import resolve_gpus
    ranks = resolve_gpus(topology, all_gpus(topology) if gpus is None else gpus)
    in_device_order = all_gpus(subset(topology, ranks))   # the machine the engine sees
    if ranks != in_device_order:
        raise ArgumentError(f"GPUs {', '.join(ranks)} for the CUDA runtime: expected them in "
                            f"device order ({', '.join(in_device_order)}), since it runs rank "
                            f"r on the r-th GPU; list them in that order")
    return plan(topology, collective, nbytes, gpus=list(ranks), algo=algo, root=root,
                host_relays=False)
