"""NCCL-style ring schedules over packed rings (one ring per lane, data split by bandwidth).

How it works. :func:`~.ring_search.find_rings` packs rings into the allocation's links. Ring
``k`` becomes lane ``k`` on every rank and owns a contiguous run of each payload unit's chunks,
sized in proportion to its bandwidth. Within a ring, ranks at positions ``i`` pull from their
predecessor ``i-1`` (every rank writes only its own buffers, as in :mod:`.direct`):

* allreduce: reduce-scatter then allgather, ``2(n-1)`` steps. At reduce-scatter step ``s`` the
  rank at position ``i`` adds its input to the predecessor's partial of shard ``i-s-1``
  (partials live in the output buffer); after ``n-1`` steps it holds shard ``i+1`` complete,
  and the allgather passes complete shards along the ring;
* reduce_scatter: the same ``n-1`` reduce steps over whole units, partials in scratch (or in
  the input when in place), ending with unit ``i`` at its owner;
* allgather: ``n-1`` copy steps passing units along the ring;
* broadcast: a pipelined chain from the root along the ring, one copy per piece;
* reduce: a pipelined chain ending at the root, partials in scratch.

Bandwidth: each hop carries ``(n-1)/n`` of the ring's share per phase, so busbw approaches the
sum of the rings' bandwidths; latency grows with ``n`` (use trees for small messages)."""

from __future__ import annotations


import networkx as nx

from ..errors import PlanError
from ..schedule.builder import LaneBuilder
from ..schedule.ir import Ref, Schedule
from ._build import check_args, shard, weighted_shares
from .cost_tables import INSTRUCTIONS, pipeline_pieces, route_terms
from .ring_search import Ring, find_rings

SUPPORTED = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
MAX_UNITS = 32            # whole shards per ring set: ring shares follow bandwidth to ~1% with few


def plan_ring(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int, *,
              root: int = 0, inplace: bool = False, nchunks: int | None = None,
              max_channels: int | None = None) -> Schedule:
    """Plan ``collective`` over rings packed into ``topo`` among ``ranks``.

    Parameters are those of every planner (see :func:`collectx.planner.plan`);
    ``max_channels`` caps the number of rings (default :data:`.ring_search.MAX_CHANNELS`).
    The default ``nchunks`` gives each ring ``n`` shards (several per ring when ring
    bandwidths differ, so shares follow bandwidth), and for broadcast/reduce one piece per
    :data:`~.cost_tables.MIN_CHUNK_BYTES` per ring.

    Raises
    ------
    PlanError
        Unsupported collective (alltoall, sendrecv) or bad arguments.
    NoFeasiblePlan
        No ring exists through the allocation.

    Notes
    -----
    ``schedule.meta["rings"]`` lists each ring as node ids in ring order, with ``bw_gbps`` and
    the chunk range it owns; executors ignore it, drawings use it.

    Examples
    --------
    >>> from collectx.topology import ring
    >>> s = plan_ring(ring(4), ("GPU0", "GPU1", "GPU2", "GPU3"), "allreduce", 1 << 20)
    >>> len(s.lanes[0]), s.nchunks, s.meta_dict()["rings"][0][0]
    (2, 8, ('GPU0', 'GPU1', 'GPU2', 'GPU3'))
    """
    n = len(ranks)
    check_args(collective, n, root, nchunks)
    if collective not in SUPPORTED:
        raise PlanError(f"ring does not support {collective}; it supports {', '.join(SUPPORTED)}")
    rings = find_rings(topo, ranks, **({} if max_channels is None else
                                       {"max_channels": max_channels}))
    return ring_schedule(topo, ranks, collective, nbytes, rings, root=root, inplace=inplace,
                         nchunks=nchunks)


plan_ring.collectives = SUPPORTED


