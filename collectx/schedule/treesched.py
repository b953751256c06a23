"""Emitting pipelined tree broadcasts and tree reductions as schedule IR.

How it works
------------
A *share* is one tree plus the chunk indices it carries. A broadcast pushes each chunk from the
tree's root down its edges; a reduction combines each chunk bottom-up, every inner node reducing
its own contribution with its children's partial results into a scratch slot, the root into the
final destination. Every instruction is executed by the rank that owns its destination (pull):
it reads its parent's (or children's) memory and writes only its own, so a rank's buffers never
change behind its back and each wait is one "producer finished" dependency.

Every tree moves on lanes of its own (keyed by the tree and the link it pulls over): the trees
of a packing run at equal rates, and a link shares its bandwidth equally among the transfers
crossing it, so only trees that move as separate transfers get the rates they were planned
with. With ``buffers = 2`` each tree edge takes its chunks on two lanes in turn, half a piece
apart (:func:`staggered`: double buffering, as NCCL keeps several steps in flight).

Instructions are appended in the order of their time in a fluid pipeline model (see
:class:`TreeEmitter`), one global order that respects every dependency: each lane's list is a
subsequence of a topological order, so lanes never deadlock, however many trees share a lane
once the executors' lanes run out."""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Callable, NamedTuple

from .._native import compiled_helper
from .builder import ScheduleBuilder
from .ir import BUFFER_INDEX, GPU_LANES, OP_INDEX, Ref

RefFn = Callable[[int, int, int, "Share"], Ref]   # (rank, first chunk, chunks, share) -> Ref
# Emitted items are (time, sequence number, ...), appended in sequence order: a stable sort by
# time alone orders them by (time, sequence), three times faster than sorting on both.
_BY_TIME = itemgetter(0)


def staggered(lo: int, k: int) -> list[tuple[int, int]]:
    """Chunks ``lo .. lo+k`` as pieces of two chunks, but the second piece of one: ``(first
    chunk, chunks)`` in order, for two lanes to take in turn (double buffering).

    A transfer waits out its route's latency before its first byte moves. Pieces of equal
    size sharing a link finish together and then all wait together, idling the link once a
    piece; the short piece puts the second lane half a piece out of phase, so one lane
    moves while the other waits.

    >>> staggered(0, 8)
    [(0, 2), (2, 1), (3, 2), (5, 2), (7, 1)]
    """
    cuts = [lo + c for c in (0, 2, *range(3, k, 2)) if c < k] + [lo + k]
    return [(a, b - a) for a, b in zip(cuts, cuts[1:])]


@dataclass(frozen=True)
class Share:
    """Chunks ``chunks`` travel over ``edges`` (top-down ``(parent, child)`` ranks) from ``root``;
    the edges in ``staged`` move them down (broadcast), those in ``staged_up`` up (reduce),
    through host memory (see :class:`TreeEmitter`). A broadcast with a ``pace`` node lets the
    root's other children take piece ``i`` only once piece ``i - lag() * buffers`` reached
    that node."""

    root: int
    edges: tuple
    chunks: tuple
    staged: frozenset = frozenset()
    staged_up: frozenset = frozenset()
    pace: int = -1

    def lag(self) -> int:
        """The depth of :attr:`pace` (the node a broadcast keeps pace with; -1: none) in the
        tree, 0 without a pace: the root's children run that many pieces per lane of a tree
        edge ahead of it, the fewest that keep every wait on an earlier item of the fluid
        pipeline (:class:`TreeEmitter`) and each edge's pieces in flight on all its lanes."""
        depth = {self.root: 0}
        for p, c in self.edges:
            depth[c] = depth.get(p, 0) + 1
        return depth.get(self.pace, 0) if self.pace != self.root else 0

    def host_record(self) -> list:
        """``["host", [[parent, child], ...]]`` naming the edges staged through host memory
        (either way), for the schedule's ``trees`` meta; empty when there are none."""
        staged = sorted(self.staged | self.staged_up)
        return ["host", [list(e) for e in staged]] if staged else []


