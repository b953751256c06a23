"""The job's view of a machine: its GPUs, the links between them, and how transfers cross them.

Like NCCL's paths stage, this is computed once per allocation and read by the planner and the
bounds alike:

* :func:`job_graph` -- the topology without the GPUs outside the job (they belong to other
  jobs and never relay), every link with its capacity ``cap``;
* :class:`LinkIndex` -- numbered directed links (the rows of packing LPs);
* :func:`simulator_routes`, :func:`host_routes` and :func:`host_uploads` -- the links a
  transfer between two of the job's GPUs crosses, as a peer copy (exactly the simulator's
  routes) or staged through the sender's host memory, and the sender's copy into it;
* :func:`relay_paths` -- cheapest paths through relays (switches, CPUs, NICs) under link prices;
* :func:`without_turnarounds` -- PCIe switches split where they cannot turn traffic around
  between the job's GPUs (the rule below), CPUs where they forward no other socket's
  traffic (:func:`direct_sockets`), and the PCIe links of GPUs that reach host memory over
  their own CPU link (NVLink-C2C) left out; :func:`turn_rule` -- the same rule, pair by pair,
  for the switches left whole.

Relays and edge splitting
-------------------------
Packings are built over the job's GPUs only. Relays forward data but never copy or reduce it,
so a tree edge ``u -> t`` between two GPUs stands for a *path* whose inner nodes are relays.
ForestColl removes relays by edge splitting (Lovász/Mader, Bang-Jensen–Frank–Jackson); collectx
uses the equivalent LP formulation instead: a column of a packing LP is a GPU tree whose every
edge carries the relay path it takes, and link capacities are the LP rows.

Turnarounds
-----------
PCIe switches that cannot turn traffic around between their GPUs, for the bounds.

Why: a PCIe switch forwards a peer-to-peer transfer from one GPU below it to another without
involving the CPU, and the cut bounds count that route. But CUDA sends peer traffic between two
GPUs that share an NVLink (or xGMI) link over that link, always: there is no way to ask for
PCIe instead. The same holds for two GPUs whose copies take NVLink or xGMI hops through a
third GPU of the job (NCCL's NVB paths; :func:`peer_linked` asks the simulator's route). So
when every pair of the job's GPUs below a switch talks that way (each PCIe switch of a DGX-1
holds two GPUs joined by NVLink), their PCIe bandwidth is reachable only through host memory:
up through the switch to the CPU and back down, and the switch's uplink carries such a relay
in both directions. A bound that counts the turn inside the switch is larger than anything the
hardware can run (GPUs 0 and 1 of a DGX-1V: 40.75 GB/s counted, 25 + 15.75/2 reachable; nine
GCDs of the 16-GCD MI250 dump: 175.3 GB/s allreduce counted, 154.3 reachable).

How it works: :func:`without_turnarounds` splits each such switch into an upward half (the links
from below, and the uplink) and a downward half (the downlink, and the links to below), so a
route entering from a GPU can only leave upwards. A NIC hanging off such a switch with no other
link (one machine's graph) carries nothing between GPUs and would only let a route turn through
it, so it is left out; a switch whose NIC leads elsewhere (several machines) is not split, so
GPUDirect routes to the network keep their turn. A switch with a GPU pair below it that talks
over PCIe keeps the turn for that pair. Where each of its ports leads to one GPU at most, the
graph says so exactly: the switch is split into its halves plus a node per port each way, and
a port's node in leads to another port's node out only where their GPUs talk over PCIe
(:func:`_split_turns`; four GCDs below one switch, two of them talking over PCIe and the rest
over xGMI, say). Elsewhere the switch is left whole, :func:`turn_rule` names the pairs that
still may not turn there, and the tree bound's path search (:func:`relay_paths`) obeys it pair
by pair. The result is still an upper bound on every schedule: a pair that talks over NVLink
or xGMI has no other way to use the switch, and the split never adds capacity on a route that
existed.

>>> from collectx.topology import load
>>> G = load("dgx1v")
>>> H = without_turnarounds(job_graph(G, ["GPU0", "GPU1"]), ["GPU0", "GPU1"])
>>> sorted(n for n in H if str(n).startswith("PLX0"))
['PLX0~dn', 'PLX0~up']
>>> H.has_edge("GPU0", "PLX0~up") and H.has_edge("PLX0~dn", "GPU1")
True
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from ..errors import ArgumentError, TopologyError
from .model import GPU_LINK_TYPES, natural_key
from .routes import routes_for

_HOP_EPS = 1e-9   # tie-break: among equal-price paths prefer fewer hops
_UNREACHABLE = 1e250   # a price standing for "no link" (inf): no path of real prices nears it


def job_gpus(topo: nx.DiGraph, gpus=None) -> tuple:
    """The job's GPUs: ``gpus`` as given, or every ``kind == "gpu"`` node in natural order.

    >>> G = nx.DiGraph(); G.add_nodes_from(["GPU1", "GPU0"], kind="gpu")
    >>> job_gpus(G)
    ('GPU0', 'GPU1')
    """
    if gpus is None:
        return tuple(sorted((n for n, d in topo.nodes(data=True) if d.get("kind") == "gpu"),
                            key=natural_key))
    gpus = tuple(gpus)
    for g in gpus:
        if g not in topo or topo.nodes[g].get("kind") != "gpu":
            raise ArgumentError(f"{g!r} is not a GPU of this topology; expected one of "
                                f"{job_gpus(topo)}; pass GPU node ids")
    if len(set(gpus)) != len(gpus):
        raise ArgumentError(f"gpus {gpus} repeat a GPU; list each GPU once")
    return gpus


def job_graph(topo: nx.DiGraph, gpus) -> nx.DiGraph:
    """Copy of ``topo`` without the GPUs outside ``gpus``; each edge gets ``cap`` (GB/s).

    ``topo`` is not modified. Edges without ``bw_gbps`` or with a non-positive one are dropped.
    """
    keep = set(gpus)
    G = nx.DiGraph(**topo.graph)
    for n, d in topo.nodes(data=True):
        if d.get("kind") != "gpu" or n in keep:
            G.add_node(n, **{**d, "kind": d.get("kind", "relay")})
    for u, v, d in topo.edges(data=True):
        cap = float(d.get("bw_gbps", 0.0) or 0.0)
        if cap > 0 and u in G and v in G:
            G.add_edge(u, v, **{**d, "cap": cap})
    return G


@dataclass(frozen=True)
class LinkIndex:
    """Numbered directed links of a job graph (LP rows) and per-node adjacency."""

    nodes: tuple
    links: tuple            # (u, v) per link id
    caps: tuple             # GB/s per link id
    out: dict               # node -> tuple of (link id, head)
    rev: tuple              # link id of the reverse direction, or -1
    ids: dict               # (u, v) -> link id

    @classmethod
    def of(cls, G: nx.DiGraph) -> "LinkIndex":
        links = tuple(G.edges())
        ids = {e: i for i, e in enumerate(links)}
        out: dict = {n: [] for n in G.nodes}
        for i, (u, v) in enumerate(links):
            out[u].append((i, v))
        return cls(nodes=tuple(G.nodes), links=links,
                   caps=tuple(G.edges[e]["cap"] for e in links),
                   out={n: tuple(a) for n, a in out.items()},
                   rev=tuple(ids.get((v, u), -1) for u, v in links), ids=ids)


def relay_paths(index: LinkIndex, gpus, weight, turns: "Turns | None" = None) -> tuple[dict, dict]:
    """Cheapest path between every ordered GPU pair whose inner nodes are relays.

    Parameters
    ----------
    index : LinkIndex
    gpus : sequence of GPU node ids (the terminals; no other GPU is in the graph)
    weight : sequence of float, the non-negative price of each link id
    turns : Turns, optional
        Switches that turn only some pairs' traffic around (:func:`turn_rule`): a pair it
        names as linked never turns at them.

    Returns
    -------
    (cost, path) : dicts keyed by ``(u, t)``; ``path`` is a tuple of ``(link id, 1.0)`` (the
    same form as :func:`simulator_routes`), ``cost`` its price. Pairs without a path are absent.
    :func:`relay_search` prepares the same search once for many prices.
    """
    return relay_search(index, gpus, turns)(weight)


def relay_search(index: LinkIndex, gpus, turns: "Turns | None" = None):
    """:func:`relay_paths` as ``search(weight)``: the search graphs are built once, so a
    packing LP that prices hundreds of times pays only for the searches."""
    gpus = tuple(gpus)
    free = _RelayGraph(index, gpus, {})
    kept = None
    if turns is not None:
        sources = tuple(s for s in gpus if any((s, t) in turns.linked for t in gpus))
        kept = _RelayGraph(index, sources, turns.below, gpus) if sources else None

    def search(weight) -> tuple[dict, dict]:
        cost, path = free.paths(weight)
        if kept is not None:
            near, way = kept.paths(weight)
            for pair in turns.linked:
                cost.pop(pair, None)
                path.pop(pair, None)
                if pair in near:
                    cost[pair], path[pair] = near[pair], way[pair]
        return cost, path
    return search


class _RelayGraph:
    """The search graph of :func:`relay_paths` from ``sources`` to ``gpus``: a GPU is a
    source state (its links out) and a sink state (links in, none out), so it never forwards
    inside a logical edge; a switch of ``below`` entered from under it is a separate *climbed*
    state whose links back down are left out (no turnaround). Each state link is one link of
    ``index``; Dijkstra runs in scipy, over prices plus a hop's tie-break."""

    def __init__(self, index: LinkIndex, sources: tuple, below: dict, gpus: tuple = None):
        gpus = set(gpus or sources)
        self.sources = sources
        state: dict = {}

        def sid(key):
            return state.setdefault(key, len(state))
        for g in sources:
            sid((g, "out"))
        entries = []
        for link, (u, v) in enumerate(index.links):
            if u in gpus:
                tails = [(u, "out")] if u in sources else []
            else:
                tails = [(u, False)] + ([(u, True)] if u in below else [])
            head = (v, "in") if v in gpus else (v, u in below.get(v, ()))
            for tail in tails:
                if tail[1] is True and v in below.get(u, ()):
                    continue
                entries.append((sid(tail), sid(head), link))
        entries.sort()
        self.size = len(state)
        rows = np.array([r for r, _, _ in entries], dtype=np.int64)
        self.cols = np.array([c for _, c, _ in entries], dtype=np.int32)
        self.links = np.array([k for _, _, k in entries], dtype=np.int64)
        self.indptr = np.searchsorted(rows, np.arange(self.size + 1))
        self.link_of = {(r, c): k for r, c, k in entries}
        self.src_ids = [state[(g, "out")] for g in sources]
        self.sinks = [(g, state[(g, "in")]) for g in sorted(gpus, key=str) if (g, "in") in state]

    def paths(self, weight) -> tuple[dict, dict]:
        price = np.minimum(np.asarray(weight, dtype=float)[self.links], _UNREACHABLE) + _HOP_EPS
        graph = csr_matrix((price, self.cols, self.indptr), shape=(self.size, self.size))
        dist, pred = dijkstra(graph, directed=True, indices=self.src_ids,
                              return_predecessors=True)
        cost, path = {}, {}
        for i, src in enumerate(self.sources):
            for t, sink in self.sinks:
                d = dist[i, sink]
                if t == src or not d < _UNREACHABLE:
                    continue
                links, at = [], sink
                while at != self.src_ids[i]:
                    back = pred[i, at]
                    links.append(self.link_of[back, at])
                    at = back
                cost[src, t] = float(d)
                path[src, t] = tuple((link, 1.0) for link in reversed(links))
        return cost, path


