"""Which of a job's GPUs the machine cannot tell apart: automorphisms of its job graph.

Why: an LP whose rows an automorphism of the graph maps onto themselves (the all-roots multicast
bound, say) has an optimum the automorphism fixes: average any optimum over the automorphisms,
and the average is feasible and as good. In that optimum, roots an automorphism carries onto
each other use the links the same way, carried along, so the LP needs the variables of one root
per orbit only. On machines built of repeated parts (the GCD pairs of an MI250 node, the hives
of an MI100 one) that makes it several times smaller.

How: colour refinement (a node's colour is its kind and, repeatedly, the multiset of its
links' capacities and neighbours' colours) splits nodes no automorphism can swap; then VF2
(networkx) looks for one automorphism that carries a representative onto a GPU of its colour,
the two pinned by an extra label. An automorphism keeps node kinds, link capacities and which
nodes are the given GPUs.
"""

from __future__ import annotations

import networkx as nx
from networkx.algorithms.isomorphism import DiGraphMatcher


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
    colour = _refined(G, set(gpus), capacity)
    found: list = []
    for gpu in gpus:
        for rep, members in found:
            if colour[rep] == colour[gpu]:
                mapping = _carrying(G, colour, rep, gpu, capacity)
                if mapping is not None:
                    members.append((gpu, mapping))
                    break
        else:
            found.append((gpu, [(gpu, {v: v for v in G})]))
    return tuple((rep, tuple(members)) for rep, members in found)


def _refined(G: nx.DiGraph, gpus: set, capacity: str) -> dict:
    """Colour refinement from (kind, in ``gpus``) until no class splits: nodes of different
    colours are in different orbits (the converse need not hold)."""
    colour = _numbered({v: (str(G.nodes[v].get("kind")), v in gpus) for v in G})
    while True:
        signature = {v: (colour[v],
                         tuple(sorted((c, colour[w]) for _, w, c in G.out_edges(v, capacity))),
                         tuple(sorted((c, colour[u]) for u, _, c in G.in_edges(v, capacity))))
                     for v in G}
        refined = _numbered(signature)
        if len(set(refined.values())) == len(set(colour.values())):
            return refined
        colour = refined


def _numbered(label: dict) -> dict:
    """Labels as small integers, numbered in sorted order (the same labels, the same numbers)."""
    number = {x: i for i, x in enumerate(sorted(set(label.values())))}
    return {v: number[x] for v, x in label.items()}


def _carrying(G: nx.DiGraph, colour: dict, a, b, capacity: str) -> dict | None:
    """An automorphism of ``G`` (colours and capacities kept) that carries ``a`` onto ``b``,
    or None."""
    def pinned(at):
        H = nx.DiGraph()
        H.add_nodes_from((v, {"x": (colour[v], v == at)}) for v in G)
        H.add_edges_from((u, v, {"c": c}) for u, v, c in G.edges(data=capacity))
        return H
    matcher = DiGraphMatcher(pinned(a), pinned(b), node_match=lambda p, q: p["x"] == q["x"],
                             edge_match=lambda p, q: p["c"] == q["c"])
    return dict(matcher.mapping) if matcher.is_isomorphic() else None