def ring_schedule(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int,
                  rings: list[Ring], *, root: int = 0, inplace: bool = False,
                  nchunks: int | None = None, algorithm: str = "ring") -> Schedule:
    """The schedule of ``collective`` over the given ``rings`` (one lane each, data split by
    their ``bw_gbps``); :func:`plan_ring` calls it with the rings it packed."""
    n = len(ranks)
    if collective not in SUPPORTED:
        raise PlanError(f"ring does not support {collective}; it supports {', '.join(SUPPORTED)}")
    if nchunks is None and collective not in ("broadcast", "reduce"):
        # Each ring's share a whole number of shards: ring steps move one shard, so a ring
        # whose shards differ by a chunk runs at the pace of its largest.
        units = ring_units([r.bw_gbps for r in rings])
        c, shares = n * sum(units), [n * u for u in units]
    else:
        c = nchunks or _default_nchunks(collective, n, nbytes, rings, topo, ranks)
        rings = rings[:c]  # fewer chunks than rings: extra rings would carry nothing
        shares = weighted_shares(c, [r.bw_gbps for r in rings])
    b = LaneBuilder(collective, n, c, root=root, inplace=inplace)
    base, spans = 0, []
    for lane, (ring, share) in enumerate(zip(rings, shares)):
        if share:
            _BUILDERS[collective](b, lane, ring.order, base, share)
        spans.append((base, share))
        base += share
    meta = {"rings": [([ranks[i] for i in r.order], r.bw_gbps, lo, k)
                      for r, (lo, k) in zip(rings, spans)], "pattern": "ring"}
    return b.schedule(algorithm, scratch_units=_scratch(b), meta=meta)


def ring_units(bws: list[float], most: int = MAX_UNITS, tolerance: float = 0.01) -> list[int]:
    """Small whole numbers in proportion to the rings' bandwidths (within ``tolerance`` of each
    ring's share where ``most`` units allow it; else the closest found).

    >>> ring_units([50.0, 50.0, 25.0, 25.0]), ring_units([25.0, 25.0]), ring_units([30.0, 20.0])
    ([2, 2, 1, 1], [1, 1], [3, 2])
    """
    low = min(bws)
    if low <= 0:
        return [1] * len(bws)
    total = sum(bws)
    best, best_err = [1] * len(bws), float("inf")
    for k in range(1, most + 1):
        units = [max(1, round(b / low * k)) for b in bws]
        if sum(units) > most:
            break
        err = max(abs(u / sum(units) - b / total) / (b / total) for u, b in zip(units, bws))
        if err < best_err - 1e-12:
            best, best_err = units, err
        if err <= tolerance:
            break
    return best


