"""Which of a job's GPUs the machine cannot tell apart: automorphisms of its job graph.

Why: an LP whose rows an automorphism of the graph maps onto themselves (the all-roots multicast
bound, say) has an optimum the automorphism fixes: average any optimum over the automorphisms,
and the average is feasible and as good. In that optimum, roots an automorphism carries onto
each other use the links the same way, carried along, so the LP needs the variables of one root
per orbit only. On machines built of repeated parts (the GCD pairs of an MI250 node, the hives
of an MI100 one) that makes it several times smaller.

How: colour refinement (a node's colour is its kind and, repeatedly, the multiset of its
links' capacities and neighbours' colours) splits nodes no automorphism can swap. To carry a
representative onto a GPU of its colour, the two are pinned (given a colour of their own) and
refined again, then nodes of each class that is still shared are pinned pair by pair the same
way until every class holds one node: that pairing is an automorphism if it keeps every link,
and the search backs up to the last choice if not (nauty's individualisation and refinement,
without its pruning).
"""

from __future__ import annotations

import networkx as nx

DEAD_ENDS = 64   # pairings tried and refused before a GPU is left in an orbit of its own: on
                 # machines the first pairing of twin nodes always works (twins are wired alike);
                 # giving up loses only the LP's reduction, never its optimum


def orbits(G: nx.DiGraph, gpus, capacity: str = "cap") -> tuple:
    """``gpus`` in orbits of ``G``'s automorphisms: per orbit, ``(representative, members)``,
    ``members`` a tuple of ``(gpu, mapping)`` whose mapping (every node of ``G`` to its image)
    is an automorphism carrying the representative onto that GPU; the representative comes
    first, with the identity.

    >>> from collectx.topology import ring
    >>> G = ring(4, bw=25.0)
    >>> nx.set_edge_attributes(G, 25.0, "cap")
    >>> [(rep, [gpu for gpu, _ in members]) for rep, members in orbits(G, list(G))]
    [('GPU0', ['GPU0', 'GPU1', 'GPU2', 'GPU3'])]

    A GPU with a faster link to one neighbour has no automorphism to the others:

    >>> G.edges["GPU0", "GPU1"]["cap"] = 50.0
    >>> len(orbits(G, list(G)))
    4
    """
    graph = _Graph(G, capacity)
    colour = graph.refined([(str(G.nodes[v].get("kind")), v in gpus) for v in graph.nodes])
    at = {v: i for i, v in enumerate(graph.nodes)}
    found: list = []
    for gpu in gpus:
        for rep, members in found:
            if colour[at[rep]] == colour[at[gpu]]:
                carry = graph.carrying(colour, at[rep], at[gpu])
                if carry is not None:
                    members.append((gpu, {graph.nodes[i]: graph.nodes[j]
                                          for i, j in enumerate(carry)}))
                    break
        else:
            found.append((gpu, [(gpu, {v: v for v in G})]))
    return tuple((rep, tuple(members)) for rep, members in found)


class _Graph:
    """``G`` with nodes numbered and links as (capacity number, neighbour) lists."""

    def __init__(self, G: nx.DiGraph, capacity: str):
        self.nodes = list(G)
        at = {v: i for i, v in enumerate(self.nodes)}
        caps = {c: i for i, c in enumerate(sorted({c for _, _, c in G.edges(data=capacity)}))}
        self.out = [[(caps[c], at[w]) for _, w, c in G.out_edges(v, capacity)] for v in G]
        self.into = [[(caps[c], at[u]) for u, _, c in G.in_edges(v, capacity)] for v in G]
        self.links = {(at[u], at[w], caps[c]) for u, w, c in G.edges(data=capacity)}

    def refined(self, label: list) -> list:
        """Colour refinement from ``label`` (comparable per node) until no class splits,
        colours numbered in the sorted order of what decides them: the same labels on the
        same graph give the same colours."""
        colour = _numbered(label)
        while True:
            signature = [(colour[v], tuple(sorted((c, colour[w]) for c, w in self.out[v])),
                          tuple(sorted((c, colour[u]) for c, u in self.into[v])))
                         for v in range(len(colour))]
            refined = _numbered(signature)
            if max(refined) == max(colour):
                return refined
            colour = refined

    def carrying(self, colour: list, a: int, b: int) -> list | None:
        """An automorphism (node i to the returned list's i-th) keeping ``colour`` and carrying
        ``a`` onto ``b``, or None."""
        dead_ends = [DEAD_ENDS]
        return self._paired(self._pinned(colour, a), self._pinned(colour, b), dead_ends)

    def _pinned(self, colour: list, v: int) -> list:
        return self.refined([(c, u == v) for u, c in enumerate(colour)])

    def _paired(self, mine: list, theirs: list, dead_ends: list) -> list | None:
        if sorted(mine) != sorted(theirs):
            return None
        cells = {}
        for v, c in enumerate(mine):
            cells.setdefault(c, []).append(v)
        shared = [c for c, members in cells.items() if len(members) > 1]
        if not shared:
            carry = [0] * len(mine)
            where = {c: v for v, c in enumerate(theirs)}
            for v, c in enumerate(mine):
                carry[v] = where[c]
            return carry if all((carry[u], carry[w], c) in self.links
                                for u, w, c in self.links) else None
        cell = min(shared, key=lambda c: (len(cells[c]), c))
        v = cells[cell][0]
        for w in (u for u, c in enumerate(theirs) if c == cell):
            if dead_ends[0] <= 0:
                return None
            carry = self._paired(self._pinned(mine, v), self._pinned(theirs, w), dead_ends)
            if carry is not None:
                return carry
            dead_ends[0] -= 1
        return None


def _numbered(label: list) -> list:
    """Labels as small integers, numbered in sorted order (the same labels, the same numbers)."""
    number = {x: i for i, x in enumerate(sorted(set(label)))}
    return [number[x] for x in label]