class TreeEmitter:
    """Collects tree phases as timed items, then appends them to a builder in time order.

    Item times model a fluid pipeline: chunk ``i`` of a tree with ``m`` chunks enters it at
    ``(i + 0.5) / m`` and every hop adds one chunk time ``1 / m``; a broadcast that waits for a
    reduction starts one hop after it. Every dependency goes from an earlier to a later time,
    so sorting by time gives a topological order in which each lane's items also follow the
    pipeline (emitting tree by tree instead ties lanes into cross-waits that serialize them).
    This is the reference, in Python objects: :class:`WordEmitter` lowers the same phases in C.

    A staged edge (``Share.staged`` / ``staged_up``) moves each chunk in two copies: the sender
    copies it into a fresh chunk of its ``host`` buffer (PCIe up), then the receiver copies or
    reduces it from there (PCIe down). Each copy waits only for what it moves, and both run on
    lanes of their own (per tree and peer), so a PCIe-paced transfer never queues with NVLink
    ones and the staged copies of equal trees get their equal shares of PCIe links."""

    def __init__(self, builder: ScheduleBuilder, buffers: int = 1, lanes: int = GPU_LANES):
        self.b = builder
        self.buffers, self.lanes = buffers, lanes   # per tree edge (its chunks in turn), per rank
        self._lane_keys: list[dict] = [{} for _ in range(builder.nranks)]
        self._items: list = []        # (time, seq, rank, lane key, op, dst, srcs, deps)
        self._staged: dict = {}       # (Ref, token) -> (host Ref, token)

    def lane(self, rank: int, key) -> int:
        keys = self._lane_keys[rank]
        if key not in keys:
            keys[key] = len(keys)
        return keys[key] % self.lanes   # more lane keys than lanes share them

    def broadcast(self, shares, src: RefFn, dst: RefFn, after: dict | None = None) -> None:
        """Send piece ``j`` (``k`` chunks) from ``src(root, j, k, share)`` to
        ``dst(v, j, k, share)`` of every node: piece ``i`` of share ``number`` moves down its
        edges in order, each on lane key ``("down", parent, number, i % buffers)``.

        ``after[root, j]`` (optional) is the ``(token, time)`` of the item that produced the
        root's piece ``j`` (as :meth:`reduce` returns them)."""
        after, items = after or {}, self._items
        for number, share in enumerate(shares):
            pieces = self.pieces(share)
            m, root, lag = len(pieces), share.root, share.lag() * self.buffers
            paced = []   # per piece: (token, time) of the item that brought it to share.pace
            for i, (j, k) in enumerate(pieces):
                turn = i % self.buffers
                # node -> (token, time, Ref) of the item that brought it piece j
                start = after.get((root, j), (None, (i + 0.5) / m))
                ready = {root: (*start, src(root, j, k, share))}
                for p, c in share.edges:
                    token, tp, source = ready[p]
                    t = tp + 1.0 / m
                    ref, key = dst(c, j, k, share), ("down", p, number, turn)
                    # keep pace: wait for piece i - lag at the pace node, where that is earlier
                    pace = (paced[i - lag][0],) if p == root and c != share.pace and \
                        i >= lag > 0 and paced[i - lag][1] <= t else ()
                    if (p, c) in share.staged:
                        seq = self._hop(t, m, (number, turn), p, c, key, ref, source, token,
                                        pace)
                    else:   # most hops: a direct copy
                        seq = len(items)
                        items.append((t, seq, c, key, "copy", ref, (source,), (token,) + pace))
                    ready[c] = (seq, t, ref)
                if lag:
                    paced.append(ready[share.pace][:2])

    def reduce(self, shares, contrib: RefFn, result: RefFn) -> dict:
        """Reduce piece ``j`` (``k`` chunks) of ``contrib(v, j, k, share)`` over every tree node
        into ``result(root, j, k, share)``: piece ``i`` of share ``number`` climbs its tree as
        ``_ReduceShape.of(share, (number, i % buffers))`` says.

        Returns ``{(root, j): (token, time)}`` of the item completing piece ``j`` at its root."""
        done: dict = {}
        items, fresh, through_host = self._items, self.b.fresh, self._through_host
        for number, share in enumerate(shares):
            pieces = self.pieces(share)
            shapes = [_ReduceShape.of(share, (number, turn)) for turn in range(self.buffers)]
            m, root = len(pieces), share.root
            for i, (j, k) in enumerate(pieces):
                shape = shapes[i % len(shapes)]
                partial = {u: (contrib(u, j, k, share), None) for u in shape.leaves}
                for u, kids, height, key, staged in shape.inner:   # children first
                    own = contrib(u, j, k, share)
                    dst = fresh("scratch", u, own) if u != root else result(u, j, k, share)
                    t = (i + 0.5 + height) / m
                    srcs, tokens = [own], []
                    for c in kids:
                        ref, token = through_host(t, m, (number, i % len(shapes)), c, u,
                                                  *partial[c]) if c in staged else partial[c]
                        srcs.append(ref)
                        tokens.append(token)
                    seq = len(items)
                    items.append((t, seq, u, key, "reduce", dst, tuple(srcs), tuple(tokens)))
                    partial[u] = (dst, seq)
                done[root, j] = (partial[root][1], (i + 0.5 + shape.top) / m)
        return done

    def pieces(self, share: Share) -> list:
        """``(first chunk, chunks)`` of each piece of ``share`` (whose chunks are one range):
        one chunk each on one lane, :func:`staggered` pieces on two."""
        if self.buffers == 1 or not share.chunks:
            return [(j, 1) for j in share.chunks]
        return staggered(share.chunks[0], len(share.chunks))

    def self_copy(self, rank: int, dst: Ref, src: Ref) -> None:
        """Rank-local copy (a root's own slot), first thing on its own lane."""
        self._add(-1.0, rank, ("self",), "copy", dst, (src,), ())

    def flush(self) -> None:
        """Append every collected item to the builder, earliest first, on its key's lane,
        waiting for the instructions its tokens name."""
        items = self._items
        items.sort(key=_BY_TIME)
        dep_of: list = [None] * len(items)   # item sequence number -> its Dep
        append = self.b.appender()
        for t, seq, rank, key, op, dst, srcs, tokens in items:
            wait = tuple(dict.fromkeys(dep_of[k] for k in tokens if k is not None))
            dep_of[seq] = append(rank, self.lane(rank, (key, 0)), op, dst, srcs, wait)
        items.clear()

    def _add(self, t, rank, key, op, dst, srcs, tokens) -> int:
        seq = len(self._items)
        self._items.append((t, seq, rank, key, op, dst, srcs, tokens))
        return seq

    def _hop(self, t, m, number: int, p: int, c: int, key, dst: Ref, source: Ref, token,
             pace: tuple = ()):
        """Copy ``source`` (on ``p``) to ``dst`` (on ``c``) through ``p``'s host buffer, the
        copy into ``dst`` also waiting for the ``pace`` tokens; returns its token."""
        hop, up = self._stage_up(t - 0.5 / m, number, p, c, source, token)
        return self._add(t, c, key + ("host",), "copy", dst, (hop,), (up,) + pace)

    def _through_host(self, t, m, number: int, sender: int, receiver: int, ref: Ref,
                      token) -> tuple:
        """``ref`` (on ``sender``) staged into a fresh scratch chunk of ``receiver``: (that
        Ref, token of the copy). A reduction then reads it locally: reading the host copy
        itself would tie the reduction's NVLink inputs to the pace of PCIe."""
        hop, up = self._stage_up(t - 0.6 / m, number, sender, receiver, ref, token)
        mine = self.b.fresh("scratch", receiver, ref)
        return mine, self._add(t - 0.3 / m, receiver, ("host down", sender, number), "copy",
                               mine, (hop,), (up,))

    def _stage_up(self, t, number: int, sender: int, receiver: int, ref: Ref, token) -> tuple:
        """``sender`` copies ``ref`` into a fresh chunk of its host buffer for ``receiver``
        (one copy serves every receiver of the same data): (that host Ref, token)."""
        key = (ref, token)
        if key not in self._staged:
            hop = self.b.fresh("host", sender, ref)
            self._staged[key] = (hop, self._add(t, sender, ("host up", receiver, number),
                                                "copy", hop, (ref,), (token,)))
        return self._staged[key]


