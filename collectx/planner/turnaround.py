"""PCIe switches that cannot turn traffic around between their GPUs, for the bounds.

Why: a PCIe switch forwards a peer-to-peer transfer from one GPU below it to another without
involving the CPU, and the cut bounds count that route. But CUDA sends peer traffic between two
GPUs that share an NVLink (or xGMI) link over that link, always: there is no way to ask for
PCIe instead. So when every pair of the job's GPUs below a switch shares a direct link (each
PCIe switch of a DGX-1 holds two GPUs joined by NVLink), their PCIe bandwidth is reachable only
through host memory: up through the switch to the CPU and back down, and the switch's uplink
carries such a relay in both directions. A bound that counts the turn inside the switch is
larger than anything the hardware can run (GPUs 0 and 1 of a DGX-1V: 40.75 GB/s counted,
25 + 15.75/2 reachable).

How it works: :func:`without_turnarounds` splits each such switch into an upward half (the links
from below, and the uplink) and a downward half (the downlink, and the links to below), so a
route entering from a GPU can only leave upwards. A NIC hanging off such a switch with no other
link (one machine's graph) carries nothing between GPUs and would only let a route turn through
it, so it is left out; a switch whose NIC leads elsewhere (several machines) is not split, so
GPUDirect routes to the network keep their turn. Switches with a GPU pair below them that shares
no direct link keep the turn too (PCIe peer-to-peer is how those two talk). The result is still
an upper bound on every schedule: a GPU pair that shares a direct link has no other way to use
the switch, and the split never adds capacity on a route that existed.

>>> from collectx.topology import load
>>> from collectx.planner.edge_split import job_graph
>>> G = load("dgx1v")
>>> H = without_turnarounds(job_graph(G, ["GPU0", "GPU1"]), ["GPU0", "GPU1"])
>>> sorted(n for n in H if str(n).startswith("PLX0"))
['PLX0~dn', 'PLX0~up']
>>> H.has_edge("GPU0", "PLX0~up") and H.has_edge("PLX0~dn", "GPU1")
True
"""

from __future__ import annotations

import itertools

import networkx as nx

DIRECT_TYPES = ("nvlink", "xgmi")   # GPU-to-GPU links CUDA peer copies always take


def without_turnarounds(G: nx.DiGraph, gpus) -> nx.DiGraph:
    """``G`` (a job graph) with every switch that cannot turn traffic between its GPUs split
    into ``<switch>~up`` and ``<switch>~dn`` halves; ``G`` itself is returned when none is."""
    kinds = dict(G.nodes(data="kind"))
    level = pcie_levels(G, kinds)
    split = [s for s, k in kinds.items() if k == "pci_switch" and _leaves_only(G, s, kinds) and
             all_direct(G, _gpus_below(G, s, kinds, level, set(gpus)))]
    if not split:
        return G
    H = G.copy()
    for s in split:
        H.remove_nodes_from(_leaf_devices(H, s, kinds))
        _split(H, s, kinds, level)
    return H


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


def all_direct(G: nx.DiGraph, gpus) -> bool:
    """At least two ``gpus``, every two joined by a direct GPU link."""
    gpus = list(gpus)
    return len(gpus) >= 2 and all(direct_link(G, a, b)
                                  for a, b in itertools.permutations(gpus, 2))


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
