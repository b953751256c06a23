"""One-hop (direct) schedules: every rank reads every peer's buffer in a single step.

How it works. The payload is cut into ``nranks`` shards (``nchunks`` defaults to ``nranks``; shard
``r`` is the chunk range :func:`~collectx.planner._build.shard` gives rank ``r``). Rank ``r`` owns
shard ``r``: it reduces that shard from every rank's input with ONE n-ary reduce, and then every
rank copies each owner's finished shard. That is two steps whatever the rank count, each moving
``(n-1)/n`` of the payload through each rank's links, which is optimal when every rank reaches
every other in one hop (NVSwitch, an xGMI full mesh, CPU shared memory).

Pull, not push. Every copy and reduce is executed by the rank that owns the destination: ranks
read peers' memory and write only their own. So a rank's buffers are never modified behind its
back, in-place runs need no "I have finished reading" flags from the receiver, and each wait is
one "producer finished" dependency that the reader checks right before it reads.

Lanes: lane 0 runs the rank's reduce; copies from peers are spread one peer per lane (up to
:data:`MAX_COPY_LANES`), so transfers from different peers proceed at once over their own links.
Peers are visited starting at ``r+1`` so that no rank is everyone's first source.
"""

from __future__ import annotations

import networkx as nx

from ..errors import PlanError
from ..schedule.ir import COLLECTIVES, Ref, Schedule
from ._build import Builder, check_args, shard

MAX_COPY_LANES = 8  # copies from more peers than this share lanes (bounded thread blocks)

SUPPORTED = COLLECTIVES


def plan_direct(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int, *,
                root: int = 0, inplace: bool = False, nchunks: int | None = None) -> Schedule:
    """Plan ``collective`` as a one-hop exchange among ``ranks``.

    Parameters
    ----------
    topo : nx.DiGraph
        The topology (read only; direct schedules do not depend on its links).
    ranks : tuple of str
        Node ids of the ranks; schedule rank ``i`` is ``ranks[i]``.
    collective : str
        One of allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, sendrecv.
    nbytes : int
        Message size (unused: the schedule is the same for every size).
    root : int
        Root rank of broadcast/reduce, sender of sendrecv (the receiver is ``root+1 mod n``).
    inplace : bool
        Build for aliased input/output (see :func:`collectx.schedule.alias`).
    nchunks : int, optional
        Chunks per payload unit; default ``len(ranks)`` (one shard per rank).

    Returns
    -------
    Schedule

    Raises
    ------
    PlanError
        Unknown collective, bad root, or in-place alltoall (not defined).

    Examples
    --------
    >>> s = plan_direct(None, ("A", "B", "C"), "allreduce", 1 << 20)
    >>> s.nchunks, [len(lanes) for lanes in s.lanes], s.n_instructions
    (3, [2, 2, 2], 9)
    """
    n = len(ranks)
    check_args(collective, n, root, nchunks)
    if inplace and collective == "alltoall":
        raise PlanError("in-place alltoall: not defined (each rank's input is still being read "
                        "while peers write its output); pass distinct input and output buffers")
    b = Builder(collective, n, nchunks or n, root=root, inplace=inplace)
    scratch = _BUILDERS[collective](b)
    return b.schedule("direct", scratch_units=scratch, meta={"pattern": "one-hop", "pull": True})


def _copy_lane(offset: int) -> int:
    """Lane of the copy from the peer ``offset`` ranks ahead (offset >= 1)."""
    return (offset - 1) % MAX_COPY_LANES


def _allreduce(b: Builder):
    n, c = b.nranks, b.nchunks
    done = []
    for r in range(n):
        lo, k = shard(r, n, c)
        if k == 0:
            done.append(None)
            continue
        srcs = [Ref((r + o) % n, "input", lo, k) for o in range(n)]
        done.append(b.add(r, 0, "reduce", Ref(r, "output", lo, k), srcs))
    for r in range(n):
        for o in range(1, n):
            p = (r + o) % n
            lo, k = shard(p, n, c)
            if k:
                b.add(r, _copy_lane(o), "copy", Ref(r, "output", lo, k),
                      [Ref(p, "output", lo, k)], [done[p]])
    return ()


def _reduce_scatter(b: Builder):
    n, c = b.nranks, b.nchunks
    for r in range(n):
        srcs = [Ref((r + o) % n, "input", r * c, c) for o in range(n)]
        b.add(r, 0, "reduce", Ref(r, "output", 0, c), srcs)
    return ()


def _allgather(b: Builder):
    n, c = b.nranks, b.nchunks
    for r in range(n):
        for o in range(n):
            p = (r + o) % n
            b.add(r, _copy_lane(o) if o else 0, "copy", Ref(r, "output", p * c, c),
                  [Ref(p, "input", 0, c)])
    return ()


def _alltoall(b: Builder):
    n, c = b.nranks, b.nchunks
    for r in range(n):
        for o in range(n):
            p = (r + o) % n
            b.add(r, _copy_lane(o) if o else 0, "copy", Ref(r, "output", p * c, c),
                  [Ref(p, "input", r * c, c)])
    return ()


def _broadcast(b: Builder):
    """Scatter then allgather: the root sends each byte once (~M out of the root instead of
    (n-1)M when everyone copies the root's input), and peers spread the rest. On 2 ranks the
    peer pulls its own shard and the root's as two copies, so that an executor can hand one of
    them to the root (collectx.schedule.push.share_copies)."""
    n, c, root = b.nranks, b.nchunks, b.root
    b.add(root, 0, "copy", Ref(root, "output", 0, c), [Ref(root, "input", 0, c)])
    got = [None] * n
    for r in range(n):
        lo, k = shard(r, n, c)
        if r != root and k:
            got[r] = b.add(r, 0, "copy", Ref(r, "output", lo, k), [Ref(root, "input", lo, k)])
    for r in range(n):
        if r == root:
            continue
        for o in range(1, n):
            p = (r + o) % n
            lo, k = shard(p, n, c)
            if not k:
                continue
            src = Ref(root, "input", lo, k) if p == root else Ref(p, "output", lo, k)
            b.add(r, _copy_lane(o), "copy", Ref(r, "output", lo, k), [src], [got[p]])
    return ()


def _reduce(b: Builder):
    """Each rank reduces its shard into its scratch (the root straight into its output), then
    the root pulls the finished shards: a reduce-scatter whose gather ends at the root."""
    n, c, root = b.nranks, b.nchunks, b.root
    for r in range(n):
        lo, k = shard(r, n, c)
        if not k:
            continue
        dst = Ref(r, "output" if r == root else "scratch", lo, k)
        done = b.add(r, 0, "reduce", dst, [Ref((r + o) % n, "input", lo, k) for o in range(n)])
        if r != root:
            o = (r - root) % n
            b.add(root, _copy_lane(o), "copy", Ref(root, "output", lo, k), [dst], [done])
    return tuple(0 if r == root else 1 for r in range(n))


def _sendrecv(b: Builder):
    n, c, root = b.nranks, b.nchunks, b.root
    peer = (root + 1) % n
    b.add(peer, 0, "copy", Ref(peer, "output", 0, c), [Ref(root, "input", 0, c)])
    return ()


_BUILDERS = {"allreduce": _allreduce, "reduce_scatter": _reduce_scatter,
             "allgather": _allgather, "alltoall": _alltoall, "broadcast": _broadcast,
             "reduce": _reduce, "sendrecv": _sendrecv}
