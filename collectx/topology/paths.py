"""GPU-to-GPU paths: NCCL-style path classes and widest-path bandwidths.

How it works: for each source, a max-min Dijkstra finds the best bottleneck bandwidth to every
node (the *widest path*); among paths with that bottleneck, a breadth-first search over links at
least that wide picks one with the fewest hops. The path's class is the worst over its hops.

Classes (lower is better), following NCCL's ``PATH_*`` (src/include/graph.h) with one change:

===== ==========================================================================================
LOC   the same endpoint
NVL   one direct NVLink / xGMI link
NVB   NVLink all the way, but through an NVSwitch or an intermediate GPU (NCCL counts a path
      through an NVSwitch as NVL; collectx keeps NVL for a direct link so that "NVL" always
      means "one hop")
C2C   a GPU's NVLink-C2C link to its own CPU (Grace), for copies into host memory
PIX   PCIe through at most one PCIe switch
PXB   PCIe through several PCIe switches, not through a CPU
PXN   PCIe and NVLink through an intermediate GPU (a NIC reached through another GPU's NVLinks)
PHB   through a CPU / host bridge (also shared memory within one NUMA node)
SYS   across the inter-socket link (any CPU-CPU link, e.g. UPI or AMD's socket xGMI)
NET   across the network
===== ==========================================================================================

``bw_gbps`` is one route's bottleneck: on NVSwitch systems a GPU pair reaches more over all
switches together (e.g. 450 GB/s on an HGX H100, where one switch route gives 125); the
planner's cut and flow bounds count that, paths do not.

A GPU is used as a relay only between two NVLink/xGMI hops (as NCCL's NVB paths do) or between
NVLink and a NIC reached through PCIe switches (NCCL's PXN); a PCIe-only route never goes
through a GPU. Bandwidths are the line rates of the graph.

>>> from collectx.topology import load
>>> G = load("dgx1v")
>>> p = widest_path(G, "GPU0", "GPU3")
>>> p.cls.name, p.bw_gbps, p.hops
('NVL', 50.0, ('GPU0', 'GPU3'))
>>> path_class(G, "GPU0", "GPU5").name
'NVB'
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from collections import deque
from itertools import count

import networkx as nx

from ..errors import TopologyError
from .model import GPU_LINK_TYPES, gpus, natural_key

_NVLINK_TYPES = GPU_LINK_TYPES


class PathClass(enum.IntEnum):
    """How two endpoints are connected; lower is better."""

    LOC = 0
    NVL = 1
    NVB = 2
    C2C = 3
    PIX = 4
    PXB = 5
    PXN = 6
    PHB = 7
    SYS = 8
    NET = 9


@dataclasses.dataclass(frozen=True, slots=True)
class Path:
    """A route between two endpoints.

    ``cls`` is the path class, ``bw_gbps`` the bottleneck line rate (GB/s per direction) and
    ``hops`` the node ids from source to destination, both included.
    """

    cls: PathClass
    bw_gbps: float
    hops: tuple[str, ...]


class _Links:
    """The graph's out-links, prepared once per query: (next node, GB/s, link type, next kind),
    in natural order so that ties between equal routes break the same way every time."""

    def __init__(self, G: nx.DiGraph) -> None:
        self.kind = dict(G.nodes(data="kind"))
        self.avoid: frozenset = frozenset()   # nodes a route may end at but not pass through
        self.widths: dict = {}                 # {(u, v): GB/s} overriding links' bandwidth
        self.out = {
            n: [(m, d["bw_gbps"], d["type"], self.kind.get(m))
                for m, d in sorted(G[n].items(), key=lambda item: natural_key(item[0]))]
            for n in G}

    def constrained(self, widths: dict | None, avoid) -> "_Links":
        """These links with ``widths`` and ``avoid`` (sharing the prepared adjacency)."""
        other = object.__new__(_Links)
        other.kind, other.out = self.kind, self.out
        other.widths, other.avoid = widths or {}, frozenset(avoid)
        return other

    def leaving(self, node: str):
        """``(next node, GB/s, link type, next kind)`` of the links out of ``node``."""
        if not self.widths:
            return self.out[node]
        return [(m, self.widths.get((node, m), bw), t, k) for m, bw, t, k in self.out[node]]

    def step(self, node: str, arrived: str | None, link_type: str, nxt_kind) -> str | None:
        """The state a route enters the next node in, or None if it may not take this link.

        States: "nv" (over NVLink), "nic" (PCIe coming from a NIC, kept through PCIe switches
        down to a GPU), "pxn" (PCIe leg from a relaying GPU, which must reach a NIC through
        PCIe switches only), else the link type. Only GPUs and that PXN leg restrict routes:
        a GPU forwards NVLink to NVLink (NCCL's NVB) and between NVLink and a NIC on its PCIe
        side (NCCL's PXN: a GPU reaches a rail's NIC through the peer GPU next to it).
        """
        kind, nv = self.kind[node], link_type in _NVLINK_TYPES
        toward_nic = nxt_kind in ("pci_switch", "nic")
        relaying_gpu = kind == "gpu" and arrived is not None
        if relaying_gpu and not (arrived == "nv" and (nv or (link_type == "pcie" and toward_nic))
                                 or arrived == "nic" and nv):
            return None
        if arrived == "pxn" and kind == "pci_switch" and not toward_nic:
            return None
        if nv:
            return "nv"
        if link_type != "pcie":
            return link_type
        if kind == "nic" or (arrived == "nic" and nxt_kind in ("pci_switch", "gpu")):
            return "nic"
        if relaying_gpu or arrived == "pxn":
            return "pxn"
        return "pcie"


def _widest_bottlenecks(L: _Links, src: str) -> dict[str, float]:
    """Best bottleneck bandwidth from ``src`` to every reachable node (max-min Dijkstra).

    The search state is (node, how it was entered; see ``_Links.step``), because whether a GPU may
    relay depends on how the route reached it.
    """
    best_state: dict[tuple[str, str | None], float] = {(src, None): float("inf")}
    best_node: dict[str, float] = {}
    tie = count()
    heap = [(-float("inf"), next(tie), src, None)]
    while heap:
        neg_bw, _, node, arrived = heapq.heappop(heap)
        bw = -neg_bw
        if bw < best_state.get((node, arrived), 0.0):
            continue
        best_node[node] = max(best_node.get(node, 0.0), bw)
        if node in L.avoid and node != src:
            continue
        for nxt, link_bw, link_type, nxt_kind in L.leaving(node):
            tag = L.step(node, arrived, link_type, nxt_kind)
            if tag is None:
                continue
            width = min(bw, link_bw)
            if width > best_state.get((nxt, tag), 0.0):
                best_state[(nxt, tag)] = width
                heapq.heappush(heap, (-width, next(tie), nxt, tag))
    best_node.pop(src, None)
    return best_node


def _fewest_hops(L: _Links, src: str, targets: set[str], width: float) -> dict[str, tuple]:
    """Shortest routes (in hops) from ``src`` over links at least ``width`` wide."""
    start = (src, None)
    parent: dict[tuple, tuple | None] = {start: None}
    found: dict[str, tuple] = {}
    queue = deque([start])
    while queue and len(found) < len(targets):
        node, arrived = state = queue.popleft()
        if node in targets and node not in found:
            found[node] = _unwind(parent, state)
        if node in L.avoid and node != src:
            continue
        for nxt, link_bw, link_type, nxt_kind in L.leaving(node):
            tag = L.step(node, arrived, link_type, nxt_kind) if link_bw >= width else None
            nxt_state = (nxt, tag)
            if tag is None or nxt_state in parent:
                continue
            parent[nxt_state] = state
            queue.append(nxt_state)
    return found


def _unwind(parent: dict, state: tuple) -> tuple[str, ...]:
    hops = []
    while state is not None:
        hops.append(state[0])
        state = parent[state]
    return tuple(reversed(hops))


def classify(G: nx.DiGraph, hops: tuple[str, ...]) -> PathClass:
    """The class of a route given as node ids (see the module docstring for the rules).

    >>> from collectx.topology import load
    >>> classify(load("dgx1v"), ("GPU0", "PLX0", "CPU0", "PLX1", "GPU2")).name
    'PHB'
    """
    if len(hops) < 2:
        return PathClass.LOC
    worst = PathClass.NVL if len(hops) == 2 else PathClass.NVB
    pci_switches = sum(G.nodes[n].get("kind") == "pci_switch" for n in hops[1:-1])
    for a, b in zip(hops, hops[1:]):
        worst = max(worst, _hop_class(G, a, b, pci_switches))
    relayed = any(G.nodes[n].get("kind") == "gpu" for n in hops[1:-1])
    if relayed and PathClass.PIX <= worst < PathClass.PXN:   # PCIe to a GPU, then its NVLinks
        worst = PathClass.PXN
    return worst


def _hop_class(G: nx.DiGraph, a: str, b: str, pci_switches: int) -> PathClass:
    kind = G.edges[a, b]["type"]
    if G.nodes[a].get("kind") == G.nodes[b].get("kind") == "cpu":
        return PathClass.SYS  # socket to socket, whatever the wire (UPI, AMD xGMI)
    if kind in _NVLINK_TYPES:
        return PathClass.NVL
    if kind == "pcie":
        if "cpu" in (G.nodes[a].get("kind"), G.nodes[b].get("kind")):
            return PathClass.PHB
        return PathClass.PXB if pci_switches > 1 else PathClass.PIX
    return {"c2c": PathClass.C2C, "shm": PathClass.PHB, "smp": PathClass.SYS,
            "net": PathClass.NET}[kind]


def _paths_from(G: nx.DiGraph, L: _Links, src: str, targets: list[str],
                widths: dict[str, float] | None = None) -> dict[str, Path]:
    widths = _widest_bottlenecks(L, src) if widths is None else widths
    by_width: dict[float, set[str]] = {}
    for t in targets:
        if t != src and t in widths:
            by_width.setdefault(widths[t], set()).add(t)
    out = {}
    for width, group in by_width.items():
        for t, hops in _fewest_hops(L, src, group, width).items():
            out[t] = Path(classify(G, hops), width, hops)
    return out


def widest_path(G: nx.DiGraph, a: str, b: str, *, widths: dict | None = None,
                avoid=()) -> Path:
    """The widest route from ``a`` to ``b`` (fewest hops among equally wide ones).

    ``widths`` overrides some links' bandwidth (``{(u, v): GB/s}``; a route never takes a link
    of width 0: a planner's residual capacities), and the route passes through no node of
    ``avoid`` (it may end at one). :class:`Router` answers many such questions on one graph.

    Raises
    ------
    TopologyError
        If a node is unknown or ``b`` cannot be reached from ``a``.

    >>> from collectx.topology import ring
    >>> widest_path(ring(4), "GPU0", "GPU2", avoid={"GPU1"}).hops
    ('GPU0', 'GPU3', 'GPU2')
    """
    return Router(G).widest(a, b, widths=widths, avoid=avoid)


class Router:
    """Widest routes on one graph, its links prepared once (searches that ask about many
    pairs and residual widths, such as the ring search, share them)."""

    def __init__(self, G: nx.DiGraph):
        self.G, self.links = G, _Links(G)
        self._widths: dict[str, dict] = {}   # per source, the full-width search's bottlenecks

    def widest(self, a: str, b: str, *, widths: dict | None = None, avoid=()) -> Path:
        """:func:`widest_path` from ``a`` to ``b``."""
        G = self.G
        for end in (a, b):
            if end not in G:
                raise TopologyError(f"{end!r} is not a node of "
                                    f"{G.graph.get('name', 'the topology')!r}")
        if a == b:
            return Path(PathClass.LOC, float("inf"), (a,))
        found = self.widest_from(a, [b], widths=widths, avoid=avoid)
        if b not in found:
            raise TopologyError(f"no route from {a} to {b}: the topology is disconnected "
                                f"there")
        return found[b]

    def widest_from(self, a: str, targets, *, widths: dict | None = None,
                    avoid=()) -> dict[str, Path]:
        """:meth:`widest` from ``a`` to each of ``targets`` it reaches, in one search
        (``a`` itself left out). A route ends at a node of ``avoid`` but never passes one,
        so the routes are those :meth:`widest` gives each target with the same ``avoid``."""
        if a not in self.G:
            raise TopologyError(f"{a!r} is not a node of "
                                f"{self.G.graph.get('name', 'the topology')!r}")
        if widths or avoid:
            return _paths_from(self.G, self.links.constrained(widths, avoid), a, list(targets))
        # Over the full widths one search from `a` serves every later question about it
        # (link classes ask for each rank pair in turn).
        if a not in self._widths:
            self._widths[a] = _widest_bottlenecks(self.links, a)
        return _paths_from(self.G, self.links, a, list(targets), self._widths[a])


def path_class(G: nx.DiGraph, a: str, b: str) -> PathClass:
    """The :class:`PathClass` of the widest route from ``a`` to ``b``.

    >>> from collectx.topology import load
    >>> path_class(load("dgx_h100"), "GPU0", "GPU7").name
    'NVB'
    """
    return widest_path(G, a, b).cls


def paths(G: nx.DiGraph, endpoints: list[str] | None = None) -> dict[tuple[str, str], Path]:
    """Widest paths between every ordered pair of distinct endpoints (default: :func:`gpus`).

    Pairs with no route are left out. Cost: one Dijkstra plus one BFS per distinct bottleneck
    value per source, so O(n * k * E log V) for n endpoints and k distinct widths.

    Examples
    --------
    >>> from collectx.topology import load
    >>> P = paths(load("dgx1v"))
    >>> len(P), P["GPU0", "GPU3"].bw_gbps, P["GPU0", "GPU5"].cls > PathClass.NVL
    (56, 50.0, True)
    """
    ends = gpus(G) if endpoints is None else list(endpoints)
    out = {}
    links = _Links(G)
    for src in ends:
        for dst, p in _paths_from(G, links, src, ends).items():
            out[src, dst] = p
    return out
