"""Lowering packed trees to schedule IR: pipelined tree broadcasts and tree reductions.

How it works
------------
A *share* is one packed tree plus the chunk indices it carries. A broadcast pushes each chunk
from the tree's root down its edges; a reduction combines each chunk bottom-up, every inner node
reducing its own contribution with its children's partial results into a scratch slot, the root
into the final destination. Every instruction is executed by the rank that owns its destination
(pull): it reads its parent's (or children's) memory and writes only its own, so a rank's
buffers never change behind its back and each wait is one "producer finished" dependency.

Instructions are appended in the order of their time in a fluid pipeline model (see
:class:`TreeEmitter`), one global order that respects every dependency. Each lane's list is
therefore a subsequence of a topological order, so lanes never deadlock, however lanes are
shared. Lanes are keyed by the link they pull over (``("down", parent)`` for broadcasts,
``("up", children)`` for reductions), :data:`SUBLANES` per link dealt round-robin: transfers
over one link share it anyway, different links proceed at once, and a chunk that is late
does not hold up the next one on its link.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Callable

import networkx as nx

from .._native import compiled_helper
from ..schedule.builder import ScheduleBuilder
from ..schedule.ir import MAX_LANES, Dep, Instr, Ref   # more lane keys than MAX_LANES share lanes
from ..topology.view import LinkIndex, host_routes, simulator_routes
from .integral_trees import pack_unit_trees
from .switch_trees import pack_switch_trees
from .treepack import (Packing, pack_balanced_trees, pack_out_trees, pack_relay_trees,
                       pack_undirected_trees, shallowest)

SUBLANES = 3     # lanes per link, dealt round-robin: one late chunk does not idle the link
RELAY_KEEP = 0.999   # two-level relay trees replace a single root's packing if they keep this

RefFn = Callable[[int, int, "Share"], Ref]   # (rank, chunk, share) -> Ref
# Emitted items are (time, sequence number, ...), appended in sequence order: a stable sort by
# time alone orders them by (time, sequence), three times faster than sorting on both.
_BY_TIME = itemgetter(0)
# Copies up to and down from host memory keep one lane per peer (and tree, where trees have
# lanes of their own): more concurrent ones only split the PCIe uplink among more transfers,
# and the pipeline order is the one wanted.
ONE_LANE_TAGS = ("host up", "host down")


@dataclass(frozen=True)
class Share:
    """Chunks ``chunks`` travel over ``edges`` (top-down ``(parent, child)`` ranks) from ``root``;
    the edges in ``staged`` move them down (broadcast), those in ``staged_up`` up (reduce),
    through host memory (see :class:`TreeEmitter`)."""

    root: int
    edges: tuple
    chunks: tuple
    staged: frozenset = frozenset()
    staged_up: frozenset = frozenset()

    def host_record(self) -> list:
        """``["host", [[parent, child], ...]]`` naming the edges staged through host memory
        (either way), for the schedule's ``trees`` meta; empty when there are none."""
        staged = sorted(self.staged | self.staged_up)
        return ["host", [list(e) for e in staged]] if staged else []

    @classmethod
    def of(cls, tree, root: int, edges: tuple, chunks: tuple, up: bool = False) -> "Share":
        """The share of packed ``tree`` (edges renamed to ranks as ``edges``) on ``chunks``;
        ``up``: an in-tree packing, whose staged edges move data upwards."""
        down = frozenset(edges[i] for i in tree.staged)
        rise = frozenset(edges[i] for i in tree.staged_up)
        return cls(root, edges, chunks, frozenset() if up else down, down | rise if up else rise)