def _default_nchunks(collective: str, n: int, nbytes: int, rings: list[Ring], topo=None,
                     ranks=()) -> int:
    equal = len({round(r.bw_gbps, 6) for r in rings}) == 1
    per_ring = 1 if equal else 4  # unequal rings: finer shares follow bandwidth better
    if collective in ("broadcast", "reduce"):
        pieces = _chain_pieces(n, nbytes, rings, topo, ranks)
        pieces = max(1, min(pieces, INSTRUCTIONS // (n * len(rings) * per_ring)))
        return pieces * len(rings) * per_ring
    return n * len(rings) * per_ring


def _chain_pieces(n: int, nbytes: int, rings: list[Ring], topo, ranks) -> int:
    """Pieces per ring of a broadcast / reduce chain of ``n - 1`` hops
    (:func:`~.cost_tables.pipeline_pieces`), each ring moving its share of ``nbytes``."""
    pairs = [(a, b) for r in rings for a, b in zip(r.order, r.order[1:] + r.order[:1])]
    _, wait = route_terms(topo, ranks, pairs)
    bw = min((r.bw_gbps for r in rings), default=0.0)
    return pipeline_pieces(nbytes / max(len(rings), 1), n - 1, bw, wait)


def _scratch(b: LaneBuilder) -> tuple[int, ...]:
    n = b.nranks
    if b.collective == "reduce_scatter" and not b.inplace:
        return (n,) * n
    if b.collective == "reduce":
        return tuple(0 if r == b.root else 1 for r in range(n))
    return ()


def _allreduce(b: LaneBuilder, lane: int, order, base: int, share: int):
    n = len(order)
    if n == 1:
        b.add(order[0], lane, "copy", Ref(order[0], "output", base, share),
              [Ref(order[0], "input", base, share)])
        return
    piece = [shard(q, n, share) for q in range(n)]
    last: dict[tuple[int, int], object] = {}  # (position, shard) -> instruction that wrote it
    for s in range(2 * (n - 1)):   # n - 1 steps reduce-scatter, n - 1 pass the sums along
        reducing = s < n - 1
        for i in range(n):
            q, pred = (i - s - 1) % n, (i - 1) % n
            lo, k = piece[q]
            if not k:
                continue
            r, p = order[i], order[pred]
            sent = Ref(p, "input" if s == 0 else "output", base + lo, k)
            srcs = [Ref(r, "input", base + lo, k), sent] if reducing else [sent]
            last[i, q] = b.add(r, lane, "reduce" if reducing else "copy",
                               Ref(r, "output", base + lo, k), srcs, [last.get((pred, q))])


def _reduce_scatter(b: LaneBuilder, lane: int, order, base: int, share: int):
    n, c = len(order), b.nchunks
    part = "input" if b.inplace else "scratch"  # where partial sums of foreign units live
    last: dict[tuple[int, int], object] = {}  # (position, step) -> its instruction
    for s in range(n - 1):
        for i in range(n):
            q, r, p = (i - s - 2) % n, order[i], order[(i - 1) % n]
            u = order[q]  # the unit rank order[q] ends up owning
            prev = Ref(p, "input" if s == 0 else part, u * c + base, share)
            final = s == n - 2
            dst = Ref(r, "output", base, share) if final else Ref(r, part, u * c + base, share)
            last[i, s] = b.add(r, lane, "reduce", dst, [Ref(r, "input", u * c + base, share), prev],
                               [last.get(((i - 1) % n, s - 1))])
    if n == 1:
        r = order[0]
        b.add(r, lane, "copy", Ref(r, "output", base, share), [Ref(r, "input", base, share)])


def _allgather(b: LaneBuilder, lane: int, order, base: int, share: int):
    n, c = len(order), b.nchunks
    for r in order:
        b.add(r, lane, "copy", Ref(r, "output", r * c + base, share),
              [Ref(r, "input", base, share)])
    last: dict[tuple[int, int], object] = {}  # (position, step) -> its instruction
    for s in range(n - 1):
        for i in range(n):
            r, p = order[i], order[(i - 1) % n]
            u = order[(i - s - 1) % n]
            src = Ref(p, "input", base, share) if s == 0 else Ref(p, "output", u * c + base, share)
            last[i, s] = b.add(r, lane, "copy", Ref(r, "output", u * c + base, share), [src],
                               [last.get(((i - 1) % n, s - 1))])


def _rotated(order, root: int) -> tuple[int, ...]:
    at = order.index(root)
    return tuple(order[at:] + order[:at])


def _broadcast(b: LaneBuilder, lane: int, order, base: int, share: int):
    chain = _rotated(order, b.root)
    root = chain[0]
    b.add(root, lane, "copy", Ref(root, "output", base, share), [Ref(root, "input", base, share)])
    for j in range(base, base + share):
        got = None
        for i in range(1, len(chain)):
            r, p = chain[i], chain[i - 1]
            src = Ref(p, "input" if i == 1 else "output", j)
            got = b.add(r, lane, "copy", Ref(r, "output", j), [src], [got])


def _reduce(b: LaneBuilder, lane: int, order, base: int, share: int):
    chain = _rotated(order, b.root)
    chain = chain[1:] + chain[:1]  # flows along the ring and ends at the root
    for j in range(base, base + share):
        held, done = Ref(chain[0], "input", j), None
        for r in chain[1:]:
            dst = Ref(r, "output" if r == b.root else "scratch", j)
            done = b.add(r, lane, "reduce", dst, [Ref(r, "input", j), held], [done])
            held = dst
        if len(chain) == 1:
            b.add(b.root, lane, "copy", Ref(b.root, "output", j), [held])


_BUILDERS = {"allreduce": _allreduce, "reduce_scatter": _reduce_scatter,
             "allgather": _allgather, "broadcast": _broadcast, "reduce": _reduce}
