"""Double binary trees (NCCL's): latency-friendly allreduce, broadcast and reduce.

How it works. Tree 0 is the binary tree NCCL builds from bit tricks (:func:`tree_neighbors`);
tree 1 is its mirror (rank ``n-1-r``) for even ``n`` or its shift by one for odd ``n``, so a
rank that is interior in one tree is (mostly) a leaf in the other and both trees' links carry
data at once. Each tree carries half the payload, cut into pieces that are pipelined: a rank
reduces piece ``p`` as soon as its children have, while its parent works on ``p-1``.

* allreduce: reduce up each tree into the output buffer (an interior rank's one n-ary reduce
  reads its input and its children's partials), then broadcast down (each rank pulls the final
  piece from its parent). Up and down of each tree run on their own lanes, so the broadcast of
  early pieces overlaps the reduction of later ones.
* broadcast / reduce: both trees are re-rooted at the root (virtual rank ``v = r - root``);
  tree 1 is the shift of tree 0 over ranks ``1..n-1``, which turns tree 0's leaves (odd ``v``)
  into interior ranks. Reduce keeps partials in scratch (non-root outputs stay untouched).

Depth is ``O(log n)`` steps per piece (a ring needs ``O(n)``), at the cost of interior ranks
moving up to three pieces per step; the cost model prefers trees for small messages."""

from __future__ import annotations

import networkx as nx

from ..errors import PlanError
from ..schedule.builder import LaneBuilder
from ..schedule.ir import Ref, Schedule
from ._build import check_args
from .cost_tables import pipeline_pieces, route_terms

SUPPORTED = ("allreduce", "broadcast", "reduce")


def tree_neighbors(rank: int, nranks: int) -> tuple[int, tuple[int, ...]]:
    """Parent (-1 for the root) and children of ``rank`` in NCCL's binary tree.

    The tree hangs off rank 0; a rank's lowest set bit says its level::

        nranks = 8:          0
                             |
                             4
                           /   \\
                          2     6
                         / \\   / \\
                        1   3 5   7

    Odd ranks are leaves; rank 0 has a single child (the largest power of two below nranks).

    >>> tree_neighbors(4, 8), tree_neighbors(0, 8), tree_neighbors(7, 8)
    ((0, (2, 6)), (-1, (4,)), (6, ()))
    >>> tree_neighbors(4, 6)  # 4 + 2 = 6 is out of range, so 4 adopts 5
    (0, (2, 5))
    """
    if not 0 <= rank < nranks:
        raise PlanError(f"rank {rank} with {nranks} ranks: expected 0 <= rank < {nranks}")
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ((bit >> 1,) if nranks > 1 else ())
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    low = bit >> 1
    if low == 0:
        return up, ()
    down1 = rank + low
    while down1 >= nranks and low:
        low >>= 1
        down1 = rank + low
    return up, ((rank - (bit >> 1),) + ((down1,) if low else ()))


def double_tree(nranks: int) -> tuple[list[int], list[int]]:
    """Parents of every rank in NCCL's two trees (mirror for even, shift for odd ``nranks``).

    >>> double_tree(4)
    ([-1, 2, 0, 2], [1, 3, 1, -1])
    """
    t0 = [tree_neighbors(r, nranks)[0] for r in range(nranks)]
    if nranks % 2 == 0:
        role = [nranks - 1 - r for r in range(nranks)]
    else:
        role = [(r - 1) % nranks for r in range(nranks)]
    back = {v: r for r, v in enumerate(role)}
    t1 = [-1 if t0[role[r]] < 0 else back[t0[role[r]]] for r in range(nranks)]
    return t0, t1


def rooted_trees(nranks: int, root: int) -> tuple[list[int], list[int]]:
    """Parents in two trees that are both rooted at ``root`` (for broadcast and reduce).

    >>> rooted_trees(4, 0)  # tree 0: 0 -> 2 -> {1, 3}; tree 1: 0 -> 3 -> {1, 2}
    ([-1, 2, 0, 2], [-1, 3, 3, 0])
    """
    n = nranks
    # tree 1 is tree 0 over v -> shift of 1..n-1, so that odd v (leaves of tree 0) get children
    roles = [list(range(n)), [0] + [((v - 2) % (n - 1)) + 1 for v in range(1, n)]]
    out = []
    for role in roles:
        back = {x: v for v, x in enumerate(role)}
        parent = []
        for r in range(n):
            v = (r - root) % n
            p = tree_neighbors(role[v], n)[0]
            parent.append(-1 if p < 0 else (back[p] + root) % n)
        out.append(parent)
    return out[0], out[1]