def emitter(builder: ScheduleBuilder, buffers: int = 1, lanes: int = GPU_LANES):
    """A :class:`WordEmitter` where ``collectx._fastpath`` is built, else a
    :class:`TreeEmitter`: ``flush()`` gives words, or None after appending to ``builder``."""
    native = compiled_helper("lower_words")
    return WordEmitter(builder, native, buffers, lanes) if native else \
        TreeEmitter(builder, buffers, lanes)


class WordEmitter:
    """:class:`TreeEmitter`'s phases as plain data, lowered by ``native``
    (``collectx._fastpath.lower_words``, native/python/cx_lower.c) in one compiled pass to
    the words of the schedule :class:`TreeEmitter` builds: the same instructions on the same
    lanes, with no Python object per transfer and without the GIL, so two candidates lower at
    once. The RefFns must be :class:`ChunkRefs`."""

    pieces = TreeEmitter.pieces

    def __init__(self, builder: ScheduleBuilder, native, buffers: int = 1, lanes: int = GPU_LANES):
        self.b, self._native, self.buffers, self.lanes = builder, native, buffers, lanes
        self._phases: list = []

    def self_copy(self, rank: int, dst: Ref, src: Ref) -> None:
        self._phases.append((0, rank, _coded(dst), _coded(src)))

    def broadcast(self, shares, src: ChunkRefs, dst: ChunkRefs, after=None) -> None:
        self._phases.append((2, self._shares(shares), _coded(src), _coded(dst), bool(after)))

    def reduce(self, shares, contrib: ChunkRefs, result: ChunkRefs) -> bool:
        self._phases.append((1, self._shares(shares), _coded(contrib), _coded(result)))
        return True   # as broadcast's after: wait for this reduction's roots

    def flush(self) -> bytes:
        """The words of every phase recorded, as :meth:`TreeEmitter.flush` would append them
        (:meth:`~collectx.schedule.Schedule.to_packed`'s); the builder's units are reserved."""
        b = self.b
        return self._native(b.nranks, b.nchunks, self.lanes, self.buffers, _CODES,
                            *b.unit_tables(), self._phases)

    def _shares(self, shares) -> tuple:
        return tuple((s.root, s.edges, tuple(self.pieces(s)), tuple(e in s.staged for e in s.edges),
                      tuple(e in s.staged_up for e in s.edges), s.pace) for s in shares)