class TreeEmitter:
    """Collects tree phases as timed items, then appends them to a builder in time order.

    Item times model a fluid pipeline: chunk ``i`` of a tree with ``m`` chunks enters it at
    ``(i + 0.5) / m`` and every hop adds one chunk time ``1 / m``; a broadcast that waits for a
    reduction starts one hop after it. Every dependency goes from an earlier to a later time,
    so sorting by time gives a topological order in which each lane's items also follow the
    pipeline (emitting tree by tree instead ties lanes into cross-waits that serialize them).

    A staged edge (``Share.staged`` / ``staged_up``) moves each chunk in two copies: the sender
    copies it into a fresh chunk of its ``host`` buffer (PCIe up), then the receiver copies or
    reduces it from there (PCIe down). Each copy waits only for what it moves, and both run on
    lanes of their own, so a PCIe-paced transfer never queues with NVLink ones: one lane per
    peer, and per tree where trees have lanes of their own. A link gives each concurrent
    transfer an equal share, so copies of equal trees whose staged hops meet on a PCIe link get
    their planned shares there only as transfers of their own (DGX-1V GPUs 0, 2, 3, 4, 6, 7
    allreduce: mixes of 19 and 28 equal trees ran at 0.86 / 0.91 of their rate with one lane
    per peer, 0.96 with lanes per tree).

    ``stagger = w`` (2 or more) moves each tree's chunks in runs of ``w``, tree ``i``'s first
    run ``i % w`` chunks long. Every transfer waits out its route's latency before it moves a
    byte, and equal trees on lanes of their own move equal chunks in step: they all finish a
    chunk together and leave the link idle together while the next ones start. Runs that end
    a fraction of a run apart keep one lane moving while another starts. Planned on ``w``
    times the chunks, the runs move what one chunk moved before. The schedule records ``w``
    as its ``stagger`` meta.

    ``up_sublanes`` deals reductions over that many lanes per key instead of ``sublanes``: a
    reduction's key names the children it pulls from, not the tree's root, so the in-trees
    of every root that meet the same children at a node queue on those lanes (MI250's
    allreduce forest: 0.939 of the reference with two lanes for broadcasts and reductions,
    0.975 with one per root for broadcasts and three for reductions).
    """

    def __init__(self, builder: ScheduleBuilder, sublanes: int = SUBLANES,
                 tree_lanes: int = 1, stagger: int = 1, up_sublanes: int | None = None):
        self.b = builder
        self.sublanes = sublanes
        # Sublanes by the first element of a lane key; other keys get ``sublanes``.
        self.tag_sublanes = dict.fromkeys(ONE_LANE_TAGS, 1)
        if up_sublanes is not None:
            self.tag_sublanes["up"] = up_sublanes
        self.tree_lanes = tree_lanes
        self.stagger = stagger
        if stagger > 1:
            builder.meta("stagger", stagger)   # chunks most instructions move
        self._lane_keys: list[dict] = [{} for _ in range(builder.nranks)]
        self._items: list = []                      # (time, seq, rank, lane key, op, dst, srcs, deps)
        self._staged: dict = {}                     # (Ref, token) -> (host Ref, token)

    def _runs(self, share, number: int) -> list:
        """``[(first chunk, chunks)]`` the items of tree ``number`` (``share``) move one after
        the other: one chunk each, or with :attr:`stagger` ``= w``, runs of ``w`` chunks, the
        first one ``number % w`` chunks (see the class notes)."""
        if self.stagger < 2:
            return [(j, 1) for j in share.chunks]
        return _piece_runs(share.chunks, self.stagger, number % self.stagger)

    def lane(self, rank: int, key) -> int:
        keys = self._lane_keys[rank]
        if key not in keys:
            keys[key] = len(keys)
        return keys[key] % MAX_LANES

    def broadcast(self, shares, src: RefFn, dst: RefFn, after: dict | None = None,
                  per_tree: bool = False, own_lanes: bool = False) -> None:
        """Send chunk ``j`` from ``src(root, j, share)`` to ``dst(v, j, share)`` of every node.

        ``after[root, j]`` (optional) is the ``(token, time)`` of the item that produced the
        root's chunk ``j`` (as :meth:`reduce` returns them). ``per_tree`` gives every root's
        trees their own lanes on each link: for equal-rate forests (``Packing.balanced``, one
        tree per root), where the ``k`` trees crossing a link must move as ``k`` concurrent
        transfers to get the equal shares they were planned with (lanes shared by trees
        serialize them instead). ``own_lanes`` goes further and gives every tree its own lanes
        (trees of one root included): for equal unit-rate trees of one root
        (:func:`~.integral_trees.pack_unit_trees`) with one lane per key, each chunk then crosses
        a hop at its tree's full rate, so a deep tree fills in one chunk time per level.
        """
        after = after or {}
        tree_key = self._tree_keys(shares)
        items = self._items
        for number, share in enumerate(shares):
            root, staged = share.root, share.staged
            pieces = self._runs(share, number)
            m = len(pieces)
            if not m:
                continue   # chunks by depth can leave a tree of a small message none
            step = 1.0 / m
            # Per edge: (parent, child, lane key unless own lanes, staged through host memory)
            hops = [(p, c, ("down", p, root) if per_tree else ("down", p), (p, c) in staged)
                    for p, c in share.edges]
            keyed: dict = {}   # own lanes: the hops with each of the tree's lane keys
            for i, (j, width) in enumerate(pieces):
                # node -> (token, time, Ref) of the item that brought it chunk j
                start = after.get((root, j), (None, (i + 0.5) / m))
                ready = {root: (*start, _widen(src(root, j, share), width))}
                if own_lanes:
                    lanes = tree_key(share, i)
                    edges = keyed.get(lanes)
                    if edges is None:
                        edges = keyed[lanes] = [(p, c, ("down", p) + lanes, via)
                                                for p, c, _, via in hops]
                else:
                    edges = hops
                for p, c, key, via_host in edges:
                    token, tp, source = ready[p]
                    t = tp + step
                    ref = dst(c, j, share) if width == 1 else _widen(dst(c, j, share), width)
                    if via_host:
                        seq = self._hop(t, m, share, p, c, key, ref, source, token)
                    else:   # _hop's direct copy without its staging test: most hops
                        seq = len(items)
                        items.append((t, seq, c, key, "copy", ref, (source,), (token,)))
                    ready[c] = (seq, t, ref)

    def staggered_broadcast(self, shares, src: RefFn, dst: RefFn,
                            own_lanes: bool = False) -> None:
        """:meth:`broadcast` in pieces of two chunks, the first piece of each tree one chunk.

        With two lanes per edge (``sublanes=2``) the pieces alternate between the lanes, and
        the short first piece puts the lanes half a piece out of step: while one lane waits
        for its next transfer to start (the route's latency), the other one has the link to
        itself, so the link never idles between pieces. Lanes that start together and move
        equal pieces stay in step and idle together. ``own_lanes``: every tree its own pair
        of lanes on each link (see :meth:`broadcast`).
        """
        tree_key = self._tree_keys(shares)
        for share in shares:
            runs = _piece_runs(share.chunks, 2, 1)
            m = len(runs)
            key = tree_key(share, 0) if own_lanes else ()
            for i, (j, n) in enumerate(runs):
                ready = {share.root: (None, (i + 0.5) / m)}
                for p, c in share.edges:
                    source = src(p, j, share) if p == share.root else dst(p, j, share)
                    t = ready[p][1] + 1.0 / m
                    ready[c] = (self._hop(t, m, share, p, c, ("down", p) + key,
                                          _widen(dst(c, j, share), n), _widen(source, n),
                                          ready[p][0]), t)

    def reduce(self, shares, contrib: RefFn, result: RefFn, own_lanes: bool = False) -> dict:
        """Reduce ``contrib(v, j, share)`` over every tree node into ``result(root, j, share)``.

        Returns ``{(root, j): (token, time)}`` of the item completing chunk ``j`` at its root.
        ``own_lanes``: every tree its own lanes (see :meth:`broadcast`).
        """
        done = {}
        tree_key = self._tree_keys(shares)
        items, fresh, through = self._items, self.b.fresh, self._through_host
        for number, share in enumerate(shares):
            pieces = self._runs(share, number)
            m, root = len(pieces), share.root
            shape = _ReduceShape.of(share)
            keyed: dict = {}   # lanes of the tree -> each inner node's lane key
            for i, (j, width) in enumerate(pieces):
                lanes = tree_key(share, i) if own_lanes else ()
                keys = keyed.get(lanes)
                if keys is None:
                    keys = keyed[lanes] = [node[3] + lanes for node in shape.inner]
                partial: dict = {}
                for u in shape.leaves:
                    partial[u] = (_widen(contrib(u, j, share), width), None)
                # inner nodes, children first
                for (u, kids, height, _, staged), key in zip(shape.inner, keys):
                    own = _widen(contrib(u, j, share), width)
                    dst = fresh("scratch", u, own) if u != root else \
                        _widen(result(u, j, share), width)
                    t = (i + 0.5 + height) / m
                    srcs, tokens = [own], []
                    for c in kids:
                        if c in staged:
                            ref, token = through(t, m, c, u, *partial[c], lanes)
                        else:
                            ref, token = partial[c]
                        srcs.append(ref)
                        tokens.append(token)
                    seq = len(items)
                    items.append((t, seq, u, key, "reduce", dst, tuple(srcs), tuple(tokens)))
                    partial[u] = (dst, seq)
                done[root, j] = (partial[root][1], (i + 0.5 + shape.top) / m)
        return done

    def flush(self) -> None:
        """Append every collected item to the builder, earliest first: the items of one
        (rank, lane key) dealt round-robin over the key's sublanes (:meth:`_slot_lane`), each
        waiting for the instructions its tokens name. ``collectx._fastpath.emit_lanes`` runs
        the loop in C when it is built (the same instructions, lanes and lane numbers)."""
        items = self._items
        items.sort(key=_BY_TIME)
        native = compiled_helper("emit_lanes")
        if native is not None:
            native(items, self.b.lane_lists(), self._lane_keys, self.sublanes, MAX_LANES,
                   self.tag_sublanes, Instr, Dep)
            items.clear()
            return
        dep_of: list = [None] * len(items)   # item sequence number -> its Dep
        fixed: dict = {}   # (rank, key) -> lane, for keys of one sublane
        slots: dict = {}   # (rank, key) -> [items so far, {sublane: lane}, sublanes]
        append = self.b.appender()   # ranks come from the shares, lanes from self.lane
        for t, seq, rank, key, op, dst, srcs, tokens in items:
            lane = fixed.get((rank, key))
            if lane is None:
                lane = self._slot_lane(rank, key, fixed, slots)
            if len(tokens) == 1:   # most items wait for one producer or none
                k = tokens[0]
                wait = () if k is None else (dep_of[k],)
            else:
                wait = tuple(dep_of[k] for k in tokens if k is not None)
                if len(wait) > 1:
                    wait = tuple(dict.fromkeys(wait))
            dep_of[seq] = append(rank, lane, op, dst, srcs, wait)
        items.clear()

    def _slot_lane(self, rank: int, key, fixed: dict, slots: dict) -> int:
        """The lane of the next item of ``rank`` under lane ``key``: its sublanes
        (:attr:`tag_sublanes` of its tag, else :attr:`sublanes`) are dealt round-robin; a key
        with one sublane is entered in ``fixed`` for good."""
        slot = slots.get((rank, key))
        if slot is None:
            slot = slots[rank, key] = [0, {}, self.tag_sublanes.get(key[0], self.sublanes)]
        sub = slot[0] % slot[2]
        slot[0] += 1
        lane = slot[1].get(sub)
        if lane is None:
            lane = slot[1][sub] = self.lane(rank, (key, sub))
        if slot[2] == 1:
            fixed[rank, key] = lane
        return lane

    def _tree_keys(self, shares):
        """``(share, i) -> ("tree", tree number, lane of the tree)`` for ``own_lanes``.

        A tree gets up to :attr:`tree_lanes` lanes per link, as many as its chunks are
        multiples of the fewest any tree has, and deals its chunks over them in turn. Links
        share their bandwidth equally among the transfers on them, so a tree planned at four
        times another's rate must move as four concurrent transfers to get that rate where
        the two meet (GPUs 0-4, 6, 7 of dgx1v, trees at 25 / 12.5 / 6.25 GB/s: 0.88 of the
        packing's rate with up to four lanes per tree against 0.84 with one)."""
        fewest = min((len(s.chunks) for s in shares if s.chunks), default=1)
        tree: dict = {}   # id(share) -> (tree number, lanes)
        for s in shares:
            tree[id(s)] = (len(tree), max(1, min(self.tree_lanes, round(len(s.chunks) / fewest))))

        def key(share, i: int) -> tuple:
            number, lanes = tree[id(share)]
            return ("tree", number, i % lanes)
        return key

    def self_copy(self, rank: int, dst: Ref, src: Ref) -> None:
        """Rank-local copy (a root's own slot), first thing on its own lane."""
        self._add(-1.0, rank, ("self",), "copy", dst, (src,), ())

    def _add(self, t, rank, key, op, dst, srcs, tokens) -> int:
        seq = len(self._items)
        self._items.append((t, seq, rank, key, op, dst, srcs, tokens))
        return seq

    def _hop(self, t, m, share: Share, p: int, c: int, key, dst: Ref, source: Ref, token):
        """Copy ``source`` (on ``p``) to ``dst`` (on ``c``), staged through ``p``'s host buffer
        where the share stages edge ``(p, c)``; returns the token of the copy into ``dst``.
        ``key`` is ``("down", p)`` plus what singles out the tree's lanes (a tree's or a
        root's; nothing on shared lanes), which the staged copies take on as well."""
        if (p, c) not in share.staged:
            return self._add(t, c, key, "copy", dst, (source,), (token,))
        hop, up = self._stage_up(t - 0.5 / m, p, c, source, token, key[2:])
        return self._add(t, c, key + ("host",), "copy", dst, (hop,), (up,))

    def _through_host(self, t, m, sender: int, receiver: int, ref: Ref, token,
                      lanes=()) -> tuple:
        """``ref`` (on ``sender``) staged into a fresh scratch chunk of ``receiver``: (that
        Ref, token of the copy). A reduction then reads it locally: reading the host copy
        itself would tie the reduction's NVLink inputs to the pace of PCIe."""
        hop, up = self._stage_up(t - 0.6 / m, sender, receiver, ref, token, lanes)
        mine = self.b.fresh("scratch", receiver, ref)
        return mine, self._add(t - 0.3 / m, receiver, ("host down", sender) + lanes, "copy",
                               mine, (hop,), (up,))

    def _stage_up(self, t, sender: int, receiver: int, ref: Ref, token, lanes=()) -> tuple:
        """``sender`` copies ``ref`` into a fresh chunk of its host buffer for ``receiver``
        (one copy serves every receiver of the same data): returns (that host Ref, token of
        the copy)."""
        key = (ref, token)
        if key not in self._staged:
            hop = self.b.fresh("host", sender, ref)
            self._staged[key] = (hop, self._add(t, sender, ("host up", receiver) + lanes, "copy",
                                                hop, (ref,), (token,)))
        return self._staged[key]