def simulator_routes(G: nx.DiGraph, index: LinkIndex, gpus, reverse: bool = False) -> dict:
    """The links each ordered GPU pair's transfer crosses, as the simulator routes it.

    Returns ``{(a, b): ((link id, share), ...)}``: :func:`collectx.schedule.simulate` sends a
    transfer over a direct link, else its widest route, striped over NVSwitch planes in
    proportion to the pair's max-flow, so packings that must come true there price each tree
    edge by those shares instead of choosing relay paths freely. The simulator's own route table is asked, so the two cannot drift apart.
    With ``reverse``, ``index`` numbers the reversed graph and ``(p, c)`` maps to the reversed
    route of ``c -> p`` (in-trees packed as out-trees of the reversed graph).
    """
    table = routes_for(G)
    stripes = {(a, b): [([table.names[r] for r in res], share)
                        for res, _, share in table.spread(a, b)]
               for a in gpus for b in gpus if a != b}
    # A tree edge whose route crosses another job GPU adds nothing a tree through that GPU
    # lacks, and makes the pricing degenerate (a ring's overlay becomes a complete graph).
    terminals = set(gpus)
    direct = {k: h for k, h in stripes.items()
              if not any(v in terminals for hops, _ in h for _, v in hops[:-1])}
    overlay = nx.DiGraph(list(direct))
    overlay.add_nodes_from(gpus)
    if nx.is_strongly_connected(overlay):
        stripes = direct
    routes = {}
    for (a, b), h in stripes.items():
        use: dict = {}
        for hops, share in h:
            for u, v in hops:
                link = index.ids[v, u] if reverse else index.ids[u, v]
                use[link] = use.get(link, 0.0) + share
        routes[(b, a) if reverse else (a, b)] = tuple(sorted(use.items()))
    return routes


