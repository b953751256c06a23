"""Equal-rate per-root trees built along the switch hierarchy of tree-shaped fabrics.

How it works
------------
On PCIe machines the relays (PCIe switches, CPU sockets, NICs) form a tree and every GPU hangs
off one relay. Root ``r``'s unit then reaches every GPU with one transfer per GPU, and the only
choices are who sends each one and how often a relay link is crossed. Walking the relay tree
from ``r``'s switch:

- the GPUs of a relay get the unit from that relay's *holder* (``r`` on its own switch; on
  another switch, the GPU that entered it first), so switch-mates relay to each other and the
  links above the switch carry the unit once;
- a relay's child subtrees are each fed by the holder (or, through a relay without GPUs, by
  the holder above it) directly, which keeps the tree shallow, unless the links on the way
  would exceed their share, e.g. the socket interconnect: then the subtrees are fed by one
  entry GPU, which becomes the holder for the rest (one crossing per root, one more hop).

Entries are the least-loaded GPUs (uplink transfers so far), so every GPU's own link ends up
with the ``N - 1`` transfers the cut bound allows. All trees get the same rate, so a link
crossed by ``k`` tree edges carries ``k`` equal transfers, which is what the simulator's equal
sharing gives them (see :func:`~.treepack.pack_balanced_trees`).
"""

from __future__ import annotations

import numpy as np

from ..topology.view import LinkIndex
from .treepack import Packing, Tree, _top_down


def pack_switch_trees(index: LinkIndex, gpus, roots, routes: dict,
                      rate: float) -> Packing | None:
    """One out-tree per root along the relay tree, each at one common rate.

    ``rate`` (GB/s per root, e.g. the LP packing's) sizes how many transfers each link may
    take. Returns None when the fabric is not tree-shaped (relays not a tree, or a GPU on
    several links) or some GPU pair has no route.
    """
    gpus = tuple(gpus)
    shape = _relay_tree(index, gpus)
    if shape is None or rate <= 0 or any((a, b) not in routes for a in gpus for b in gpus
                                         if a != b):
        return None
    attach, nbrs = shape
    caps = np.asarray(index.caps, dtype=float)
    load = np.zeros(len(caps))
    limit = caps / rate * (1 + 1e-9)
    sends = {g: 0 for g in gpus}
    crossing = _roots_behind(index, gpus, attach, nbrs, roots)
    parents = {}
    for r in roots:
        parents[r] = _grow(r, gpus, attach, nbrs, routes, load, limit, sends, crossing)
    _even_out(parents, attach, sends)
    load = np.zeros(len(caps))
    for par in parents.values():
        for c, p in par.items():
            _add(load, routes[p, c], 1.0)
    each = float(min(caps[e] / k for e, k in enumerate(load) if k > 1e-12))
    at = {g: i for i, g in enumerate(gpus)}
    trees = []
    for r in roots:
        par = [-1] * len(gpus)
        for c, p in parents[r].items():
            par[at[c]] = at[p]
        edges = _top_down(gpus, par, at[r])
        trees.append(Tree(r, r, edges, tuple(routes[e] for e in edges), each))
    return Packing(rate=each, trees=tuple(trees), rounds=1, columns=tuple(trees),
                   balanced=True)


def tree_shaped(G, gpus) -> bool:   # G: a job graph (see collectx.topology.view.job_graph)
    """Whether :func:`pack_switch_trees` applies to the job graph ``G``: every GPU on one
    relay, the relays a tree.

    >>> import collectx.topology as T
    >>> from collectx.topology.view import job_graph
    >>> G = T.load("pcie_gen4_8gpu")
    >>> R = T.ring(4)
    >>> tree_shaped(job_graph(G, T.gpus(G)), T.gpus(G)), tree_shaped(job_graph(R, T.gpus(R)), T.gpus(R))
    (True, False)
    """
    return _relay_tree(LinkIndex.of(G), tuple(gpus)) is not None


def _relay_tree(index: LinkIndex, gpus) -> tuple[dict, dict] | None:
    """``(attach, nbrs)``: each GPU's one relay, and the relays' undirected adjacency; None
    unless every GPU has exactly one neighbour, a relay, and the relays form a tree."""
    terminals = set(gpus)
    nbrs: dict = {n: set() for n in index.nodes}
    for u, v in index.links:
        nbrs[u].add(v)
        nbrs[v].add(u)
    attach = {}
    for g in gpus:
        if len(nbrs[g]) != 1 or next(iter(nbrs[g])) in terminals:
            return None
        attach[g] = next(iter(nbrs[g]))
    relays = {n for n in index.nodes if n not in terminals}
    radj = {x: {y for y in nbrs[x] if y in relays} for x in relays}
    edges = sum(len(a) for a in radj.values()) // 2
    start = next(iter(relays))
    seen, stack = {start}, [start]
    while stack:
        for y in radj[stack.pop()]:
            if y not in seen:
                seen.add(y)
                stack.append(y)
    if len(seen) != len(relays) or edges != len(relays) - 1:
        return None
    return attach, radj