@dataclass(frozen=True)
class _ReduceShape:
    """What a reduction over one share's tree does for every chunk alike: the leaves, and
    per inner node, children first, ``(node, children, height, lane key, children staged
    up to it)`` (height = levels above the deepest leaf, whose reduction runs first)."""

    leaves: tuple
    inner: tuple
    top: int

    @classmethod
    def of(cls, share: Share) -> "_ReduceShape":
        kids: dict = {}
        level = {share.root: 0}
        for p, c in share.edges:
            kids.setdefault(p, []).append(c)
            level[c] = level[p] + 1
        top = max(level.values())
        order = list(reversed([share.root] + [c for _, c in share.edges]))
        inner = []
        for u in order:
            if u not in kids:
                continue
            staged = frozenset(c for c in kids[u] if (u, c) in share.staged_up)
            key = ("up", tuple(kids[u]))
            if staged:
                key += ("host",)   # PCIe-paced: never queue with NVLink-fed reductions
            inner.append((u, tuple(kids[u]), top - level[u], key, staged))
        return cls(tuple(u for u in order if u not in kids), tuple(inner), top)


def _piece_runs(chunks, width: int, first: int) -> list:
    """``[(first chunk, count)]``: consecutive ``chunks`` in runs of ``width``, the first run
    ``first`` chunks long (none when 0).

    >>> _piece_runs(range(5), 2, 1), _piece_runs(range(4), 2, 0)
    ([(0, 1), (1, 2), (3, 2)], [(0, 2), (2, 2)])
    """
    chunks = tuple(chunks)
    first = min(first, len(chunks))
    head = [(chunks[0], first)] if first else []
    return head + [(chunks[a], len(chunks[a:a + width])) for a in range(first, len(chunks), width)]