def plan_tree(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int, *,
              root: int = 0, inplace: bool = False, nchunks: int | None = None) -> Schedule:
    """Plan allreduce, broadcast or reduce over NCCL's double binary tree.

    Parameters are those of every planner (see :func:`collectx.planner.plan`). The default
    ``nchunks`` gives each of the two trees the pieces that pipeline its half of the message
    fastest (:func:`~.cost_tables.pipeline_pieces` over the tree's depth, at the bandwidth and
    latency of its narrowest and slowest edge). Trees follow rank order, as NCCL's do: the
    topology only sets the piece count.

    Examples
    --------
    >>> s = plan_tree(None, ("A", "B", "C", "D"), "allreduce", 4096)
    >>> s.nchunks, s.meta_dict()["trees"][0]
    (2, (-1, 2, 0, 2))
    """
    n = len(ranks)
    check_args(collective, n, root, nchunks)
    if collective not in SUPPORTED:
        raise PlanError(f"tree does not support {collective}; it supports {', '.join(SUPPORTED)}")
    trees = double_tree(n) if collective == "allreduce" else rooted_trees(n, root)
    c = nchunks or (1 if n == 1 else len(trees) * _pieces(topo, ranks, collective, trees,
                                                          nbytes / len(trees)))
    if n == 1 or c == 1:
        trees = trees[:1]
    b = LaneBuilder(collective, n, c, root=root, inplace=inplace)
    for t, parent in enumerate(trees):
        children = [[] for _ in range(n)]
        for r, p in enumerate(parent):
            if p >= 0:
                children[p].append(r)
        lo, hi = t * c // len(trees), (t + 1) * c // len(trees)
        for j in range(lo, hi):
            _BUILDERS[collective](b, 2 * t, parent, children, j)
    scratch = tuple(0 if r == root else 1 for r in range(n)) if collective == "reduce" else ()
    return b.schedule("tree", scratch_units=scratch,
                      meta={"trees": [tuple(p) for p in trees], "pattern": "double-tree"})


plan_tree.collectives = SUPPORTED


def _pieces(topo, ranks, collective: str, trees, share: float) -> int:
    """Pieces per tree: a piece climbs the tree (reduce), descends it (broadcast), or both."""
    pairs = [(p, r) for parent in trees for r, p in enumerate(parent) if p >= 0]
    bw, wait = route_terms(topo, ranks, pairs)
    hops = max(_depth(parent) for parent in trees) * (2 if collective == "allreduce" else 1)
    return pipeline_pieces(share, hops, bw, wait)


def _depth(parent) -> int:
    def level(r):
        return 0 if parent[r] < 0 else 1 + level(parent[r])
    return max(level(r) for r in range(len(parent)))


def _up(b: LaneBuilder, lane: int, parent, children, j: int, buf_of) -> dict:
    """Reduce piece ``j`` towards the root; returns rank -> (ref holding its partial, dep)."""
    held: dict[int, tuple[Ref, object]] = {}
    for r in reversed(_top_down(parent, children)):
        own = Ref(r, "input", j)
        if not children[r]:
            held[r] = (own, None)
            continue
        dst = Ref(r, buf_of(r), j)
        srcs = [own] + [held[k][0] for k in children[r]]
        held[r] = (dst, b.add(r, lane, "reduce", dst, srcs, [held[k][1] for k in children[r]]))
    return held


def _down(b: LaneBuilder, lane: int, parent, children, j: int, top_dep) -> None:
    got = {}
    for r in _top_down(parent, children):
        p = parent[r]
        got[r] = top_dep if p < 0 else b.add(r, lane, "copy", Ref(r, "output", j),
                                             [Ref(p, "output", j)], [got[p]])


def _allreduce(b: LaneBuilder, lane: int, parent, children, j: int) -> None:
    held = _up(b, lane, parent, children, j, lambda r: "output")
    top = parent.index(-1)
    ref, dep = held[top]
    if ref.buf == "input":  # a root without children (one rank): copy its input out
        dep = b.add(top, lane, "copy", Ref(top, "output", j), [ref])
    _down(b, lane + 1, parent, children, j, dep)


def _broadcast(b: LaneBuilder, lane: int, parent, children, j: int) -> None:
    root = b.root
    b.add(root, lane, "copy", Ref(root, "output", j), [Ref(root, "input", j)])
    got = {root: (Ref(root, "input", j), None)}
    for r in _top_down(parent, children):
        if r != root:
            src, wait = got[parent[r]]
            got[r] = (Ref(r, "output", j), b.add(r, lane, "copy", Ref(r, "output", j), [src],
                                                 [wait]))


def _reduce(b: LaneBuilder, lane: int, parent, children, j: int) -> None:
    root = b.root
    held = _up(b, lane, parent, children, j, lambda r: "output" if r == root else "scratch")
    if held[root][0].buf == "input":
        b.add(root, lane, "copy", Ref(root, "output", j), [held[root][0]])


def _top_down(parent, children) -> list[int]:
    order = [parent.index(-1)]
    for r in order:
        order.extend(children[r])
    return order


_BUILDERS = {"allreduce": _allreduce, "broadcast": _broadcast, "reduce": _reduce}
