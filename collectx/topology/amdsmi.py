"""Import the tables printed by ``amd-smi topology`` (ROCm 6 and later), text or ``--json``.

How it works: amd-smi, rocm-smi's successor, prints per pair of GPUs (named by PCI bus id, in
the order it numbers them) a weight, a hop count, a link type and the link's bandwidth, each in
a table of its own (``WEIGHT TABLE:``, ``HOPS TABLE:``, ``LINK TYPE TABLE:``, ``NUMA BW
TABLE:``, ...). From them:

* xGMI: the driver gives a bandwidth (``min-max`` MB/s: its links times one link's rate) only
  to pairs joined directly, so where the NUMA BW table gives any xGMI pair a bandwidth, the
  pairs it gives one are joined, by one ``xgmi`` bundle of that maximum rate. Where it gives
  none (``N/A`` or ``0-0`` everywhere, as some boards report), pairs are chosen as for
  rocm-smi (:func:`~.rocmsmi.xgmi_pairs`: type ``XGMI``, the least weight), at ``xgmi_bw``.
* PCIe: the tables name no NUMA nodes, but hop counts tell them apart: 2 between GPUs over PCIe
  under one CPU, 3 across CPUs (1 is any pair reachable over xGMI, so it tells nothing). GPUs
  two hops apart, or joined by xGMI, share a ``CPU<k>``, numbered in the order of their first
  GPU (not the NUMA node's number, which the tables do not give); each GPU hangs off its CPU
  by a ``pcie_bw`` link, and CPUs are joined pairwise. Where no pair is 3 hops apart, or the
  hops contradict each other, one ``CPU0`` holds all.
  The tables show no PCIe switches and no NICs; RCCL's topology XML does.

>>> G = from_amd_smi('''
... WEIGHT TABLE:
...              0000:0c:00.0 0000:22:00.0 0000:38:00.0
... 0000:0c:00.0 0            15           30
... 0000:22:00.0 15           0            15
... 0000:38:00.0 30           15           0
... LINK TYPE TABLE:
...              0000:0c:00.0 0000:22:00.0 0000:38:00.0
... 0000:0c:00.0 SELF         XGMI         XGMI
... 0000:22:00.0 XGMI         SELF         XGMI
... 0000:38:00.0 XGMI         XGMI         SELF
... NUMA BW TABLE:
...              0000:0c:00.0 0000:22:00.0 0000:38:00.0
... 0000:0c:00.0 N/A          50000-200000 0-0
... 0000:22:00.0 50000-200000 N/A          50000-50000
... 0000:38:00.0 0-0          50000-50000  N/A
... ''')
>>> [(a, b, bw) for a, b, bw in sorted(G.edges(data="bw_gbps")) if a < b and a != "CPU0"]
[('GPU0', 'GPU1', 200.0), ('GPU1', 'GPU2', 50.0)]
>>> G.nodes["GPU2"]["busid"]
'0000:38:00.0'
"""

from __future__ import annotations

import json
import re

import networkx as nx

from ..errors import TopologyError
from .model import add_link, add_node, new_graph, read_source
from .nvsmi import one_line_file
from .pcie import DEFAULT_XGMI_GBPS, normalize_busid
from .rocmsmi import hang_off_cpus, xgmi_pairs

_TITLE = re.compile(r"^([A-Z][A-Z -]*[A-Z]) TABLE:$")
_BUSID = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_BANDWIDTH = re.compile(r"^(\d+)-(\d+)$")
# the tables read, by title, and the keys of the per-GPU dicts --json wrote before ROCm 6.1.1
_TABLES = {"LINK TYPE": "type", "WEIGHT": "weight", "HOPS": "hops", "NUMA BW": "bw"}
_TYPES = ("SELF", "XGMI", "PCIE", "UNKNOWN", "N/A")
_EXPECTED = {"type": " or ".join(_TYPES), "weight": "a whole number or N/A",
             "hops": "a whole number or N/A", "bw": "MIN-MAX (MB/s) or N/A"}
ACROSS_CPUS = 3   # hops between GPUs under different CPUs (2: one CPU's PCIe; 1: xGMI)


def looks_like_amd_smi(text: str) -> bool:
    """Whether ``text`` holds amd-smi's link type table or its ``--json`` topology."""
    return "LINK TYPE TABLE:" in text or (text.lstrip().startswith("[")
                                           and '"link_type"' in text)