_REF = tuple.__new__


def chunk_refs(buf: str, per_root: int = 0) -> RefFn:
    """The :data:`RefFn` ``(v, j, share) -> Ref(v, buf, share.root * per_root + j)``, building
    the Ref without the named tuple's Python ``__new__``: emitters call it for every chunk
    at every node, 10^5 times a plan.

    >>> chunk_refs("output", 4)(1, 2, Share(3, (), (2,)))
    Ref(rank=1, buf='output', chunk=14, count=1)
    """
    if per_root:
        return lambda v, j, s: _REF(Ref, (v, buf, s.root * per_root + j, 1))
    return lambda v, j, s: _REF(Ref, (v, buf, j, 1))


def _widen(ref: Ref, n: int) -> Ref:
    return ref if n == 1 else _REF(Ref, (ref[0], ref[1], ref[2], n))


def pack_rooted(G: nx.DiGraph, ranks, roots, reverse: bool,
                host: bool | str = False, lean: bool = True) -> tuple[Packing, tuple]:
    """Out-trees from ``roots`` (in-trees to them with ``reverse``) priced by simulator routes.

    Returns the packing and the link capacities its paths index (of the reversed graph for
    in-trees, whose packing runs on the reversed graph). ``host`` also offers every GPU pair
    joined by a direct link (with ``host="any"``, every GPU pair) its route staged through
    host memory (:func:`collectx.topology.view.host_routes`); the trees then mark the edges that take
    it (``Tree.staged``), and the LP's forest is kept as it is: by default its least loaded
    optimum (``lean``, :func:`~.treepack.pack_out_trees`), else the LP's vertex. Without
    ``host``: one equal-rate tree per root where that keeps the LP's rate, else the LP's
    optimum of least rate-weighted depth (:func:`~.treepack.shallowest`).
    """
    H = G.reverse(copy=True) if reverse else G
    index = LinkIndex.of(H)
    routes = simulator_routes(G, index, ranks, reverse=reverse)
    if host:
        alternatives = host_routes(G, index, ranks, reverse=reverse, any_pair=host == "any")
        return pack_out_trees(index, ranks, roots, routes=routes, alternatives=alternatives,
                              lean=lean), index.caps
    packing = _balanced_or(_shallow_out_trees(index, ranks, roots, routes), index, ranks, roots,
                           routes)
    if len(roots) == 1:
        relay = pack_relay_trees(index, ranks, roots[0], routes)
        if relay is not None and relay.rate >= packing.rate * RELAY_KEEP:
            packing = relay
        elif not _equal_rates(packing):
            unit = pack_unit_trees(index, ranks, roots[0], routes, packing.rate)
            if unit is not None and unit.rate >= packing.rate * RELAY_KEEP:
                packing = unit
    return packing, index.caps