def host_routes(G: nx.DiGraph, index: LinkIndex, gpus, reverse: bool = False) -> dict:
    """The links a transfer staged through host memory crosses, for every ordered pair of
    ``gpus``: the only way to the PCIe bandwidth between GPUs whose peer copies take NVLink,
    and across the sockets' link a second way between GPUs under different CPUs.

    The sender copies into its ``host`` buffer (GPU -> PCIe -> its host CPU) and the receiver
    copies it out (that CPU -> PCIe -> GPU), each routed as the simulator routes it. Same
    format and ``reverse`` convention as :func:`simulator_routes`; pairs whose staged route
    would cross another GPU (or another host), or whose sender has no CPU, get none.
    """
    table = routes_for(G)
    kinds = dict(G.nodes(data="kind"))
    routes = {}
    for a in gpus:
        host = table.host_of(a)
        if host == a or kinds.get(host) != "cpu":
            continue
        up = _leg(table, index, a, host, reverse)
        for b in gpus:
            if b == a or not table.stages_to(host, b):
                continue
            use = dict(up)
            for link, share in _leg(table, index, host, b, reverse):
                use[link] = use.get(link, 0.0) + share
            if not any(kinds.get(index.links[i][0]) == "gpu" and index.links[i][0] not in (a, b)
                       for i in use):
                routes[(b, a) if reverse else (a, b)] = tuple(sorted(use.items()))
    return routes


