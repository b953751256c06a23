"""How close to optimal a plan is: bandwidth bounds of a collective on a GPU allocation.

Bus bandwidths (nccl-tests conventions) in GB/s per direction, at the topology's ``bw_gbps``.
GPUs outside the allocation are removed; switches, CPUs and NICs stay as relays that forward
but never reduce. A PCIe switch does not turn traffic around between GPUs whose peer copies take
NVLink or xGMI (:func:`~collectx.topology.view.without_turnarounds` splits it; the tree bound
applies the rule pair by pair); with a switch split, the bounds marked *split* come from the
multicast LP (:func:`~collectx.topology.flows.multicast_rate`), as cuts no longer see every
shared link. docs/planner.md ("Bounds") has the table.

* allgather / reduce_scatter: ForestColl's cut ``(N-1) * min_S B+(S) / |S ∩ C|``, by
  Dinkelbach's parametric max-flow (:func:`~collectx.topology.flows.cut_rate`; reduce_scatter
  on the reversed graph). *Split*: ``(N-1) x`` at the rate ``x`` every GPU multicasts at.
* broadcast / reduce: ``min_v maxflow(root -> v)`` (``v -> root``). *Split*: the root's
  multicast.
* alltoall: the maximum concurrent multicommodity flow, ``(N-1)`` times the rate per pair.
* allreduce: *reference* = max(the phases' cuts, ``2(N-1) / (1/x_rs + 1/x_ag)``; the optimal
  fractional packing of spanning trees used both ways, ``2(N-1)/N * T``). *Ceiling* =
  ``2(N-1)/N * min`` pair max-flow: no algorithm without in-network reduction beats it.
  *Split*: the phases at the multicast LP's rates, where the max-flow cut tops the trees.

>>> G = nx.DiGraph()
>>> for a, b in [("GPU0", "GPU1"), ("GPU1", "GPU2")]:
...     G.add_node(a, kind="gpu"); G.add_node(b, kind="gpu")
...     G.add_edge(a, b, bw_gbps=100.0); G.add_edge(b, a, bw_gbps=100.0)
>>> b = bounds(G, "allreduce")
>>> round(b.cut_busbw, 1), round(b.tree_busbw, 1), round(b.ceiling_busbw, 1)
(100.0, 133.3, 133.3)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import networkx as nx

from .._concurrent import concurrently
from ..errors import ArgumentError
from ..topology.flows import alltoall_rate, cut_rate, min_pair_flow, multicast_rate, rooted_flow
from ..topology.view import LinkIndex, job_gpus, job_graph, require_connected
from ..topology.view import turn_rule, without_turnarounds
from ._build import remembered
from .treepack import pack_undirected_trees

KINDS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall")


@dataclass(frozen=True, slots=True)
class Bounds:
    """Bus-bandwidth bounds (GB/s) of one collective on one allocation.

    ``bound_busbw`` is what plans are measured against: the cut bound (allgather,
    reduce_scatter, alltoall), the max-flow bound (broadcast, reduce), or for allreduce the
    reference max(cut, tree). ``ceiling_busbw`` (allreduce only) no algorithm can exceed."""

    kind: str
    bound_busbw: float
    ceiling_busbw: float | None
    cut_busbw: float | None
    tree_busbw: float | None
    notes: str
    gpus: tuple = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gpus"] = list(self.gpus)
        return d


def bounds(topo: nx.DiGraph, collective: str, gpus=None, root: int = 0, *,
           cut: bool = True) -> Bounds:
    """Bandwidth bounds of ``collective`` on the GPUs ``gpus`` of ``topo``; ``cut=False``: a
    multicast LP's cut (None) left out where choosing a plan does not read it (allreduce: trees
    and ceiling; broadcast, reduce: the rooted flow; allgather, reduce-scatter: the max-flow
    cut, above the LP's, as the bound to prune by).

    Parameters
    ----------
    topo : networkx.DiGraph
        Topology (edges carry ``bw_gbps``); not modified.
    collective : str
        One of allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall.
    gpus : sequence of node ids, optional
        The allocation; default every GPU. Other GPUs are removed, relays stay.
    root : int
        Index into ``gpus`` of the broadcast/reduce root.

    Returns
    -------
    Bounds

    Raises
    ------
    ArgumentError
        Unknown collective, bad GPU ids or root.
    TopologyError
        Some GPU cannot reach another.

    Examples
    --------
    >>> G = nx.DiGraph()
    >>> G.add_nodes_from(["GPU0", "GPU1"], kind="gpu")
    >>> G.add_edge("GPU0", "GPU1", bw_gbps=25.0); G.add_edge("GPU1", "GPU0", bw_gbps=25.0)
    >>> bounds(G, "allgather").bound_busbw
    25.0
    """
    gpus = _checked(topo, collective, gpus, root)
    n = len(gpus)
    from .hier_bounds import symmetric_bounds   # identical machines: exact by symmetry, fast
    fast = symmetric_bounds(topo, collective, gpus, root)
    if fast is not None:
        return fast
    J = job_graph(topo, gpus)
    G = without_turnarounds(J, gpus)
    require_connected(G, gpus)
    if n < 2:
        return Bounds(collective, float("inf"), float("inf") if collective == "allreduce" else None,
                      float("inf"), None, "one GPU: nothing to move", gpus)
    # reduce-scatter runs allgather's trees reversed, so its cuts are those of the reversed graph.
    # With split switches the cut is no longer tight (their uplinks carry relays both ways, their
    # downlinks feed several GPUs): the multicast LP is.
    rate = cut_rate if G is J else lambda H, c: (multicast_rate(H, c),)
    flipped = not _symmetric(J)   # reduce-scatter's rate is not allgather's
    solve_cut = cut or G is J   # max-flows take milliseconds: only the LP is worth leaving out

    def per_root(reverse: bool = False) -> float:   # reverses the graph only on a miss
        flip = reverse and flipped
        return _memo("cut_reversed" if flip else "cut", G, gpus,
                     lambda: rate(G.reverse(copy=True) if flip else G, gpus)[0])

    if collective in ("allgather", "reduce_scatter"):
        graph = "" if collective == "allgather" else " of the reversed graph"
        if not solve_cut:   # split switches: the max-flow cut (milliseconds) lies above the
            above = (n - 1) * _max_flow_rate(  # multicast LP (seconds at 16 GPUs): it prunes
                G, gpus, reverse=bool(graph) and flipped)   # soundly
            return Bounds(collective, above, None, None, None,
                          f"cut left out; bound = max-flow cut{graph}, above the multicast LP's",
                          gpus)
        cut = (n - 1) * per_root(reverse=collective == "reduce_scatter")
        return Bounds(collective, cut, None, cut, None,
                      f"ForestColl cut bound (N-1)*min_S B+(S)/|S∩C|{graph}", gpus)
    if collective in ("broadcast", "reduce"):
        inbound = collective == "reduce"
        if G is J:
            rooted = lambda: rooted_flow(G, gpus, gpus[root], inbound=inbound)  # noqa: E731
            notes = f"min over v of maxflow {'v -> root' if inbound else 'root -> v'}"
        else:   # a split switch's downlink feeds all its GPUs: no single max-flow sees that
            H = lambda: G.reverse(copy=True) if inbound else G  # noqa: E731
            rooted = lambda: _memo(f"multicast{root}{collective}", G, gpus,  # noqa: E731
                                   lambda: multicast_rate(H(), gpus, [root]))
            notes = "multicast LP from the root (switches copy nothing)"
        x_ag, flow = concurrently([per_root if solve_cut else None, rooted])   # x_ag: shown
        return Bounds(collective, flow, None, x_ag and (n - 1) * x_ag, None, notes, gpus)
    if collective == "alltoall":
        a2a = (n - 1) * alltoall_rate(G, gpus)
        return Bounds(collective, a2a, None, a2a, None,
                      "max concurrent multicommodity flow (N-1)*rate per pair", gpus)
    factor = 2 * (n - 1) / n
    turns = turn_rule(J, G, gpus)
    trees = lambda: pack_undirected_trees(  # noqa: E731
        LinkIndex.of(G), gpus, either_way=G is not J, turns=turns).rate
    # Split switches: the max-flow cut lies above the multicast LP's (every root in S sends
    # its data out of S at least once, whatever relays copy), so where even it is below the
    # trees, the trees are the reference and the LP (seconds at 16 GPUs) is not solved.
    exact, loose = solve_cut and G is J, solve_cut and G is not J
    x_ag, tree, pair, x_rs, above = concurrently(   # HiGHS releases the GIL while trees price
        [per_root if exact else None, lambda: _memo(f"trees{turns}", G, gpus, trees),
         lambda: _memo("pair_flow", G, gpus, lambda: min_pair_flow(G, gpus)),
         (lambda: per_root(reverse=True)) if exact and flipped else None,
         (lambda: _max_flow_cut(G, gpus, flipped)) if loose else None])
    tree *= factor
    ceiling = "ceiling = 2(N-1)/N * min pair maxflow"
    if not solve_cut and tree:
        return Bounds(collective, tree, factor * pair, None, tree, "cut left out", gpus)
    if above is not None and above <= tree * (1 + 1e-9):
        return Bounds(collective, tree, factor * pair, above, tree,
                      f"reference = trees; cut = max-flow cut, above the multicast LP's and "
                      f"below the trees; {ceiling}", gpus)
    x_ag = x_ag or per_root()
    x_rs = x_rs or (per_root(reverse=True) if flipped else x_ag)
    cut = _phases(n, x_rs, x_ag)
    which = "trees" if tree > cut else "reduce-scatter + allgather"
    return Bounds(collective, max(cut, tree), factor * pair, cut, tree,
                  f"reference = {which}; {ceiling}", gpus)


def _phases(n: int, x_rs: float, x_ag: float) -> float:
    """Allreduce's bus bandwidth as reduce-scatter at per-root rate ``x_rs``, then allgather
    at ``x_ag``."""
    return 2 * (n - 1) / (1 / x_rs + 1 / x_ag)


def _max_flow_cut(G: nx.DiGraph, gpus, flipped: bool) -> float:
    """:func:`_phases` at the max-flow cut rates of ``G`` (reduce-scatter's of the reversed
    graph where it differs): exact without split switches, an upper bound with them."""
    x_ag = _max_flow_rate(G, gpus)
    return _phases(len(gpus), _max_flow_rate(G, gpus, reverse=True) if flipped else x_ag, x_ag)


def _max_flow_rate(G: nx.DiGraph, gpus, reverse: bool = False) -> float:
    """:func:`~collectx.topology.flows.cut_rate` of ``G`` (of the reversed graph with ``reverse``),
    remembered: the allgather, reduce-scatter and allreduce bounds of an allocation share it."""
    return _memo("max_flow_rate_reversed" if reverse else "max_flow_rate", G, gpus,
                 lambda: cut_rate(G.reverse(copy=True) if reverse else G, gpus)[0])


def _symmetric(G: nx.DiGraph) -> bool:
    """Whether every link has a reverse of the same capacity: the reversed graph is then the
    same (split switches' halves trade places), and reduce-scatter's rate is allgather's."""
    return all(G.has_edge(v, u) and G.edges[v, u]["cap"] == c for u, v, c in G.edges(data="cap"))


def _memo(what: str, G: nx.DiGraph, gpus, compute):
    """``compute()``, remembered for job graphs with the same nodes, links and capacities
    (the allgather, reduce-scatter and allreduce bounds share cut rates)."""
    return remembered((what, tuple(G.nodes(data="kind")), tuple(G.edges(data="cap")),
                       tuple(gpus)), compute)


def _checked(topo: nx.DiGraph, collective: str, gpus, root: int) -> tuple:
    """The job's GPUs, once the collective and the root are known good."""
    if collective not in KINDS:
        raise ArgumentError(f"bounds for {collective!r}: expected one of {', '.join(KINDS)}")
    gpus = job_gpus(topo, gpus)
    if not 0 <= root < max(len(gpus), 1):
        raise ArgumentError(f"root={root} with {len(gpus)} GPUs: expected 0 <= root < "
                            f"{len(gpus)}")
    return gpus


def peer_bounds(topo: nx.DiGraph, collective: str, gpus=None, root: int = 0,
                host: bool = False) -> Bounds:
    """:func:`bounds` for executors without host buffers (the CUDA executor): the optimum of
    the packing program's LP (:func:`~.program.fractional`) over peer routes only, as the
    hardware routes a copy from one GPU to another; with ``host``, over those routes and the
    ones staged through host memory. No schedule of trees, rings or one-hop copies over those
    routes moves more; alltoall, which no tree carries, keeps :func:`bounds`.

    allgather / reduce_scatter: ``(N-1) x`` at the per-root rate ``x``; broadcast / reduce:
    the rate; allreduce: the better of trees used both ways (``2(N-1)/N`` times their rate)
    and reduce-scatter then allgather (``2(N-1) / (1/x_rs + 1/x_ag)``), as :func:`bounds`.

    >>> from collectx.topology import load
    >>> G = load("dgx1v")
    >>> b = peer_bounds(G, "allgather", gpus=["GPU0", "GPU1"])
    >>> round(b.bound_busbw, 2), round(bounds(G, "allgather", gpus=["GPU0", "GPU1"]).bound_busbw, 2)
    (25.0, 32.88)
    """
    gpus = _checked(topo, collective, gpus, root)
    n = len(gpus)
    if collective == "alltoall" or n < 2:
        return bounds(topo, collective, gpus, root)
    from . import program as P
    rate = lambda coll: P.solved(topo, gpus, coll, root=root, host=host)[1].rate  # noqa: E731
    notes = f"packing LP over peer routes ({'and' if host else 'no'} host staging)"
    if collective in ("broadcast", "reduce"):
        x = rate(collective)
        return Bounds(collective, x, None, x, None, notes, tuple(gpus))
    x_ag = rate("allgather")
    x_rs = x_ag if _symmetric(job_graph(topo, gpus)) else rate("reduce_scatter")
    if collective != "allreduce":
        cut = (n - 1) * (x_ag if collective == "allgather" else x_rs)
        return Bounds(collective, cut, None, cut, None, notes, tuple(gpus))
    cut = _phases(n, x_rs, x_ag)
    tree = 2 * (n - 1) / n * rate("allreduce")
    return Bounds(collective, max(cut, tree), None, cut, tree, notes, tuple(gpus))