def _shallow_out_trees(index, ranks, roots, routes) -> Packing:
    return shallowest(pack_out_trees(index, ranks, roots, routes=routes), index.caps)


def _equal_rates(packing: Packing) -> bool:
    rates = [t.rate for t in packing.trees]
    return max(rates) <= min(rates) * (1 + 1e-6)


def pack_rooted_mirrored(G: nx.DiGraph, ranks, roots, balanced: bool = True,
                         host: bool | str = False, lean: bool = True) -> dict:
    """Out-tree and in-tree packings from ``roots``: ``{False: out, True: in}`` as
    :func:`pack_rooted` gives them, solving one LP when the two problems are mirror images.
    ``balanced=False`` keeps the LP's forests (no equal-rate trees).

    On symmetric machines (every link as wide as its reverse, every GPU pair routed back along
    the same links) the in-tree problem on the reversed graph is the out-tree problem itself,
    so its packing serves both (tree edges are GPU pairs; paths index the same capacities).
    ``host`` and ``lean`` as in :func:`pack_rooted` (no equal-rate trees then either).
    """
    if host:
        return {rev: pack_rooted(G, ranks, roots, rev, host=host, lean=lean)
                for rev in (False, True)}
    index = LinkIndex.of(G)
    routes = simulator_routes(G, index, ranks)
    keep = _balanced_or if balanced else (lambda packing, *_: packing)
    out = keep(_shallow_out_trees(index, ranks, roots, routes), index, ranks, roots, routes), \
        index.caps
    rindex = LinkIndex.of(G.reverse(copy=True))
    rroutes = simulator_routes(G, rindex, ranks, reverse=True)
    if _named(index, routes) == _named(rindex, rroutes) and \
            dict(zip(index.links, index.caps)) == dict(zip(rindex.links, rindex.caps)):
        return {False: out, True: out}
    back = keep(_shallow_out_trees(rindex, ranks, roots, rroutes), rindex, ranks, roots,
                rroutes)
    return {False: out, True: (back, rindex.caps)}