def staging_apart(G: nx.DiGraph, gpus) -> bool:
    """Whether no transfer staged through host memory between ``gpus`` crosses a link that a
    peer copy between them crosses (their fabric is NVLink or xGMI, their staging PCIe): a
    plan over each kind of route then runs beside the other at its own rate.

    >>> from collectx.topology import gpus, load
    >>> [staging_apart(job_graph(G, gpus(G)), gpus(G))
    ...  for G in (load("dgx_h100"), load("pcie_gen4_8gpu"))]   # NVLink; PCIe alone
    [True, False]
    """
    index = LinkIndex.of(G)
    links = lambda routes: {link for load in routes.values() for link, _ in load}  # noqa: E731
    return not links(simulator_routes(G, index, gpus)) & links(host_routes(G, index, gpus))


def host_uploads(G: nx.DiGraph, index: LinkIndex, gpus) -> dict:
    """``gpu -> ((link id, share), ...)``: the links a GPU's copy into its own ``host`` buffer
    crosses, the first half of every route :func:`host_routes` stages from it. One such copy
    serves every GPU that reads the same data from there."""
    table = routes_for(G)
    kinds = dict(G.nodes(data="kind"))
    return {a: tuple(sorted(_leg(table, index, a, table.host_of(a), False)))
            for a in gpus if kinds.get(table.host_of(a)) == "cpu"}


def route_waits(G: nx.DiGraph, gpus) -> dict:
    """``(a, b) -> (peer, staged)``: the longest route latency (us) of a peer copy from GPU
    ``a`` to GPU ``b``, and of the two copies that stage it through ``a``'s host memory (0
    where ``a`` has none, or ``b`` cannot read it)."""
    table = routes_for(G)
    out = {}
    for a, b in itertools.permutations(gpus, 2):
        host = table.host_of(a)
        staged = table.wait_us(a, host) + table.wait_us(host, b) \
            if host != a and table.stages_to(host, b) else 0.0
        out[a, b] = (table.wait_us(a, b), staged)
    return out


def _leg(table, index: LinkIndex, x, y, reverse: bool) -> list:
    """``[(link id, share), ...]`` of the simulator's route(s) from ``x`` to ``y``."""
    out: dict = {}
    for res, _, share in table.spread(x, y):
        for u, v in (table.names[r] for r in res):
            link = index.ids[v, u] if reverse else index.ids[u, v]
            out[link] = out.get(link, 0.0) + share
    return list(out.items())


