"""Synthetic topologies: toy shapes for tests and docs, multi-node clusters, the CPU host.

All bandwidths are GB/s per direction (line rates); 25 GB/s is one NVLink2/3/4 link.

>>> [len(gpus(f(4))) for f in (ring, line, fully_connected, switch)]
[4, 4, 4, 4]
"""

from __future__ import annotations

import networkx as nx

from ..errors import TopologyError, integral
from .model import add_link, add_node, gpus, new_graph, nodes_of_kind

# One core's memcpy bandwidth between two buffers in DRAM is ~8-12 GB/s on current x86 server
# cores (STREAM copy per core); one shm link per rank models what a single worker can move.
DEFAULT_SHM_BW = 10.0
# Cross-socket bandwidth as NCCL charges it (SKL_QPI_BW, topo.h): a conservative UPI figure.
DEFAULT_SMP_BW = 10.0


def _check_n(n: int, least: int = 1, what: str = "GPUs") -> None:
    if integral(n) is None or n < least:
        raise TopologyError(f"number of {what} {n!r}: expected an integer >= {least}")


def _gpu_graph(name: str, description: str, n: int) -> nx.DiGraph:
    _check_n(n)
    G = new_graph(name, description)
    for i in range(n):
        add_node(G, f"GPU{i}", "gpu")
    return G


def ring(n: int, bw: float = 25.0) -> nx.DiGraph:
    """``n`` GPUs in a cycle of NVLinks (GPUi - GPUi+1 - ... - GPU0).

    >>> sorted(ring(4).successors("GPU0"))
    ['GPU1', 'GPU3']
    """
    G = _gpu_graph(f"ring{n}", f"{n} GPUs in a ring of {bw} GB/s NVLinks", n)
    for i in range(n if n > 2 else n - 1):
        add_link(G, f"GPU{i}", f"GPU{(i + 1) % n}", "nvlink", bw)
    return G


def line(n: int, bw: float = 25.0) -> nx.DiGraph:
    """``n`` GPUs in a chain of NVLinks (GPU0 - GPU1 - ... - GPUn-1).

    >>> line(3).number_of_edges()
    4
    """
    G = _gpu_graph(f"line{n}", f"{n} GPUs in a line of {bw} GB/s NVLinks", n)
    for i in range(n - 1):
        add_link(G, f"GPU{i}", f"GPU{i + 1}", "nvlink", bw)
    return G


def fully_connected(n: int, bw: float = 25.0) -> nx.DiGraph:
    """``n`` GPUs with one NVLink per pair.

    >>> fully_connected(4).number_of_edges()
    12
    """
    G = _gpu_graph(f"fully_connected{n}", f"{n} GPUs, all pairs joined by {bw} GB/s", n)
    for i in range(n):
        for j in range(i + 1, n):
            add_link(G, f"GPU{i}", f"GPU{j}", "nvlink", bw)
    return G


def switch(n: int, bw: float = 25.0) -> nx.DiGraph:
    """``n`` GPUs each joined to one NVSwitch ``NVS0`` by ``bw`` GB/s.

    >>> switch(2).edges["GPU1", "NVS0"]["bw_gbps"]
    25.0
    """
    G = _gpu_graph(f"switch{n}", f"{n} GPUs on one NVSwitch, {bw} GB/s per GPU", n)
    add_node(G, "NVS0", "nvswitch")
    for i in range(n):
        add_link(G, f"GPU{i}", "NVS0", "nvlink", bw)
    return G