def _balanced_or(packing: Packing, index, ranks, roots, routes) -> Packing:
    """One equal-rate tree per root instead of the LP's forest when it keeps the LP's rate:
    built along the switch hierarchy on tree-shaped fabrics (shallow by construction), else
    searched for."""
    if len(roots) < 2:
        return packing
    balanced = pack_switch_trees(index, ranks, roots, routes, packing.rate)
    if balanced is None or balanced.rate < packing.rate * RELAY_KEEP:
        balanced = pack_balanced_trees(index, ranks, roots, routes, start=packing)
    if balanced is not None and balanced.rate >= packing.rate * RELAY_KEEP:
        return balanced
    return packing


def _named(index: LinkIndex, routes: dict) -> dict:
    return {pair: sorted((index.links[link], share) for link, share in use)
            for pair, use in routes.items()}


def pack_both_ways(G: nx.DiGraph, ranks, host: bool | str = False,
                   lean: bool = True) -> tuple[Packing, tuple]:
    """Spanning trees used up and down (Blink allreduce), priced by simulator routes; ``host``
    and ``lean`` as in :func:`pack_rooted`, each way of an edge on its own."""
    index = LinkIndex.of(G)
    routes = simulator_routes(G, index, ranks)
    alternatives = host_routes(G, index, ranks, any_pair=host == "any") if host else None
    return pack_undirected_trees(index, ranks, routes=routes, alternatives=alternatives,
                                 lean=lean and bool(host)), index.caps