def require_connected(G: nx.DiGraph, gpus) -> None:
    """Raise :class:`TopologyError` unless every GPU reaches every other one."""
    if len(gpus) < 2:
        return
    reach = nx.descendants(G, gpus[0]) | {gpus[0]}
    back = nx.ancestors(G, gpus[0]) | {gpus[0]}
    lost = [g for g in gpus if g not in reach or g not in back]
    if lost:
        raise TopologyError(f"GPUs {lost} cannot exchange data with {gpus[0]} in this topology "
                            f"(no path both ways); check the links or choose another allocation")


DIRECT_TYPES = GPU_LINK_TYPES   # GPU-to-GPU links CUDA peer copies always take


def without_turnarounds(G: nx.DiGraph, gpus) -> nx.DiGraph:
    """``G`` (a job graph) with every switch that cannot turn traffic between its GPUs split
    into ``<switch>~up`` and ``<switch>~dn`` halves (one that turns it for some of its ports'
    GPUs only, as well as ``<switch>~from~<port>`` and ``<switch>~to~<port>``), and every CPU
    that forwards no other socket's traffic (:func:`direct_sockets`) into itself and
    ``<cpu>~far`` (its socket links in) and ``<cpu>~dn`` (its other links out); ``G`` itself is
    returned when nothing is split.

    >>> from collectx.topology import load
    >>> G = load("topology/real/l40s_8gpu_2socket_nvidia-smi-topo.txt")
    >>> H = without_turnarounds(job_graph(G, ["GPU0", "GPU7"]), ["GPU0", "GPU7"])
    >>> sorted(H.successors("CPU0")), sorted(H.successors("CPU1~far")), "CPU2" in H
    (['CPU0~dn', 'CPU1~far'], ['CPU1~dn'], False)
    """
    kinds = dict(G.nodes(data="kind"))
    level = pcie_levels(G, kinds)
    linked = peer_linked(G, gpus)
    switches = [s for s, k in kinds.items() if k == "pci_switch" and _leaves_only(G, s, kinds)]
    split = [s for s in switches if _all_peers(linked, _gpus_below(G, s, kinds, level, set(gpus)))]
    turning = {s: t for s in switches if s not in split
               and (t := _child_turns(G, s, kinds, level, linked, set(gpus))) is not None}
    # Below a switch that turns for some ports only, a switch turns nothing (one GPU below it
    # at most): split, so that no route turns back up through it and takes another port's turn
    split += [c for s in turning for c in _switches_under(G, s, kinds, level)
              if c not in split and c in switches]
    sockets = direct_sockets(G)
    bypassed = _pcie_bypassed(G, gpus, linked, kinds)
    if not split and not turning and not sockets and not bypassed:
        return G
    H = G.copy()
    H.remove_edges_from(bypassed)
    # Top-down: a switch is split before the switches below it, so each split still finds
    # the switches below it under their own names.
    for s in sorted(split + list(turning), key=lambda s: (level.get(s, 0), natural_key(s))):
        H.remove_nodes_from(_leaf_devices(H, s, kinds))
        if s in turning:
            _split_turns(H, s, kinds, level, turning[s])
        else:
            _split(H, s, kinds, level)
    for c in sockets:
        H.remove_nodes_from(_dead_ends(H, c))
        _split_socket(H, c)
    return H


@dataclass(frozen=True)
class Turns:
    """Where a job graph's switches turn traffic around for some of the job's GPU pairs only.

    ``linked``: the ordered GPU pairs whose peer copies never touch PCIe (:func:`peer_linked`);
    ``below``: switch -> the nodes one level under it, for every switch left whole that has
    such a pair below it. A route between a linked pair never enters one of these switches
    from below and leaves it downwards (:func:`relay_paths`)."""

    linked: frozenset
    below: dict


