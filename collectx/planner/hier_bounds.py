"""Bounds of symmetric multi-node clusters, exact and fast by symmetry and a NIC-counting argument.

The generic bounds (:mod:`.bounds`) run max-flows towards every GPU and a tree-packing LP over
all GPUs: minutes at 128 GPUs. On a cluster of ``n`` identical machines joined identically to
the network (``multi_node``: rails or one switch), two facts make them cheap and keep them exact:

* **Symmetry.** Any permutation of the machines maps the graph onto itself (rail ``i`` stays rail
  ``i``). The cut-rate test ``maxflow(s -> v) >= N x`` (all GPUs fed at rate ``x``) has the same
  value for ``v`` and its image, so it is enough to test the GPUs of machine 0. Pair max-flows
  from a GPU of machine 0 are the same towards every machine other than its own, so machine 0
  and machine 1 cover all pairs (likewise for broadcast/reduce from the root's machine).
* **Trees cannot beat the cut here.** An allreduce over spanning trees (reduce up, broadcast
  down) crosses between machines on at least ``n - 1`` tree edges, each used in both
  directions, and every crossing leaves a machine through a network link. So the tree rate
  ``T`` obeys ``2 (n-1) T <= U``, ``U`` the summed capacity of links leaving machines, and the
  tree busbw ``2(N-1)/N * T`` is at most ``2(N-1)/N * U / (2(n-1))``. When that is not above
  the reduce-scatter + allgather cut bound, the reference is the cut bound, exactly; otherwise
  this module returns None and the generic LP runs.

>>> from collectx.topology import multi_node, switch
>>> b = symmetric_bounds(multi_node(switch(2), 3, nic_bw=10.0), "allgather")
>>> round(b.bound_busbw, 2)   # (N-1) * min cut ratio: 5 * (2 NICs x 10 GB/s) / 4 GPUs
25.0
"""

from __future__ import annotations

import re

import networkx as nx

from ..topology.flows import cut_rate, min_pair_flow, rooted_flow
from ..topology.view import job_gpus, job_graph
from ..topology.view import without_turnarounds
from .bounds import Bounds

_PREFIX = re.compile(r"^n(\d+)/")


def symmetric_bounds(topo: nx.DiGraph, collective: str, gpus=None, root: int = 0
                     ) -> Bounds | None:
    """Bounds of ``collective`` on a symmetric multi-node allocation, or None if not one
    (then use :func:`.bounds.bounds`, whose arguments these are): the machines named
    ``n<k>/...`` (as :func:`multi_node` makes them), whole and identical, and the collective
    allreduce, allgather, reduce_scatter, broadcast or reduce."""
    if collective not in ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"):
        return None
    gpus = job_gpus(topo, gpus)
    machines = _machines(topo, gpus)
    if machines is None:
        return None
    G = without_turnarounds(job_graph(topo, gpus), gpus)
    n, N = len(machines), len(gpus)
    reps = machines[0]
    x_ag = cut_rate(G, gpus, reps)[0]
    if collective in ("allgather", "reduce_scatter"):
        x = x_ag if collective == "allgather" or _self_reverse(G) else cut_rate(
            G.reverse(copy=True), gpus, reps)[0]
        return Bounds(collective, (N - 1) * x, None, (N - 1) * x, None,
                      "ForestColl cut bound, max-flows to machine 0 only (machine symmetry)", gpus)
    if collective in ("broadcast", "reduce"):
        r = gpus[root]
        home = next(m for m in machines if r in m)
        other = next(m for m in machines if m is not home)
        inbound = collective == "reduce"
        flow = rooted_flow(G, (*home, *other), r, inbound)
        return Bounds(collective, float(flow), None, (N - 1) * x_ag, None,
                      "min over v of maxflow, v on the root's machine and one other (symmetry)",
                      gpus)
    x_rs = x_ag if _self_reverse(G) else cut_rate(G.reverse(copy=True), gpus, reps)[0]
    cut = 2 * (N - 1) / (1 / x_rs + 1 / x_ag)
    factor = 2 * (N - 1) / N
    tree_cap = factor * _leaving_capacity(G, machines) / (2 * (n - 1))
    if tree_cap > cut * (1 + 1e-9):
        return None     # trees might beat the cut: only the generic LP can tell
    pair = min_pair_flow(G, (reps[0], *machines[0][1:], *machines[1]))
    return Bounds(collective, cut, factor * pair, cut, tree_cap,
                  "reference = reduce-scatter + allgather (trees cannot exceed it: every tree "
                  "edge between machines uses network links both ways); symmetric machines", gpus)


def _machines(topo: nx.DiGraph, gpus) -> list[tuple] | None:
    """GPUs per machine ``n<k>/`` if every machine is whole, identical and identically wired."""
    by_machine: dict[str, list] = {}
    for g in gpus:
        m = _PREFIX.match(str(g))
        if m is None:
            return None
        by_machine.setdefault(m.group(1), []).append(g)
    if len(by_machine) < 2:
        return None
    shapes = set()
    for k, members in by_machine.items():
        prefix = f"n{k}/"
        mine = [v for v in topo if str(v).startswith(prefix)]
        if sum(topo.nodes[v].get("kind") == "gpu" for v in mine) != len(members):
            return None          # part of a machine: other jobs' GPUs break the symmetry
        shapes.add(frozenset((str(u).removeprefix(prefix), str(v).removeprefix(prefix), bw)
                             for u, v, bw in topo.edges(mine, data="bw_gbps")) |
                   frozenset((str(u).removeprefix(prefix), str(v).removeprefix(prefix), bw)
                             for u, v, bw in topo.in_edges(mine, data="bw_gbps")))
    return [tuple(v) for v in by_machine.values()] if len(shapes) == 1 else None


def _self_reverse(G: nx.DiGraph) -> bool:
    """Every link has a reverse of equal capacity: the reversed graph is the graph itself,
    so reduce-scatter's cuts are allgather's."""
    return all(G.has_edge(v, u) and G.edges[v, u]["cap"] == d["cap"]
               for u, v, d in G.edges(data=True))


def _leaving_capacity(G: nx.DiGraph, machines) -> float:
    total = 0.0
    for members in machines:
        prefix = str(members[0]).split("/", 1)[0] + "/"
        total += sum(d["cap"] for u, v, d in G.edges(data=True)
                     if str(u).startswith(prefix) and not str(v).startswith(prefix))
    return total