def pcie_tree(sockets: int = 2, switches: int = 2, per_switch: int = 2, *,
              pcie_bw: float = 31.5, smp_bw: float = 40.0, pair_bw: float | None = None,
              pairs_across: bool = False) -> nx.DiGraph:
    """A PCIe server: ``sockets`` CPUs joined by one socket link, ``switches`` PCIe switches
    under each CPU and ``per_switch`` GPUs under each switch, every PCIe link ``pcie_bw``.

    With ``pair_bw`` GPUs ``2i`` and ``2i + 1`` are joined by an NVLink bridge of that
    bandwidth: switch-mates by default, or with ``pairs_across`` GPU ``i`` with its peer under
    the next switch (their peer copies take the bridge, their PCIe paths climb to the CPU).

    >>> G = pcie_tree(2, 2, 2, pair_bw=50.0)
    >>> len(gpus(G)), G.edges["GPU0", "GPU1"]["type"], G.edges["PLX0", "CPU0"]["bw_gbps"]
    (8, 'nvlink', 31.5)
    >>> pcie_tree(1, 2, 2, pair_bw=50.0, pairs_across=True).has_edge("GPU0", "GPU2")
    True
    """
    for count, what in ((sockets, "sockets"), (switches, "PCIe switches per socket"),
                        (per_switch, "GPUs per switch")):
        _check_n(count, what=what)
    n = sockets * switches * per_switch
    G = _gpu_graph(f"pcie_tree_{sockets}x{switches}x{per_switch}",
                   f"{sockets} sockets, {switches} PCIe switches each, {per_switch} GPUs per "
                   f"switch", n)
    for c in range(sockets):
        add_node(G, f"CPU{c}", "cpu")
        if c:
            add_link(G, f"CPU{c - 1}", f"CPU{c}", "smp", smp_bw)
        for w in range(switches):
            plx = f"PLX{c * switches + w}"
            add_node(G, plx, "pci_switch")
            add_link(G, plx, f"CPU{c}", "pcie", pcie_bw)
            for k in range(per_switch):
                add_link(G, f"GPU{(c * switches + w) * per_switch + k}", plx, "pcie", pcie_bw)
    if pair_bw:
        for a, b in _bridge_pairs(n, per_switch, pairs_across):
            add_link(G, f"GPU{a}", f"GPU{b}", "nvlink", pair_bw)
    return G


def _bridge_pairs(n: int, per_switch: int, across: bool) -> list[tuple[int, int]]:
    """GPU pairs joined by NVLink bridges: switch-mates, or GPU ``i`` with the GPU in the same
    position under the next switch."""
    if not across:
        return [(i, i + 1) for i in range(0, n - 1, 2)]
    out, used = [], set()
    for i in range(n):
        j = i + per_switch
        if j < n and i not in used and j not in used:
            out.append((i, j))
            used |= {i, j}
    return out


def multi_node(node_topology, n_nodes: int, nic_bw: float, rails: bool = True) -> nx.DiGraph:
    """``n_nodes`` copies of a node topology joined by a network.

    Parameters
    ----------
    node_topology : nx.DiGraph or str
        One node (a graph, or anything :func:`collectx.topology.load` accepts).
    n_nodes : int
        Number of nodes; node ``k``'s ids are prefixed ``"n<k>/"`` ("n0/GPU0", ...), so
        :func:`gpus` lists GPUs node-major.
    nic_bw : float
        GB/s per direction of each NIC's network link.
    rails : bool
        True: NIC ``i`` of every node joins rail switch ``RAIL<i>`` (rail-optimized fabric);
        False: all NICs join one switch ``NETSW``.

    Notes
    -----
    A node without NICs gets one NIC per GPU (``NIC<i>``, joined to its GPU by PCIe at
    ``nic_bw``), as on rail-optimized DGX/HGX clusters.

    Examples
    --------
    >>> G = multi_node(switch(2), 2, nic_bw=50.0)
    >>> gpus(G)
    ['n0/GPU0', 'n0/GPU1', 'n1/GPU0', 'n1/GPU1']
    >>> sorted(G.successors("RAIL1"))
    ['n0/NIC1', 'n1/NIC1']
    """
    from .jsonio import load
    _check_n(n_nodes, what="machines")
    base = _with_nics(load(node_topology), nic_bw)
    nics = nodes_of_kind(base, "nic")
    name = f"{base.graph.get('name', 'node')}x{n_nodes}"
    G = new_graph(name, f"{n_nodes} x {base.graph.get('name', 'node')}, "
                        f"{len(nics)} NICs/node at {nic_bw} GB/s, {'rails' if rails else 'one switch'}")
    for k in range(n_nodes):
        _add_copy(G, base, f"n{k}/")
    switches = [f"RAIL{i}" for i in range(len(nics))] if rails else ["NETSW"]
    for sw in switches:
        add_node(G, sw, "net_switch")
    for k in range(n_nodes):
        for i, nic in enumerate(nics):
            add_link(G, f"n{k}/{nic}", switches[i if rails else 0], "net", nic_bw)
    return G


