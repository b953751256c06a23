"""``collectx topo [SOURCE] [--gpus LIST] [--json] [--draw OUT]``: show a machine's wiring.

The text output is a GPU x GPU matrix in the spirit of ``nvidia-smi topo -m``: ``NV#`` (``XG#``
for xGMI) where # links join the pair directly or through NVSwitches both GPUs are wired to,
otherwise the class of the widest route (see :mod:`collectx.topology.paths`), each followed by
its GB/s per direction (line rate). Then one
line per NIC (its nearest GPUs) and per CPU (the GPUs it hosts).

>>> print(format_topology(load("dgx1v"), legend=False).splitlines()[1])
GPU0    X       NV1 25  NV1 25  NV2 50  NV2 50  NVB 50  NVB 50  NVB 50
"""

from __future__ import annotations

import argparse
import json

import networkx as nx

from ..topology import load, local_topology, nodes_of_kind, subset, to_json
from ..topology.model import GPU_LINK_TYPES, gpus, parse_gpu_list
from ..topology.paths import PathClass, paths

LEGEND = """\
Legend:
  X    = self
  NV#  = # NVLinks joining the pair directly or through NVSwitches both GPUs are wired to
         (XG# = xGMI links); GB/s of all of them together
  NVB  = NVLink all the way, through an NVSwitch or another GPU
  PIX  = PCIe through one PCIe switch          PXB = PCIe through several PCIe switches
  PXN  = PCIe to another GPU, then its NVLinks (a NIC's route to a GPU through a GPU)
  PHB  = through a CPU (PCIe host bridge, or shared memory)
  SYS  = across the CPU sockets' interconnect  NET = across the network
  Other numbers: GB/s per direction of the widest single route's narrowest link (line
  rates); GPUs on several NVSwitches reach more over all routes together."""


def _cell(G: nx.DiGraph, a: str, b: str, P: dict) -> str:
    if a == b:
        return "X"
    edge = G.get_edge_data(a, b)
    if edge and edge["type"] in GPU_LINK_TYPES:
        tag = "NV" if edge["type"] == "nvlink" else "XG"
        return f"{tag}{edge['count']} {edge['bw_gbps']:g}"
    count, bw = _via_shared_nvswitches(G, a, b)
    if count:
        return f"NV{count} {bw:g}"
    if (a, b) not in P:
        return "-"
    return f"{P[a, b].cls.name} {P[a, b].bw_gbps:g}"


def _via_shared_nvswitches(G: nx.DiGraph, a: str, b: str) -> tuple[int, float]:
    """Links and GB/s from ``a`` to ``b`` through NVSwitches both are wired to, all together.

    This is what ``nvidia-smi topo -m`` reports as NV# on NVSwitch systems (NV18 on an HGX
    H100): every switch both GPUs reach carries min(a's bundle, b's bundle) between them.
    """
    count, bw = 0, 0.0
    for sw in G.successors(a):
        if G.nodes[sw].get("kind") == "nvswitch" and G.has_edge(sw, b):
            up, down = G.edges[a, sw], G.edges[sw, b]
            if up["type"] == down["type"] == "nvlink":
                count += min(up["count"], down["count"])
                bw += min(up["bw_gbps"], down["bw_gbps"])
    return count, bw


def _matrix(G: nx.DiGraph, P: dict) -> list[str]:
    ends = gpus(G)
    rows = [[g] + [_cell(G, g, h, P) for h in ends] for g in ends]
    width = max([len(c) for row in rows for c in row] + [len(e) for e in ends]) + 2
    lines = ["".ljust(width) + "".join(e.ljust(width) for e in ends)]
    lines += ["".join(c.ljust(width) for c in row) for row in rows]
    return [line.rstrip() for line in lines]


def _near(P: dict, node: str, ends: list[str]) -> tuple[PathClass | None, list[str]]:
    """The best class from ``node`` to any endpoint, and the endpoints at that class."""
    reach = {g: P[node, g].cls for g in ends if (node, g) in P}
    if not reach:
        return None, []
    best = min(reach.values())
    return best, [g for g in ends if reach.get(g) == best]


def _nic_and_cpu_lines(G: nx.DiGraph) -> list[str]:
    ends = gpus(G)
    nics, cpus = nodes_of_kind(G, "nic"), nodes_of_kind(G, "cpu")
    P = paths(G, ends + nics + cpus) if nics or cpus else {}
    lines = []
    for nic in nics:
        data = G.nodes[nic]
        cls, near = _near(P, nic, ends)
        speed = f", {data['net_gbps']:g} GB/s network" if "net_gbps" in data else ""
        label = f"{nic} ({data['name']})" if "name" in data else nic
        where = f"{cls.name} to {' '.join(near)}" if near else "no GPU reachable"
        lines.append(f"{label}{speed}: {where}")
    for cpu in cpus:
        hosted = [g for g in ends if _nearest_cpu(P, g, cpus) == cpu]
        lines.append(f"{cpu}: {' '.join(hosted) if hosted else 'no GPUs'}")
    return lines


def _nearest_cpu(P: dict, gpu: str, cpus: list[str]) -> str | None:
    ranked = [(P[gpu, c].cls, len(P[gpu, c].hops), c) for c in cpus if (gpu, c) in P]
    return min(ranked)[2] if ranked else None


def format_topology(G: nx.DiGraph, legend: bool = True) -> str:
    """The text ``collectx topo`` prints for ``G``."""
    P = paths(G)
    header = f"# {G.graph.get('name', 'topology')}: {G.graph.get('description', '')}".rstrip(": ")
    switches = [f"{len(nodes_of_kind(G, k))} {label}" for k, label in
                (("nvswitch", "NVSwitches"), ("pci_switch", "PCIe switches"),
                 ("net_switch", "network switches")) if nodes_of_kind(G, k)]
    lines = _matrix(G, P)
    extra = _nic_and_cpu_lines(G)
    if extra:
        lines += [""] + extra
    if switches:
        lines += [f"Switches: {', '.join(switches)}"]
    if legend:
        lines += ["", LEGEND]
    return "\n".join([header] + lines) if legend else "\n".join(lines)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``collectx topo``."""
    p = subparsers.add_parser(
        "topo", help="show a machine's topology (GPU x GPU path matrix, NICs, CPUs)",
        description="Show the topology of this machine (probed, or COLLECTX_TOPO_FILE) or of "
                    "SOURCE: a preset name, a collectx JSON file, an NCCL topology XML, "
                    "'nvidia-smi topo -m', 'rocm-smi --showtopo' or 'amd-smi topology' "
                    "output.")
    p.add_argument("source", nargs="?", metavar="SOURCE",
                   help="preset name or file (default: this machine)")
    p.add_argument("--gpus", metavar="LIST",
                   help="only these GPUs, e.g. 0,1,2,5 or 0-3,6 (indices in GPU order)")
    p.add_argument("--json", action="store_true", help="print collectx.topology/1 JSON")
    p.add_argument("--draw", metavar="OUT", help="also draw the topology to OUT (.svg or .png)")
    return p


def run(args) -> int:
    """Carry out ``collectx topo``; errors propagate as CollectXError."""
    G = load(args.source) if args.source else local_topology()
    if args.gpus is not None:   # an empty list is a mistake, not the whole machine
        G = subset(G, parse_gpu_list(args.gpus))
    if args.draw:
        from ..topology.draw import draw
        draw(G, args.draw)
    if args.json:
        print(json.dumps(to_json(G), indent=1))
    else:
        print(format_topology(G))
        if args.draw:
            print(f"\nDrawing written to {args.draw}")
    return 0