def turn_rule(J: nx.DiGraph, H: nx.DiGraph, gpus) -> Turns | None:
    """The per-pair turnaround rule of the switches :func:`without_turnarounds` left whole in
    ``H`` (made from the job graph ``J``), or None where none has a linked pair below it.

    Why: a switch keeps its turn when two of its GPUs talk over PCIe, but only those two
    use it; a pair whose copies take xGMI or NVLink still never turns there. Splitting the
    switch would take the turn from the pair that does use it, and a graph cannot say "this
    turn for these sources only", so the path searches apply it pair by pair. On the
    16-GPU MI100 dump, GPUs 1 and 2 share a hive while GPU0 talks to both over PCIe. Their
    switch PSW1 has a port per GPU, so the graph itself keeps the turns of GPU0's pairs only;
    PSW0, above it, is left whole with the rule:

    >>> from collectx.topology import load
    >>> G = load("topology/real/mi100_16gpu_4hives_16nic_rccl_topo.xml")
    >>> gpus = ["GPU0", "GPU1", "GPU2"]
    >>> J = job_graph(G, gpus)
    >>> H = without_turnarounds(J, gpus)
    >>> H.has_edge("PSW1~from~PSW2", "PSW1~to~PSW3"), H.has_edge("PSW1~from~PSW3", "PSW1~to~PSW4")
    (True, False)
    >>> t = turn_rule(J, H, gpus)
    >>> sorted(t.below), ("GPU1", "GPU2") in t.linked, ("GPU0", "GPU1") in t.linked
    (['PSW0'], True, False)
    """
    kinds = dict(J.nodes(data="kind"))
    level = pcie_levels(J, kinds)
    linked = peer_linked(J, gpus)
    below = {}
    for s in sorted((s for s, k in kinds.items() if k == "pci_switch" and s in H), key=natural_key):
        job = _gpus_below(J, s, kinds, level, set(gpus))
        if any(pair in linked for pair in itertools.permutations(job, 2)):
            under = {f"{c}{half}" for c in _below(J, s, kinds, level) for half in ("", "~up", "~dn")}
            below[s] = frozenset(n for n in under if n in H)
    return Turns(frozenset(linked), below) if below else None


def _dead_ends(H: nx.DiGraph, c) -> set:
    """Devices under CPU ``c`` that lead to no GPU and no other CPU except through ``c`` (a
    NIC and its switches, on one machine): a route into them only turns back, so they carry
    nothing between GPUs; left in, they would let a route turn around under ``c``."""
    kinds = dict(H.nodes(data="kind"))
    rest = H.to_undirected(as_view=True).subgraph(n for n in H if n != c)
    dead: set = set()
    for v in set(H.successors(c)) - {c}:
        if v in dead or kinds.get(v) in ("gpu", "cpu"):
            continue
        part = nx.node_connected_component(rest, v)
        if not any(kinds.get(n) in ("gpu", "cpu") for n in part):
            dead |= part
    return dead


def direct_sockets(G: nx.DiGraph) -> list:
    """The CPUs of ``G`` when its CPUs are joined pairwise by socket links (``smp``), each at
    least as wide as any route through a third CPU; else none.

    Why: memory traffic between two sockets then takes their own link (the widest route,
    which is also the simulator's), never a detour through a third socket. A bound that lets
    a transfer cross two socket links, or spread over several, counts bandwidth no copy gets
    (two sockets of 10 GB/s each beside a NIC's CPU node: 20 GB/s counted, 10 reachable).
    Where some pair has no link of its own, or a detour is wider, traffic does cross a third
    socket, and no CPU is split.
    """
    cpus = [n for n, k in G.nodes(data="kind") if k == "cpu"]
    cap = {(u, v): c for u, v, c in G.edges(data="cap")
           if u in cpus and v in cpus and G.edges[u, v].get("type") == "smp"}
    if len(cpus) < 3 or len(cap) != len(cpus) * (len(cpus) - 1):
        return []
    if any(cap[a, b] < min(cap[a, c], cap[c, b])
           for a, b, c in itertools.permutations(cpus, 3)):
        return []
    return sorted(cpus, key=natural_key)


def _split_socket(H: nx.DiGraph, c) -> None:
    """``c`` keeps its links in from its own devices and its socket links out; what arrives
    over a socket link enters ``c~far``, which leads only to ``c~dn``: ``c``'s links to its
    devices, reached from ``c`` too. So a route crosses at most one socket link."""
    down = [(v, d) for _, v, d in H.out_edges(c, data=True) if d.get("type") != "smp"]
    if not down:    # no devices of its own: it would only forward, which it does not
        H.remove_node(c)
        return
    far, dn = f"{c}~far", f"{c}~dn"
    H.add_node(far, kind="relay")
    H.add_node(dn, kind="relay")
    for u, _, d in list(H.in_edges(c, data=True)):
        if d.get("type") == "smp":
            H.remove_edge(u, c)
            H.add_edge(u, far, **d)
    for v, d in down:
        H.remove_edge(c, v)
        H.add_edge(dn, v, **d)
    width = sum(d["cap"] for _, d in down)   # never the narrower: it only joins c's links
    H.add_edge(c, dn, type="internal", cap=width)
    H.add_edge(far, dn, type="internal", cap=width)


