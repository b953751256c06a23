"""Import the GPU tables printed by ``rocm-smi --showtopo`` (text, or ``--json``).

How it works: rocm-smi prints, per pair of GPUs, a weight, a hop count and a link type (``XGMI``
or ``PCIE``), and per GPU its NUMA node. From them:

* xGMI: two GPUs whose link type is ``XGMI`` and whose weight is the least of the xGMI pairs
  are joined directly, by one ``xgmi`` link of ``xgmi_bw`` GB/s. The driver weighs a direct
  xGMI hop 15 and more for each hop a route adds; the hop count says 1 for any pair reachable
  over xGMI, directly or not, so it is not read. The tables give no bundle widths (MI250's
  GCDs are joined by 1, 2 or 4 links): pass ``xgmi_bw`` for one link of the machine's GPUs
  (:data:`~.pcie.XGMI_GBPS_BY_ARCH`), or import RCCL's topology XML or ``amd-smi
  topology`` (:func:`~.amdsmi.from_amd_smi`), which give them.
* PCIe: each GPU hangs off the ``CPU<n>`` of its NUMA node (one ``CPU0`` where the tables give
  none) by a ``pcie_bw`` link; CPUs are joined pairwise by ``smp`` links. The tables show no
  PCIe switches and no NICs.

A cell the driver could not read (type ``XXXX``, weight ``None``) is unknown: not xGMI, and a
pair of unknown weight is taken as joined. ``--json`` holds the same tables, one ``system``
entry per pair, and the NUMA nodes per ``cardN``.

>>> G = from_rocm_smi('''
... ============= Weight between two GPUs =============
...        GPU0         GPU1         GPU2
... GPU0   0            15           30
... GPU1   15           0            15
... GPU2   30           15           0
... =========== Link Type between two GPUs ===========
...        GPU0         GPU1         GPU2
... GPU0   0            XGMI         XGMI
... GPU1   XGMI         0            XGMI
... GPU2   XGMI         XGMI         0
... ================== Numa Nodes ===================
... GPU[0]          : (Topology) Numa Node: 0
... GPU[1]          : (Topology) Numa Node: 0
... GPU[2]          : (Topology) Numa Node: 1
... ''')
>>> sorted((a, b) for a, b, t in G.edges(data="type") if t == "xgmi" and a < b)
[('GPU0', 'GPU1'), ('GPU1', 'GPU2')]
>>> sorted(G.successors("CPU1"))
['CPU0', 'GPU2']
"""

from __future__ import annotations

import json
import re

import networkx as nx

from ..errors import TopologyError
from .model import add_link, add_node, new_graph, read_source
from .nvsmi import one_line_file
from .pcie import DEFAULT_XGMI_GBPS

_TITLE = re.compile(r"^=+\s*(.*?)\s*=+\s*$")
_NUMA = re.compile(r"^GPU\s*\[?\s*(\d+)\s*\]?\s*:\s*\(Topology\)\s*Numa Node\s*:\s*(-?\d+)")
_GPU = re.compile(r"^GPU(\d+)$")
TABLES = {"weight": "Weight between two GPUs", "type": "Link Type between two GPUs"}
_TYPES = ("XGMI", "PCIE", "XXXX")   # XXXX: a pair whose type the driver could not read
_UNKNOWN_WEIGHT = ("None", "N/A")   # a pair whose weight the driver could not read
# --json: one "system" entry per pair (upper triangle), one "cardN" dict per GPU
_JSON_KEY = re.compile(r"^\(Topology\) (Weight|Link type) between DRM devices (\d+) and (\d+)$")
_JSON_TABLES = {"Weight": "weight", "Link type": "type"}
_JSON_NUMA = "(Topology) Numa Node"


def looks_like_rocm_smi(text: str) -> bool:
    """Whether ``text`` holds rocm-smi's link type table, as text or ``--json`` (what
    :func:`from_rocm_smi` needs)."""
    return TABLES["type"] in text or "(Topology) Link type between DRM devices" in text


def from_rocm_smi(source, xgmi_bw: float = DEFAULT_XGMI_GBPS, pcie_bw: float = 15.75,
                  smp_bw: float = 10.0) -> nx.DiGraph:
    """Build a topology from ``rocm-smi --showtopo`` output, text or ``--json`` (or a file path).

    Parameters
    ----------
    source : str or os.PathLike
        The output, or a path to a file holding it.
    xgmi_bw, pcie_bw, smp_bw : float
        Line rates (GB/s per direction) to give one xGMI link, PCIe links and CPU-CPU links,
        which the tables do not show.

    Raises
    ------
    TopologyError
        No link type table, a table whose rows do not match its header, or an unknown cell
        (the message gives the line).

    See Also
    --------
    from_nccl_xml, from_nvidia_smi, collectx.topology.load
    """
    text = read_source(source, "rocm-smi topology", one_line_file)
    tables, numa = _from_json(text) if text.lstrip().startswith("{") else _parse(text)
    if "type" not in tables:
        raise TopologyError(f"rocm-smi topology: no '{TABLES['type']}' table; expected the "
                            f"output of 'rocm-smi --showtopo'")
    types, gpus = tables["type"], sorted(tables["type"][0], key=int)
    weights = tables.get("weight", ({}, {}))[1]
    G = new_graph("rocm_smi", "imported from rocm-smi --showtopo")
    numa = {g: numa[g] for g in gpus if numa.get(g, -1) >= 0}   # -1: rocm-smi knows none
    for g in gpus:
        add_node(G, f"GPU{g}", "gpu", **({"numa": numa[g]} if g in numa else {}))
    for a, b in xgmi_pairs(gpus, types[1], weights):
        add_link(G, f"GPU{a}", f"GPU{b}", "xgmi", xgmi_bw)
    hang_off_cpus(G, {f"GPU{g}": numa.get(g) for g in gpus}, pcie_bw, smp_bw)
    return G


