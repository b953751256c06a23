"""Import the tables printed by ``amd-smi topology`` (ROCm 6 and later), text or ``--json``.

How it works: amd-smi, rocm-smi's successor, prints per pair of GPUs (named by PCI bus id, in
the order it numbers them) a weight, a hop count, a link type and the link's bandwidth, each in
a table of its own (``WEIGHT TABLE:``, ``LINK TYPE TABLE:``, ``NUMA BW TABLE:``, ...). From
them, as for ``rocm-smi`` (:func:`~.rocmsmi.from_rocm_smi`):

* xGMI: two GPUs whose link type is ``XGMI`` and whose weight is the least of the xGMI pairs
  are joined by one ``xgmi`` link. Its rate is the NUMA BW table's maximum for the pair
  (``min-max`` in MB/s, as the driver reports the link), or ``xgmi_bw`` where the table gives
  none (``N/A``, ``0-0``: some boards report no bandwidth). Hop counts are not read (1 for
  any pair reachable over xGMI).
* PCIe: the tables name no NUMA nodes, so every GPU hangs off one ``CPU0`` by a ``pcie_bw``
  link. They show no PCIe switches and no NICs; RCCL's topology XML does.

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
... 0000:0c:00.0 N/A          64000-64000  N/A
... 0000:22:00.0 64000-64000  N/A          0-0
... 0000:38:00.0 N/A          0-0          N/A
... ''')
>>> [(a, b, bw) for a, b, bw in sorted(G.edges(data="bw_gbps")) if a < b and a != "CPU0"]
[('GPU0', 'GPU1', 64.0), ('GPU1', 'GPU2', 50.0)]
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
# the tables read, by title; each cell's reading, None where the table gives nothing
_TABLES = {"LINK TYPE": "type", "WEIGHT": "weight", "NUMA BW": "bw"}
_TYPES = ("SELF", "XGMI", "PCIE", "UNKNOWN", "N/A")
_EXPECTED = {"type": " or ".join(_TYPES), "weight": "a whole number or N/A",
             "bw": "MIN-MAX (MB/s) or N/A"}


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
        GB/s per direction of one xGMI link where the NUMA BW table gives none.
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
        add_node(G, f"GPU{g}", "gpu", busid=normalize_busid(busid))
    bw = tables.get("bw", {})
    for a, b in xgmi_pairs(gpus, tables["type"], tables.get("weight", {})):
        add_link(G, f"GPU{a}", f"GPU{b}", "xgmi", bw.get((a, b)) or bw.get((b, a)) or xgmi_bw)
    hang_off_cpus(G, {f"GPU{g}": None for g in gpus}, pcie_bw, smp_bw)
    return G


def _parse(text: str) -> tuple[list, dict]:
    """``(bus ids in header order, {"type"|"weight"|"bw": {(a, b): reading}})`` of the text
    tables; GPUs are numbered by their column in the first table read."""
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
        cells[g, other] = _reading(name, str(cell), f"line {number}: cell "
                                                    f"{toks[0]}/{header[other]}")


def _reading(name: str, cell: str, where: str):
    """A cell's reading: a link type, a weight (None: N/A) or a bandwidth in GB/s (None: none
    given, N/A or 0-0)."""
    if cell.upper() == "N/A":
        return cell.upper() if name == "type" else None
    if name == "type" and cell.upper() in _TYPES:
        return cell.upper()
    if name == "weight" and cell.isdigit():
        return int(cell)
    if name == "bw" and (m := _BANDWIDTH.match(cell)):
        return int(m.group(2)) / 1000 or None
    raise TopologyError(f"amd-smi topology {where} is {cell!r}; expected {_EXPECTED[name]}")


def _from_json(text: str) -> tuple[list, dict]:
    """:func:`_parse`'s reading of ``amd-smi topology --json``: a list of GPUs, each with
    ``bdf`` and ``links`` (per GPU: ``bdf``, ``link_type``, ``weight``, ``bandwidth``)."""
    try:
        data = json.loads(text)
        busids = [str(gpu["bdf"]) for gpu in data]
        at = {b: i for i, b in enumerate(busids)}
        tables = {"type": {}, "weight": {}, "bw": {}}
        for a, gpu in enumerate(data):
            tables["type"][a, a] = "SELF"
            for link in gpu["links"]:
                b = at[str(link["bdf"])]
                where = f"--json: link {busids[a]} to {busids[b]}: {{}}"
                for key, name in (("link_type", "type"), ("weight", "weight"),
                                  ("bandwidth", "bw")):
                    if key in link:
                        tables[name][a, b] = _reading(name, str(link[key]),
                                                      where.format(key))
    except (ValueError, TypeError, KeyError) as exc:
        raise TopologyError(f"amd-smi topology --json: {exc!r}; expected a list of GPUs, "
                            f"each with 'bdf' and 'links' (each with 'bdf' and "
                            f"'link_type')") from None
    for a in range(len(busids)):
        for b in range(len(busids)):
            tables["type"].setdefault((a, b), "N/A")
    return busids, tables
