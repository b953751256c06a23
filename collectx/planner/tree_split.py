"""Split an undirected multigraph of tree edges into edge-disjoint spanning trees (Edmonds'
matroid partition).

Why
---
:mod:`~.exact_mixes` counts how many tree edges each GPU pair carries; these functions turn the
counts into the trees themselves. Where the counts meet Nash-Williams–Tutte's condition (every
partition into ``p`` parts crossed ``k (p - 1)`` times) they split into ``k`` spanning trees.
Out-trees from a root are :func:`~.integral_trees.disjoint_arborescences`' (Lovász).
"""

from __future__ import annotations


def partition_forests(ends: list, k: int) -> list[set] | None:
    """Edges ``ends`` (vertex pairs, repeats allowed) dealt into ``k`` forests covering all of
    them, as sets of edge indices, or None where no such split exists (Edmonds' matroid
    partition: each edge enters by the shortest chain of swaps).

    >>> sorted(map(sorted, partition_forests([(0, 1), (1, 2), (0, 2), (0, 1)], 2)))
    [[0, 1], [2, 3]]
    >>> partition_forests([(0, 1)] * 3, 2) is None
    True
    """
    forests: list[set] = [set() for _ in range(k)]
    for x in range(len(ends)):
        if not _insert(forests, ends, x):
            return None
    return forests


def _insert(forests: list[set], ends: list, x: int) -> bool:
    """Add edge ``x``: breadth first over swaps (``e`` enters forest ``i`` and pushes out an
    edge of the cycle it closes there) until some edge enters a forest without a cycle."""
    came = {x: None}
    queue = [x]
    for e in queue:
        for i, forest in enumerate(forests):
            if e in forest:
                continue
            cycle = _tree_path(forest, ends, *ends[e])
            if cycle is None:
                forest.add(e)
                while came[e] is not None:   # unwind: each edge takes its successor's place
                    before, j = came[e]
                    forests[j].discard(e)
                    forests[j].add(before)
                    e = before
                return True
            for f in cycle:
                if f not in came:
                    came[f] = (e, i)
                    queue.append(f)
    return False


def _tree_path(forest: set, ends: list, a, b) -> list | None:
    """The edges of ``forest`` joining ``a`` to ``b``, or None if they are not joined."""
    if a == b:
        return []
    adj: dict = {}
    for e in forest:
        u, v = ends[e]
        adj.setdefault(u, []).append((v, e))
        adj.setdefault(v, []).append((u, e))
    back = {a: None}
    frontier = [a]
    for u in frontier:
        for v, e in adj.get(u, ()):
            if v not in back:
                back[v] = (u, e)
                frontier.append(v)
    if b not in back:
        return None
    path = []
    while back[b] is not None:
        b, e = back[b]
        path.append(e)
    return path