def multi_node_spec(spec: str) -> nx.DiGraph:
    """A cluster from ``"multi:PRESET:NODES:GBPS[:single]"`` (the ``collectx plan`` SOURCE).

    ``GBPS`` is per NIC and direction; ``:single`` joins all NICs to one switch instead of
    rails.

    >>> G = multi_node_spec("multi:dgx_h100:2:50")
    >>> len(gpus(G)), sorted(G.successors("RAIL0"))
    (16, ['n0/NIC0', 'n1/NIC0'])
    """
    parts = spec.split(":")
    ok = len(parts) in (4, 5) and parts[0] == "multi" and parts[4:] in ([], ["single"])
    try:
        n_nodes, nic_bw = int(parts[2]), float(parts[3])
    except (IndexError, ValueError):
        ok = False
    if not ok:
        raise TopologyError(f"cluster spec {spec!r}: expected multi:PRESET:NODES:GBPS[:single], "
                            f"e.g. multi:dgx_h100:16:50")
    return multi_node(parts[1], n_nodes, nic_bw, rails=len(parts) == 4)


def _with_nics(node: nx.DiGraph, nic_bw: float) -> nx.DiGraph:
    if nodes_of_kind(node, "nic"):
        return node
    H = node.copy()
    for i, g in enumerate(gpus(node)):
        add_node(H, f"NIC{i}", "nic")
        add_link(H, g, f"NIC{i}", "pcie", nic_bw)
    return H


def _add_copy(G: nx.DiGraph, base: nx.DiGraph, prefix: str) -> None:
    for n, data in base.nodes(data=True):
        G.add_node(prefix + n, **data)
    for a, b in base.graph.get("link_order", ()):
        if base.has_edge(a, b):
            data = dict(base.edges[a, b])
            add_link(G, prefix + a, prefix + b, directed=not base.has_edge(b, a), **data)


def host(nranks: int, numa_nodes: int = 1, shm_bw: float = DEFAULT_SHM_BW,
         smp_bw: float = DEFAULT_SMP_BW) -> nx.DiGraph:
    """The CPU-rank topology the shared-memory runtime plans on.

    Rank ``i`` is node ``RANK<i>`` (kind ``"gpu"`` = rank endpoint, ``device="cpu"``), joined by
    an ``shm`` link of ``shm_bw`` GB/s to its NUMA node ``CPU<i % numa_nodes>`` (kind ``cpu``);
    NUMA nodes are joined pairwise by ``smp`` links of ``smp_bw``.

    Notes
    -----
    ``shm_bw`` defaults to 10 GB/s, an estimate of one core's copy bandwidth (STREAM copy per
    core on current x86 servers); ``smp_bw`` to NCCL's Skylake UPI figure.

    Examples
    --------
    >>> H = host(4, numa_nodes=2)
    >>> gpus(H), sorted(H.successors("CPU1"))
    (['RANK0', 'RANK1', 'RANK2', 'RANK3'], ['CPU0', 'RANK1', 'RANK3'])
    """
    _check_n(nranks, what="ranks")
    _check_n(numa_nodes, what="NUMA nodes")
    G = new_graph(f"host{nranks}", f"{nranks} CPU ranks over shared memory on "
                                   f"{numa_nodes} NUMA node(s)")
    for j in range(numa_nodes):
        add_node(G, f"CPU{j}", "cpu", numa=j)
    for i in range(nranks):
        add_node(G, f"RANK{i}", "gpu", device="cpu", numa=i % numa_nodes)
        add_link(G, f"RANK{i}", f"CPU{i % numa_nodes}", "shm", shm_bw)
    for j in range(numa_nodes):
        for k in range(j + 1, numa_nodes):
            add_link(G, f"CPU{j}", f"CPU{k}", "smp", smp_bw)
    return G


__all__ = ["ring", "line", "fully_connected", "switch", "multi_node", "multi_node_spec", "host"]