def peer_linked(G: nx.DiGraph, gpus) -> set:
    """The ordered pairs of ``gpus`` whose peer copies never cross a PCIe switch: the route
    the simulator gives them (:func:`~collectx.topology.routes.routes_for`) is a direct
    link, one NVSwitch fabric, or NVLink/xGMI hops through other GPUs of ``G`` (NCCL's NVB
    paths). Only these pairs are the turnaround rule's concern.

    >>> from collectx.topology import load, ring
    >>> ("GPU0", "GPU5") in peer_linked(load("dgx_a100"), ["GPU0", "GPU5"])
    True
    >>> ("GPU0", "GPU2") in peer_linked(ring(4), ["GPU0", "GPU1", "GPU2", "GPU3"])
    True
    >>> G = load("dgx1v")
    >>> ("GPU0", "GPU5") in peer_linked(job_graph(G, ["GPU0", "GPU5"]), ["GPU0", "GPU5"])
    False
    """
    kinds = dict(G.nodes(data="kind"))
    pairs = set(itertools.permutations(gpus, 2))
    if "pci_switch" not in kinds.values():
        return pairs
    table = routes_for(G)

    def switch_free(a, b):
        return not any(kinds.get(table.names[r][1]) == "pci_switch"
                       for res, _, _ in table.spread(a, b) for r in res)
    return {(a, b) for a, b in pairs if direct_link(G, a, b) or switch_free(a, b)}


def _pcie_bypassed(G: nx.DiGraph, gpus, linked: set, kinds: dict) -> list:
    """The PCIe links (both directions) of the job's GPUs that carry nothing between them on a
    single machine: a GPU with its own link to a CPU (NVLink-C2C to a Grace CPU) copies into
    host memory over that link, and one whose peer copies to every other job GPU take NVLink
    (:func:`peer_linked`) sends no peer traffic over PCIe either; its PCIe link leads only to
    NICs, which one machine's collectives do not use."""
    if any(t == "net" for _, _, t in G.edges(data="type")):
        return []
    out = []
    for g in gpus:
        own_cpu = any(kinds.get(c) == "cpu" and G.edges[g, c].get("type") == "c2c"
                      for c in G.successors(g))
        if own_cpu and all((g, h) in linked and (h, g) in linked for h in gpus if h != g):
            out += [(g, v) for v in G.successors(g) if G.edges[g, v].get("type") == "pcie"]
            out += [(v, g) for v in G.predecessors(g) if G.edges[v, g].get("type") == "pcie"]
    return out


def _all_peers(linked: set, gpus) -> bool:
    """At least two ``gpus``, every two :func:`peer_linked`."""
    gpus = list(gpus)
    return len(gpus) >= 2 and all(pair in linked for pair in itertools.permutations(gpus, 2))


def _leaf_devices(G: nx.DiGraph, s, kinds: dict) -> list:
    """Neighbours of ``s`` that are neither GPUs, switches nor CPUs (NICs), linked to ``s`` only."""
    return [v for v in set(G.successors(s)) | set(G.predecessors(s))
            if kinds.get(v) not in ("gpu", "pci_switch", "cpu") and
            set(G.successors(v)) | set(G.predecessors(v)) <= {s}]


def _leaves_only(G: nx.DiGraph, s, kinds: dict) -> bool:
    """Whether every device of ``s`` other than GPUs, switches and CPUs is a leaf."""
    others = [v for v in set(G.successors(s)) | set(G.predecessors(s))
              if kinds.get(v) not in ("gpu", "pci_switch", "cpu")]
    return len(others) == len(_leaf_devices(G, s, kinds))


def pcie_levels(G: nx.DiGraph, kinds: dict) -> dict:
    """Hops from each CPU and PCIe switch to the nearest CPU through switches only (the PCIe
    hierarchy); switches with no CPU above them are absent."""
    relays = G.subgraph(n for n, k in kinds.items() if k in ("cpu", "pci_switch")).to_undirected()
    cpus = [n for n, k in kinds.items() if k == "cpu"]
    if not cpus:
        return {}
    return nx.multi_source_dijkstra_path_length(relays, cpus, weight=lambda *_: 1)


def _below(G: nx.DiGraph, s, kinds: dict, level: dict):
    """Neighbours of switch ``s`` one level further from the CPUs (GPUs, child switches)."""
    for v in G.successors(s):
        if kinds.get(v) == "gpu" or (kinds.get(v) == "pci_switch" and
                                     level.get(v, -1) > level.get(s, -1)):
            yield v