def _coded(ref: tuple) -> tuple:
    """A Ref or a :class:`ChunkRefs`, its buffer's name as the words' index."""
    return tuple(BUFFER_INDEX[x] if isinstance(x, str) else x for x in ref)


@dataclass(frozen=True)
class _ReduceShape:
    """What a reduction over one share's tree does for every chunk alike: the leaves, and
    per inner node, children first, ``(node, children, height, lane key, children staged
    up to it)`` (height = levels above the deepest leaf, whose reduction runs first)."""

    leaves: tuple
    inner: tuple
    top: int

    @classmethod
    def of(cls, share: Share, number: int) -> "_ReduceShape":
        kids: dict = {}
        level = {share.root: 0}
        for p, c in share.edges:
            kids.setdefault(p, []).append(c)
            level[c] = level[p] + 1
        top = max(level.values())
        order = list(reversed([share.root] + [c for _, c in share.edges]))
        inner = []
        for u in order:
            if u in kids:
                staged = frozenset(c for c in kids[u] if (u, c) in share.staged_up)
                # PCIe-fed reductions never queue with NVLink-fed ones
                key = ("up", tuple(kids[u]), number) + (("host",) if staged else ())
                inner.append((u, tuple(kids[u]), top - level[u], key, staged))
        return cls(tuple(u for u in order if u not in kids), tuple(inner), top)


_CODES = (OP_INDEX["copy"], OP_INDEX["reduce"], BUFFER_INDEX["scratch"], BUFFER_INDEX["host"])


class ChunkRefs(NamedTuple):
    """The :data:`RefFn` ``(v, j, k, share) -> Ref(v, buf, share.root * per_root + j, k)``, as
    data :class:`WordEmitter` hands to C. Called from Python, it builds the Ref without the
    named tuple's Python ``__new__``: :class:`TreeEmitter` calls it for every piece at every
    node.

    >>> chunk_refs("output", 4)(1, 2, 2, Share(3, (), (2, 3)))
    Ref(rank=1, buf='output', chunk=14, count=2)
    """

    buf: str
    per_root: int = 0

    def __call__(self, v: int, j: int, k: int, share: Share) -> Ref:
        return tuple.__new__(Ref, (v, self.buf, share.root * self.per_root + j, k))


chunk_refs = ChunkRefs   # chunk share.root * per_root + j of buf for piece j