def _grow(r, gpus, attach, nbrs, routes, load, limit, sends, crossing) -> dict:
    """Parent of every GPU in root ``r``'s tree (``{child: parent}``); updates ``load`` and
    ``sends`` with its transfers."""
    members: dict = {}
    for g in gpus:
        members.setdefault(attach[g], []).append(g)
    top = attach[r]
    children, order = _rooted(top, nbrs)
    below = {x: [] for x in order}
    for x in reversed(order):
        below[x] = list(members.get(x, ())) + [g for y in children[x] for g in below[y]]
    parent: dict = {}

    def send(p, c):
        parent[c] = p
        sends[p] += 1
        _add(load, routes[p, c], 1.0)

    def direct(holder, targets) -> bool:
        # whether every root feeding this many subtrees straight would fit the relay links
        uses: dict = {}
        for c in targets:
            for link, w in routes[holder, c]:
                if link in crossing:
                    uses[link] = uses.get(link, 0.0) + w
        return all(k * crossing[link] <= limit[link] for link, k in uses.items())

    def feed(x, feeder):
        """Deliver the unit to relay ``x``'s subtree from ``feeder``; returns its entry."""
        holder = entry = feeder
        if members.get(x):
            if x != top:
                entry = holder = _entry(x, children, members, below, sends)
                send(feeder, entry)
            for g in members[x]:
                if g != holder:
                    send(holder, g)
        subs = [y for y in children[x] if below[y]]
        if not subs:
            return entry
        entries = {y: _entry(y, children, members, below, sends) for y in subs}
        if len(subs) == 1 or direct(holder, list(entries.values())):
            got = [feed(y, holder) for y in subs]
        else:   # one crossing: the least-loaded entry's subtree first, its entry feeds the rest
            subs.sort(key=lambda y: (sends[entries[y]], str(entries[y])))
            got = [feed(subs[0], holder)]
            got += [feed(y, got[0]) for y in subs[1:]]
        return entry if members.get(x) else got[0]

    feed(top, r)
    return parent


def _roots_behind(index: LinkIndex, gpus, attach, nbrs, roots) -> dict:
    """``{link id: roots on its tail side}`` for every link between two relays: the trees
    that must cross it at least once when each root feeds the far side once."""
    rootset = set(roots)
    out = {}
    for link, (u, v) in enumerate(index.links):
        if u not in nbrs or v not in nbrs:
            continue
        side, stack = {u}, [u]
        while stack:
            for y in nbrs[stack.pop()]:
                if y not in side and y != v:
                    side.add(y)
                    stack.append(y)
        out[link] = sum(1 for g in gpus if g in rootset and attach[g] in side)
    return out


def _even_out(parents: dict, attach: dict, sends: dict) -> None:
    """Hand a switch's entry role (with all its sends) to a switch-mate where that lowers the
    busier of the two GPUs' uplink transfers. Both routes cross the same relay links, so
    only the two GPUs' own links see the change."""
    for _ in range(len(sends)):
        moved = False
        for r, par in parents.items():
            for e in [g for g in par if attach[par[g]] != attach[g]]:
                kids = [k for k, p in par.items() if p == e]
                for m in kids:
                    if attach[m] != attach[e]:
                        continue
                    c = len(kids)
                    if max(sends[e] - c, sends[m] + c) >= max(sends[e], sends[m]):
                        continue
                    par[m] = par[e]
                    par[e] = m
                    for k in kids:
                        if k != m:
                            par[k] = m
                    sends[e] -= c
                    sends[m] += c
                    moved = True
                    break
        if not moved:
            return


def _rooted(top, nbrs) -> tuple[dict, list]:
    children: dict = {top: []}
    order = [top]
    for x in order:
        for y in sorted(nbrs[x], key=str):
            if y not in children:
                children[x].append(y)
                children[y] = []
                order.append(y)
    return children, order


def _entry(y, children, members, below, sends):
    """The least-loaded GPU among those nearest to relay ``y`` in its subtree."""
    level = [y]
    while level:
        here = [g for x in level for g in members.get(x, ())]
        if here:
            return min(here, key=lambda g: (sends[g], str(g)))
        level = [c for x in level for c in children[x]]
    return min(below[y], key=lambda g: (sends[g], str(g)))


def _add(load, route, k: float) -> None:
    for link, w in route:
        load[link] += k * w