def _gpus_below(G, s, kinds, level, job) -> list:
    found, todo, seen = [], [s], {s}
    while todo:
        for v in _below(G, todo.pop(), kinds, level):
            if v in seen:
                continue
            seen.add(v)
            if kinds.get(v) == "gpu":
                found += [v] if v in job else []
            else:
                todo.append(v)
    return found


def direct_link(G: nx.DiGraph, a, b) -> bool:
    """``a -> b`` is a direct GPU link (:data:`DIRECT_TYPES`)."""
    return G.get_edge_data(a, b, {}).get("type") in DIRECT_TYPES


def _child_turns(G: nx.DiGraph, s, kinds: dict, level: dict, linked: set, job: set):
    """The ordered pairs ``(a, b)`` of nodes under switch ``s`` between which it turns traffic
    around, where that differs from every pair or none and the nodes say it exactly: each of
    ``s``'s children leads to at most one of the job's GPUs, and ``s`` turns from one child to
    another unless both lead to GPUs whose peer copies never take PCIe (a child without a GPU
    keeps every turn: a NIC there may lead to other machines). Else None."""
    under = {c: _gpus_below(G, c, kinds, level, job) if kinds.get(c) != "gpu" else
             [c] if c in job else [] for c in _below(G, s, kinds, level)}
    if any(len(g) > 1 for g in under.values()):
        return None
    pairs = list(itertools.permutations(under, 2))
    turns = {(a, b) for a, b in pairs
             if not under[a] or not under[b] or (under[a][0], under[b][0]) not in linked}
    return turns if len(turns) < len(pairs) else None


def _switches_under(G: nx.DiGraph, s, kinds: dict, level: dict) -> list:
    """Every PCIe switch below switch ``s``."""
    found, todo = [], [s]
    while todo:
        for v in _below(G, todo.pop(), kinds, level):
            if kinds.get(v) == "pci_switch" and v not in found:
                found.append(v)
                todo.append(v)
    return found


def _split_turns(H: nx.DiGraph, s, kinds: dict, level: dict, turns: set) -> None:
    """:func:`_split`, plus the turns ``s`` takes: child ``a``'s link up enters ``s~from~a``
    and child ``b``'s link down leaves ``s~to~b``; ``s~from~a`` leads up, and to ``s~to~b``
    where ``(a, b)`` turns. Each inner link is as wide as the child's link it joins, so no
    route gains capacity it did not have."""
    attrs = dict(H.nodes[s])
    below = set(_below(H, s, kinds, level))
    _split(H, s, kinds, level)
    up, dn = f"{s}~up", f"{s}~dn"
    for c in below:
        if H.has_edge(c, up):
            _via(H, c, up, f"{s}~from~{c}", attrs, c)
        if H.has_edge(dn, c):
            _via(H, dn, c, f"{s}~to~{c}", attrs, c)
    for a, b in turns:
        ins, outs = f"{s}~from~{a}", f"{s}~to~{b}"
        if ins in H and outs in H:
            cap = min(H.edges[ins, up]["cap"], H.edges[dn, outs]["cap"])
            H.add_edge(ins, outs, type="internal", cap=cap)


def _via(H: nx.DiGraph, tail, head, node, attrs: dict, child) -> None:
    """The link ``tail -> head`` through a new ``node``: its half at ``child`` keeps the link's
    data, the other half is an internal link as wide."""
    d = H.edges[tail, head]
    inner = {"type": "internal", "cap": d["cap"]}
    H.remove_edge(tail, head)
    H.add_node(node, **attrs)
    H.add_edge(tail, node, **(d if tail == child else inner))
    H.add_edge(node, head, **(d if head == child else inner))


def _split(H: nx.DiGraph, s, kinds: dict, level: dict) -> None:
    up, dn = f"{s}~up", f"{s}~dn"
    attrs = dict(H.nodes[s])
    H.add_node(up, **attrs)
    H.add_node(dn, **attrs)
    below = set(_below(H, s, kinds, level))
    for u, _, d in list(H.in_edges(s, data=True)):
        H.add_edge(u, up if u in below else dn, **d)     # from above: only down
    for _, v, d in list(H.out_edges(s, data=True)):
        H.add_edge(dn if v in below else up, v, **d)     # to above: only up
    H.remove_node(s)
