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
Peers are visited starting at ``r+1`` so that no rank is everyone's first source."""

from __future__ import annotations

import networkx as nx

from ..errors import PlanError
from ..schedule.builder import LaneBuilder
from ..schedule.ir import COLLECTIVES, GPU_LANES, Ref, Schedule
from ..schedule.treesched import staggered
from ._build import check_args, shard, simulated
from .cost_tables import INSTRUCTIONS, MAX_PIECES, MIN_CHUNK_BYTES, pipeline_pieces, route_terms

# One lane per peer wherever both executors' lanes allow: two peers sharing a lane take turns,
# and once every peer's link is shared among all its readers a rank then pulls at half its rate.
MAX_COPY_LANES = GPU_LANES - 1

SUPPORTED = COLLECTIVES


def plan_direct(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int, *,
                root: int = 0, inplace: bool = False, nchunks: int | None = None) -> Schedule:
    """Plan ``collective`` as a one-hop exchange among ``ranks``.

    Parameters are those of every planner (see :func:`collectx.planner.plan`); ``topo`` is
    only read to choose broadcast and reduce pieces and may be None. The default ``nchunks``
    is ``len(ranks)`` (one shard per rank), times, for broadcast and reduce, the chunks of
    :func:`_shard_chunks` or :func:`_paced_chunks`, whichever simulates faster on ``topo``
    (without a topology, the former). The receiver of sendrecv is ``root + 1 mod n``.

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
    if nchunks is None and collective in ("broadcast", "reduce") and n > 1 and topo is not None:
        built = [_built(collective, n, n * c, root, inplace)
                 for c in _chunk_tries(topo, ranks, collective, nbytes, root)]
        return min(built, key=lambda s: simulated(s, topo, nbytes, ranks).time_us)
    return _built(collective, n, nchunks or n * _shard_chunks(collective, n, nbytes), root, inplace)


def least_us(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int,
             root: int = 0) -> float:
    """No direct broadcast or reduce of ``nbytes`` over ``ranks`` takes less (simulated us):
    its busiest link's bytes over that link's capacity. A byte crosses the same routes however
    the shards are cut, so one chunk per shard, cheap to simulate, loads every link as any
    other cut (less what shards of whole chunks and chunks of whole elements take off one).

    >>> from collectx.topology import load
    >>> round(least_us(load("dgx1v"), tuple(f"GPU{i}" for i in range(8)), "broadcast", 1 << 28))
    5355
    """
    n = len(ranks)
    if collective not in ("broadcast", "reduce") or n < 2:
        return 0.0
    sim = simulated(_built(collective, n, n - 1, root, False), topo, nbytes, ranks)
    whole = min((n * c // (n - 1)) * (n - 1) / (n * c)   # the smallest shard's share of even
                for c in _chunk_tries(topo, ranks, collective, nbytes, root))
    return max(sim.link_util.values(), default=0.0) * sim.time_us * whole * 0.999


def _chunk_tries(topo, ranks, collective: str, nbytes: int, root: int) -> list:
    """Chunks per shard to simulate: the model's (:func:`_paced_chunks`) and the most pieces
    (:func:`_shard_chunks`) bracket the count whose staggered pieces best hide their waits."""
    return list(dict.fromkeys((_shard_chunks(collective, len(ranks), nbytes),
                               _paced_chunks(topo, ranks, collective, nbytes, root))))


def _built(collective: str, n: int, nchunks: int, root: int, inplace: bool) -> Schedule:
    b = LaneBuilder(collective, n, nchunks, root=root, inplace=inplace)
    scratch = _BUILDERS[collective](b)
    return b.schedule("direct", scratch_units=scratch, meta={"pattern": "one-hop", "pull": True})


def _paced_chunks(topo, ranks, collective: str, nbytes: int, root: int) -> int:
    """Chunks per shard by the pipeline model (:func:`~.cost_tables.pipeline_pieces`): each of
    the ``n - 1`` relays' shards crosses two hops (root to relay, relay to the others; a
    reduce's relay hands its result back), one where a broadcast has no other rank to relay
    to; the root's links carry every relay's stream at once."""
    n = len(ranks)
    relays = n - 1
    hops = 1 if collective == "broadcast" and n == 2 else 2
    pairs = [(root, r) if collective == "broadcast" else (r, root)
             for r in range(n) if r != root]
    bw, wait = route_terms(topo, ranks, pairs)
    pieces = pipeline_pieces(nbytes / relays, hops, bw / relays, wait)
    return 2 * max(1, min(pieces, INSTRUCTIONS // (2 * relays ** 2)))


def _shard_chunks(collective: str, n: int, nbytes: int) -> int:
    """Chunks per shard: for broadcast and reduce, two per :func:`~.treesched.staggered` piece; one
    for the other collectives, whose shards move in one step each way.

    The second hop of a piece starts when its first one lands, so the two hops overlap but
    for one piece: as many pieces as allowed by :data:`~.cost_tables.MIN_CHUNK_BYTES` per
    piece, :data:`~.cost_tables.MAX_PIECES` per shard (a two-hop chain) and half of
    :data:`~.cost_tables.INSTRUCTIONS` per schedule (each piece moves ``n - 1`` times, and
    every rank's ``2 (n - 1)`` lanes run at once, which the simulator pays for per step).

    >>> [_shard_chunks("broadcast", 8, s) for s in (1 << 30, 1 << 10)], _shard_chunks("allreduce", 8, 1 << 30)
    ([1024, 2], 1)
    """
    if collective not in ("broadcast", "reduce") or n < 2:
        return 1
    relays = n - 1
    return 2 * max(1, min(MAX_PIECES, nbytes // (relays * MIN_CHUNK_BYTES),
                          INSTRUCTIONS // (2 * relays ** 2)))


def _copy_lane(offset: int) -> int:
    """Lane of the copy from the peer ``offset`` ranks ahead (1 <= offset <= n - 1), or of a rank's
    copy of its own data (offset n: a lane apart, so that it never holds up a peer's copy)."""
    return (offset - 1) % MAX_COPY_LANES


def _piece_lane(offset: int, turn: int, n: int) -> int:
    """Lane of a broadcast or reduce piece from the peer ``offset`` ranks ahead: two lanes
    per peer taking :func:`~.treesched.staggered` pieces in turn, where ``n`` ranks leave enough."""
    if 2 * (n - 1) > MAX_COPY_LANES:
        return _copy_lane(offset)
    return 2 * (offset - 1) + turn


def _allreduce(b: LaneBuilder):
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


def _reduce_scatter(b: LaneBuilder):
    n, c = b.nranks, b.nchunks
    for r in range(n):
        srcs = [Ref((r + o) % n, "input", r * c, c) for o in range(n)]
        b.add(r, 0, "reduce", Ref(r, "output", 0, c), srcs)
    return ()


def _allgather(b: LaneBuilder):
    return _pull_from_all(b, lambda r: 0)


def _alltoall(b: LaneBuilder):
    return _pull_from_all(b, lambda r: r * b.nchunks)


def _pull_from_all(b: LaneBuilder, offset):
    """Every rank copies ``c`` chunks at ``offset(rank)`` of every rank's input, its own too,
    into that rank's slot of its output, one lane per peer."""
    n, c = b.nranks, b.nchunks
    for r in range(n):
        for o in range(n):
            p = (r + o) % n
            b.add(r, _copy_lane(o or n), "copy", Ref(r, "output", p * c, c),
                  [Ref(p, "input", offset(r), c)])
    return ()


def _relay_shards(b: LaneBuilder) -> list[tuple[int, int, int]]:
    """``(rank, first chunk, chunks)``: the payload cut among the ranks other than the root,
    each the relay of its shard (the root's own share would leave it twice)."""
    others = [r for r in range(b.nranks) if r != b.root]
    return [(r, *shard(i, len(others), b.nchunks)) for i, r in enumerate(others)]


def _broadcast(b: LaneBuilder):
    """Scatter then allgather, piece by piece: the root sends each byte once, to the rank
    that relays it, and every other rank pulls it from there as soon as it has landed. The
    root's link carries the payload once, every other rank's its share ``n - 2`` times: the
    broadcast optimum where every rank reaches every other in one hop.

    Instructions go in step order (every shard's ``i``-th piece before any ``i+1``-th), and
    a rank pulls from the root on the root's lanes: so where peers share a lane their pieces
    alternate, and no shard waits for another to finish."""
    n, c, root = b.nranks, b.nchunks, b.root
    b.add(root, 0, "copy", Ref(root, "output", 0, c), [Ref(root, "input", 0, c)])
    for i, r, (j, k) in _steps(b):
        got = b.add(r, _piece_lane((root - r) % n, i % 2, n), "copy", Ref(r, "output", j, k),
                    [Ref(root, "input", j, k)])
        for q in range(n):
            if q not in (root, r):
                b.add(q, _piece_lane((r - q) % n, i % 2, n), "copy", Ref(q, "output", j, k),
                      [Ref(r, "output", j, k)], [got])
    return ()


def _reduce(b: LaneBuilder):
    """Reduce-scatter onto the ranks other than the root, then the root pulls each reduced
    piece as it is done: every link carries the payload once each way at most. Step order
    and lanes as :func:`_broadcast`."""
    n, root = b.nranks, b.root
    if n == 1:
        b.add(root, 0, "copy", Ref(root, "output", 0, b.nchunks), [Ref(root, "input", 0, b.nchunks)])
    for i, r, (j, k) in _steps(b):
        done = b.add(r, i % 2, "reduce", Ref(r, "scratch", j, k),
                     [Ref((r + o) % n, "input", j, k) for o in range(n)])
        b.add(root, _piece_lane((r - root) % n, i % 2, n), "copy", Ref(root, "output", j, k),
              [Ref(r, "scratch", j, k)], [done])
    return tuple(0 if r == root else 1 for r in range(n))


def _steps(b: LaneBuilder):
    """``(i, relay, piece)``: the :func:`~.treesched.staggered` pieces of every relay's shard, all
    shards' ``i``-th piece before any ``i+1``-th."""
    pieces = [(r, staggered(lo, k)) for r, lo, k in _relay_shards(b)]
    for i in range(max((len(ps) for _, ps in pieces), default=0)):
        for r, ps in pieces:
            if i < len(ps):
                yield i, r, ps[i]


def _sendrecv(b: LaneBuilder):
    n, c, root = b.nranks, b.nchunks, b.root
    peer = (root + 1) % n
    b.add(peer, 0, "copy", Ref(peer, "output", 0, c), [Ref(root, "input", 0, c)])
    return ()


_BUILDERS = {"allreduce": _allreduce, "reduce_scatter": _reduce_scatter,
             "allgather": _allgather, "alltoall": _alltoall, "broadcast": _broadcast,
             "reduce": _reduce, "sendrecv": _sendrecv}