def xgmi_pairs(gpus: list, types: dict, weights: dict) -> list:
    """The pairs ``(a, b)``, ``a < b`` in the order of ``gpus``, joined directly by xGMI: link
    type ``XGMI`` either way (``types[a, b]``) and the least weight of such pairs (a pair
    whose weight is unknown, None or missing, is taken as joined: nothing says otherwise)."""
    xgmi = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]
            if "XGMI" in (types[a, b], types[b, a])]
    known = [w for a, b in xgmi if (w := weights.get((a, b))) is not None]
    least = min(known, default=0)
    return [(a, b) for a, b in xgmi if weights.get((a, b)) is None or weights[a, b] <= least]


def hang_off_cpus(G: nx.DiGraph, numa: dict, pcie_bw: float, smp_bw: float,
                  numa_known: bool = True) -> None:
    """Hang each GPU of ``numa`` (``{gpu: NUMA node or None}``) off ``CPU<node>`` by a
    ``pcie_bw`` link (``CPU0`` where no GPU's node is known, else the least known), and join
    the CPUs pairwise by ``smp`` links. ``numa_known``: the nodes are the machine's NUMA
    nodes (kept on the CPUs as ``numa``), not only which GPUs share a CPU."""
    cpus = sorted({n for n in numa.values() if n is not None}) or [0]
    for c in cpus:
        add_node(G, f"CPU{c}", "cpu", **({"numa": c} if numa_known else {}))
    for gpu, node in numa.items():
        add_link(G, gpu, f"CPU{cpus[0] if node is None else node}", "pcie", pcie_bw)
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            add_link(G, f"CPU{a}", f"CPU{b}", "smp", smp_bw)


def _parse(text: str):
    """``({"weight"|"type": (gpus, {(a, b): cell})}, {gpu: numa node})``."""
    tables, numa, name, header = {}, {}, None, None
    for number, line in enumerate(text.splitlines(), start=1):
        if (title := _TITLE.match(line.strip())):
            name = next((k for k, t in TABLES.items() if t == title.group(1)), None)
            header = None
            continue
        if (node := _NUMA.match(line.strip())):
            numa[node.group(1)] = int(node.group(2))
            continue
        toks = line.split()
        # other lines (a warning rocm-smi prints between tables, say) are not the table's
        if name is None or not toks or not _GPU.match(toks[0]):
            continue
        if header is None:
            if all(_GPU.match(t) for t in toks):
                header = [_GPU.match(t).group(1) for t in toks]
                tables[name] = ({g: i for i, g in enumerate(header)}, {})
            continue
        _add_row(tables[name][1], header, name, _GPU.match(toks[0]).group(1), toks[1:], number)
    for name, (gpus, cells) in tables.items():
        missing = [g for g in gpus if (g, g) not in cells]
        if missing:
            raise TopologyError(f"rocm-smi topology: the {TABLES[name]!r} table has no row for "
                                f"GPU{', GPU'.join(missing)}; expected one row per column")
    return tables, numa


def _add_row(cells: dict, header: list, name: str, gpu: str, row: list, number: int) -> None:
    if (gpu, gpu) in cells:
        raise TopologyError(f"rocm-smi topology line {number}: second row for GPU{gpu} in the "
                            f"{TABLES[name]!r} table")
    if len(row) != len(header):
        raise TopologyError(f"rocm-smi topology line {number}: row GPU{gpu} has {len(row)} "
                            f"cells; expected {len(header)}, one per GPU of the header")
    for other, cell in zip(header, row):
        cells[gpu, other] = _reading(name, cell, other == gpu,
                                     f"line {number}: cell GPU{gpu}/GPU{other}")


def _reading(name: str, cell: str, own: bool, where: str):
    """A cell's reading: its link type, or its weight (None where the driver gave none)."""
    if name == "type" and (own or cell in _TYPES):
        return cell
    if name == "weight" and (cell.isdecimal() or cell in _UNKNOWN_WEIGHT):
        return int(cell) if cell.isdecimal() else None
    raise TopologyError(f"rocm-smi topology {where} is {cell!r}; expected "
                        f"{' or '.join(_TYPES) if name == 'type' else 'a whole number'}")


def _from_json(text: str):
    """:func:`_parse`'s reading of ``rocm-smi --showtopo --json``."""
    try:
        data = json.loads(text)
        pairs = [(m, value) for key, value in data["system"].items()
                 if (m := _JSON_KEY.match(key))]
        numa = {card[4:]: int(info[_JSON_NUMA]) for card, info in data.items()
                if card[:4] == "card" and card[4:].isdecimal() and _JSON_NUMA in info}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise TopologyError(f"rocm-smi topology --json: {exc!r}; expected a 'system' dict "
                            f"holding '(Topology) Link type between DRM devices A and B' "
                            f"entries") from None
    gpus = sorted({m.group(i) for m, _ in pairs for i in (2, 3)} | set(numa), key=int)
    tables = {}
    for m, value in pairs:
        name, a, b = _JSON_TABLES[m.group(1)], m.group(2), m.group(3)
        cells = tables.setdefault(name, ({g: i for i, g in enumerate(gpus)}, {}))[1]
        where = f"--json: {m.group(0)!r}"
        cells[a, b] = cells[b, a] = _reading(name, str(value), a == b, where)
    for name, (_, cells) in tables.items():
        for a in gpus:
            for b in gpus:
                cells.setdefault((a, b), "0" if name == "type" and a == b else
                                 0 if a == b else None if name == "weight" else "XXXX")
    return tables, numa