def from_amd_smi(source, xgmi_bw: float = DEFAULT_XGMI_GBPS, pcie_bw: float = 15.75,
                 smp_bw: float = 10.0) -> nx.DiGraph:
    """Build a topology from ``amd-smi topology`` output, text or ``--json`` (or a file path).

    Parameters
    ----------
    source : str or os.PathLike
        The output, or a path to a file holding it.
    xgmi_bw : float
        GB/s per direction of one xGMI link where the NUMA BW table gives no pair a bandwidth.
    pcie_bw, smp_bw : float
        Line rates of the PCIe links and of CPU-CPU links, which the tables do not show.

    Raises
    ------
    TopologyError
        No link type table, a table whose rows do not match its header, or an unknown cell
        (the message gives the line).

    See Also
    --------
    from_rocm_smi, from_nccl_xml, collectx.topology.load
    """
    text = read_source(source, "amd-smi topology", one_line_file)
    busids, tables = _from_json(text) if text.lstrip().startswith("[") else _parse(text)
    if "type" not in tables:
        raise TopologyError("amd-smi topology: no 'LINK TYPE TABLE:'; expected the output of "
                            "'amd-smi topology' (text or --json)")
    gpus = list(range(len(busids)))
    G = new_graph("amd_smi", "imported from amd-smi topology")
    for g, busid in zip(gpus, busids):
        add_node(G, f"GPU{g}", "gpu", **({"busid": normalize_busid(busid)} if busid else {}))
    for (a, b), bw in _xgmi_links(gpus, tables, xgmi_bw).items():
        add_link(G, f"GPU{a}", f"GPU{b}", "xgmi", bw)
    hang_off_cpus(G, {f"GPU{g}": cpu for g, cpu in zip(gpus, _cpus(gpus, tables))}, pcie_bw,
                  smp_bw, numa_known=False)
    return G


def _xgmi_links(gpus: list, tables: dict, xgmi_bw: float) -> dict:
    """``{(a, b): GB/s}`` of the pairs joined directly by xGMI (module docstring)."""
    types, bw = tables["type"], tables.get("bw", {})
    reported = {(a, b): max(bw.get((a, b)) or 0, bw.get((b, a)) or 0)
                for i, a in enumerate(gpus) for b in gpus[i + 1:]
                if "XGMI" in (types[a, b], types[b, a])}
    if any(reported.values()):
        return {pair: rate for pair, rate in reported.items() if rate}
    return {pair: xgmi_bw for pair in xgmi_pairs(gpus, types, tables.get("weight", {}))}


def _cpus(gpus: list, tables: dict) -> list:
    """Per GPU, the index of the CPU it hangs off (module docstring): GPUs two hops apart over
    PCIe share one, and so do GPUs joined by xGMI (the table cannot tell them apart); one CPU
    for all unless some PCIe pair is three hops apart, and each such pair apart."""
    types, hops = tables["type"], tables.get("hops", {})
    across = [(a, b) for a in gpus for b in gpus if a < b and types[a, b] == "PCIE"
              and hops.get((a, b)) == ACROSS_CPUS]
    cpu = list(gpus)

    def top(g):
        while cpu[g] != g:
            g = cpu[g]
        return g
    for a in gpus:
        for b in gpus[:a]:
            if "XGMI" in (types[a, b], types[b, a]) or (
                    types[a, b] == "PCIE" and hops.get((a, b)) == ACROSS_CPUS - 1):
                cpu[top(a)] = top(b)
    groups = [top(g) for g in gpus]
    if not across or any(groups[a] == groups[b] for a, b in across):
        return [0] * len(gpus)   # nothing apart, or hops that contradict each other
    first = {c: k for k, c in enumerate(dict.fromkeys(groups))}
    return [first[c] for c in groups]


def _parse(text: str) -> tuple[list, dict]:
    """``(bus ids in header order, {"type"|"weight"|"hops"|"bw": {(a, b): reading}})`` of the
    text tables; GPUs are numbered by their column in the first table read."""
    busids, tables, name, header = None, {}, None, None
    for number, line in enumerate(text.splitlines(), start=1):
        toks = line.split()
        if (title := _TITLE.match(line.strip())):
            name, header = _TABLES.get(title.group(1)), None
            continue
        if name is None or not toks or not _BUSID.match(toks[0]):
            continue   # a legend, a blank line, another command's output
        if header is None:
            header = _header(toks, busids, number)
            busids = busids or header
            tables.setdefault(name, {})
            continue
        _add_row(tables[name], name, header, toks, number)
    for name, cells in tables.items():
        missing = [busids[g] for g in range(len(busids)) if (g, g) not in cells]
        if missing:
            title = next(t for t, n in _TABLES.items() if n == name)
            raise TopologyError(f"amd-smi topology: the {title} table has no row for "
                                f"{', '.join(missing)}; expected one row per column")
    return busids or [], tables


def _header(toks: list, busids: list | None, number: int) -> list:
    if not all(_BUSID.match(t) for t in toks):
        raise TopologyError(f"amd-smi topology line {number}: a row before the table's header "
                            f"of bus ids")
    if busids is not None and toks != busids:
        raise TopologyError(f"amd-smi topology line {number}: the header names "
                            f"{' '.join(toks)}; expected the GPUs of the first table, "
                            f"{' '.join(busids)}")
    if len(set(toks)) != len(toks):
        raise TopologyError(f"amd-smi topology line {number}: a bus id twice in the header")
    return toks


def _add_row(cells: dict, name: str, header: list, toks: list, number: int) -> None:
    if toks[0] not in header:
        raise TopologyError(f"amd-smi topology line {number}: row {toks[0]} is not a GPU of "
                            f"the header")
    g = header.index(toks[0])
    if (g, g) in cells:
        raise TopologyError(f"amd-smi topology line {number}: second row for {toks[0]}")
    if len(toks) - 1 != len(header):
        raise TopologyError(f"amd-smi topology line {number}: row {toks[0]} has "
                            f"{len(toks) - 1} cells; expected {len(header)}, one per GPU of "
                            f"the header")
    for other, cell in enumerate(toks[1:]):
        cells[g, other] = _reading(name, cell, f"line {number}: cell {toks[0]}/{header[other]}")


def _reading(name: str, cell, where: str):
    """A cell's reading: a link type, a weight or hop count (None: N/A) or a bandwidth in GB/s
    (None: none given, N/A or 0-0)."""
    cell = str(cell)
    if cell.upper() == "N/A":
        return cell.upper() if name == "type" else None
    if name == "type" and cell.upper() in _TYPES:
        return cell.upper()
    if name in ("weight", "hops") and cell.isdecimal():
        return int(cell)
    if name == "bw" and (m := _BANDWIDTH.match(cell)):
        return int(m.group(2)) / 1000 or None
    raise TopologyError(f"amd-smi topology {where} is {cell!r}; expected {_EXPECTED[name]}")


# --json: per GPU, a list of links (ROCm 6.1.1 on), or one dict per table keyed gpu_N (before)
_LINK_KEYS = {"link_type": "type", "weight": "weight", "num_hops": "hops", "bandwidth": "bw"}
_DICT_KEYS = {"link_type": "type", "weight": "weight", "hops": "hops", "numa_bandwidth": "bw"}


def _from_json(text: str) -> tuple[list, dict]:
    """:func:`_parse`'s reading of ``amd-smi topology --json``: a list of GPUs, each with its
    ``gpu`` number and either ``links`` (per GPU: ``gpu``, ``link_type``, ``weight``,
    ``num_hops``, ``bandwidth``) or one dict per table keyed ``gpu_N``; bus ids where given."""
    try:
        data = json.loads(text)
        at = {int(gpu["gpu"]): i for i, gpu in enumerate(data)}
        tables = {name: {} for name in _LINK_KEYS.values()}
        for a, gpu in enumerate(data):
            where = f"--json: GPU {gpu['gpu']}'s {{}} of GPU {{}}"
            for b, key, value in _json_cells(gpu):
                name = _LINK_KEYS.get(key) or _DICT_KEYS[key]
                tables[name][a, at[b]] = _reading(name, value, where.format(key, b))
        busids = [str(gpu.get("bdf", "")) for gpu in data]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        if isinstance(exc, TopologyError):
            raise
        raise TopologyError(f"amd-smi topology --json: {exc!r}; expected a list of GPUs, "
                            f"each with 'gpu' and 'links' (each with 'gpu' and 'link_type') "
                            f"or a 'link_type' dict keyed 'gpu_N'") from None
    for a in range(len(data)):
        for b in range(len(data)):
            tables["type"].setdefault((a, b), "SELF" if a == b else "N/A")
    return busids, tables


def _json_cells(gpu: dict):
    """``(other GPU's number, key, value)`` of one GPU of ``--json``, either shape."""
    if "links" in gpu:
        for link in gpu["links"]:
            for key in _LINK_KEYS:
                if key in link:
                    yield int(link["gpu"]), key, link[key]
        return
    if "link_type" not in gpu:
        raise KeyError("links")
    for key in _DICT_KEYS:
        for other, value in gpu.get(key, {}).items():
            yield int(other.removeprefix("gpu_")), key, value
