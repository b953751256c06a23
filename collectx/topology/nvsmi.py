"""Import the matrix printed by ``nvidia-smi topo -m``.

How it works: the header row names the devices (``GPU<i>``, NICs as ``mlx5_0`` or ``NIC0``) and
then the affinity columns (``CPU Affinity``, ``NUMA Affinity``, ``GPU NUMA ID``). Every device
row must follow (a NIC's may be missing: its column gives its cells), cells separated by tabs
or spaces (or by pipes, as a table pasted into Markdown is; its corner cell above the row names
is dropped), lines quoted in a reply (``> ``) or a source comment (`` * ``, ``// ``, and
``# `` where no line without it holds the matrix) read without the quote. From the cells:

* ``NV#`` between two GPUs: a bundle of # NVLinks (``nvlink_bw`` GB/s each, default 25), unless
  GPUs all NVLinked to each other have rows adding up to more NVLinks than any GPU has (18):
  they reach each other through NVSwitches, read as one ``NVS0`` that each GPU joins with its
  # links (NV12 on HGX A100, NV18 on HGX H100);
* NUMA nodes: devices related by PIX/PXB/PHB/NODE, or with the same NUMA (else CPU) affinity,
  share a ``CPU<k>`` node (without affinity columns, as few as the SYS cells allow);
  CPUs are joined pairwise by ``smp`` links;
* PCIe switches: devices related by PIX share a ``pci_switch``; groups related by PXB hang
  below one more switch; everything else (PHB, NODE) attaches to its CPU.

The matrix cannot show the PCIe placement of two NVLinked GPUs (nvidia-smi prints ``NV#``
instead), so such GPUs end up on their CPU unless a NIC ties them to a switch. PCIe links get
``pcie_bw`` (default Gen3 x16 = 15.75 GB/s), CPU-CPU links ``smp_bw`` (default 10 GB/s, NCCL's
Skylake UPI figure): the matrix carries no speeds. ``NIC Legend`` lines (``NIC0: mlx5_0``)
name NIC columns; the ``Legend`` block and anything after it is ignored, so of a text holding
several matrices (a log of several hosts) the first is read, with its own NIC legend.

>>> G = from_nvidia_smi('''
...         GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity
... GPU0     X      NV4     PIX     0-15    0
... GPU1    NV4      X      PIX     0-15    0
... NIC0    PIX     PIX      X
...
... NIC Legend:
...   NIC0: mlx5_0
... ''')
>>> G.edges["GPU0", "GPU1"]["count"], sorted(G.successors("PSW0")), G.nodes["NIC0"]["name"]
(4, ['CPU0', 'GPU0', 'GPU1', 'NIC0'], 'mlx5_0')
"""

from __future__ import annotations

import re
from pathlib import Path

import networkx as nx

from ..errors import TopologyError
from .model import add_link, add_node, new_graph, read_source

_MULTIWORD = (("CPU Affinity", "CPU_Affinity"), ("NUMA Affinity", "NUMA_Affinity"),
              ("GPU NUMA ID", "GPU_NUMA_ID"))
_EXTRA_COLUMNS = {"CPU_Affinity", "NUMA_Affinity", "GPU_NUMA_ID"}
_GPU = re.compile(r"^GPU\d+$")
_CELL = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")
_NAME = re.compile(r"(?:GPU|NIC)\d+|mlx5_\d+")
_HEADING = re.compile(f"{_NAME.pattern}|CPU_Affinity|NUMA_Affinity|GPU_NUMA_ID")
_GLUED_CELLS = re.compile(f"(?:{_CELL.pattern})+")
_GLUED_HEADINGS = re.compile(f"(?:{_HEADING.pattern})+")
_CELL_THEN_AFFINITY = re.compile(r"(X|PIX|PXB|PHB|NODE|SYS|SOC)(\d[\d,-]*)")
# nvidia-smi underlines its header on a terminal; text copied from logs keeps the codes, or
# (pasted where the escape byte is dropped) their visible remnants "[4m" ... "[0m"
_ANSI = re.compile(r"\x1b?\[[0-9;]*m")
# a matrix quoted in a reply ("> "), or kept in a source comment (" * ", "// "): no line of the
# output starts so, and every line of the quote does ("#" lines stay comments)
_QUOTED = re.compile(r"^\s*(?:(?:>|\*|//)[ \t]?)+")
_HASHED = re.compile(r"^[ \t]*#+[ \t]?", re.MULTILINE)
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_NIC_ROW = re.compile(r"NIC\d+|mlx5_\w+")
# No GPU has more NVLink ports than this (H100, B200: 18); a row adding up to more is switched.
MAX_NVLINKS_PER_GPU = 18


def one_line_file(text: str) -> bool:
    """Whether a string given as a table's source names a file: one line, and a file there."""
    return "\n" not in text and "\t" not in text and Path(text).is_file()


def _tokens(line: str) -> list[str]:
    line = _QUOTED.sub("", _ANSI.sub("", line)).replace("|", " ")   # pipes: Markdown's cells
    for words, joined in _MULTIWORD:
        line = line.replace(words, joined)
    return [part for tok in line.split() for part in _unglued(tok)]


def _unglued(tok: str) -> list[str]:
    """``tok`` as the cells or column headings it runs together: nvidia-smi prints fixed-width
    columns, and past a few dozen NICs a wide one overflows into its neighbour with no space
    between (``NIC7NIC8``, ``NODENODE``, ``NIC8CPU Affinity``, a last cell into the CPU
    affinity: ``SYS0-35,72-107``); a header copied where its tabs were lost runs every name
    together (``GPU0GPU1GPU2mlx5_0``). Anything else stays whole (``NV180-47`` could be NV1
    or NV18)."""
    for whole, part in ((_GLUED_CELLS, _CELL), (_GLUED_HEADINGS, _HEADING)):
        if whole.fullmatch(tok):
            return part.findall(tok)
    if (glued := _CELL_THEN_AFFINITY.fullmatch(tok)):
        return list(glued.groups())
    return [tok]


def _parse_matrix(text: str):
    """(devices, extra column names, {device: (line number, relations, extras)}, nic names)."""
    found = _matrix(text)
    if found is None and "#" in text:   # a matrix kept as shell comments (in a script, say)
        found = _matrix(_HASHED.sub("", text))
    if found is None:
        raise TopologyError("nvidia-smi topology: no header row naming GPU0, GPU1, ...; expected "
                            "the output of 'nvidia-smi topo -m'")
    return found


def _matrix(text: str):
    """:func:`_parse_matrix` of ``text`` as it is, ``#`` lines being comments; None without a
    header row."""
    header_at, devices, extras, in_legend, skip = None, [], [], False, 0
    rows: dict[str, tuple[int, list[str], list[str]]] = {}
    unlisted: dict[str, tuple[int, list[str], list[str]]] = {}   # NIC rows past the header's
    nic_names = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if (legend := _NIC_LEGEND.match(line)):   # the first matrix's legend names its NICs
            nic_names.setdefault(legend.group(1), legend.group(2))   # (a log of two hosts)
            continue
        toks = _tokens(line)
        if not toks or toks[0].startswith("#"):
            continue
        if header_at is None:
            if "|" in line and len(toks) > 1 and not _GPU.match(toks[0]) and _GPU.match(toks[1]):
                toks = toks[1:]   # a Markdown table's corner cell (``| GPU | GPU0 | ...``)
            skip = _heading_at(toks)
            if skip is not None and "X" not in toks:
                header_at, toks = number, toks[skip:]
                split = next((i for i, t in enumerate(toks) if t in _EXTRA_COLUMNS), len(toks))
                devices, extras = toks[:split], toks[split:]
            continue
        in_legend = in_legend or toks[0].rstrip(":") == "Legend"
        if in_legend:
            continue
        if skip and toks[0] not in devices and len(toks) > skip and toks[skip] in devices:
            toks = toks[skip:]   # the header's prefix (a log line's, say) on this row too
        if toks[0] in devices:
            _add_row(rows, devices, number, toks)
        elif _NIC_ROW.fullmatch(toks[0]):
            _add_row(unlisted, devices, number, toks)
        elif _GPU.match(toks[0]):
            raise TopologyError(f"nvidia-smi topology line {number}: row {toks[0]} names a GPU "
                                f"the header at line {header_at} does not list; expected one "
                                f"column per row")
    if header_at is None:
        return None
    missing = [d for d in devices if d not in rows]
    if missing and not any(_GPU.match(d) for d in missing):
        _mirror_rows(devices, rows, missing)
    elif missing:
        raise TopologyError(f"nvidia-smi topology: the header at line {header_at} lists "
                            f"{', '.join(devices)} but the row for {', '.join(missing)} is "
                            f"missing; expected one row per column")
    return devices + _mirrored(devices, rows, unlisted), extras, rows, nic_names


def _mirrored(devices: list[str], rows: dict, unlisted: dict) -> list[str]:
    """The NICs of ``unlisted`` rows, added to ``rows`` as columns: a matrix pasted from a
    narrow terminal loses its right-hand columns (the NICs') but keeps the NICs' rows, and
    those still relate each NIC to every device of the header. The matrix is symmetric, so each
    header row takes the NIC's cell for it; NICs among themselves are unknown (``?``: neither
    joined nor apart)."""
    nics = list(unlisted)
    for j, dev in enumerate(devices):
        number, cells, values = rows[dev]
        rows[dev] = (number, cells + [unlisted[nic][1][j] for nic in nics], values)
    for nic in nics:
        number, cells, values = unlisted[nic]
        rows[nic] = (number, cells + ["X" if other == nic else "?" for other in nics], values)
    return nics


def _heading_at(toks: list[str]) -> int | None:
    """Where the header's device names start in ``toks``: at its first token, or past a prefix
    (a label, ``GPU topology:``; a log line's level and time) where the names that follow are
    all column headings, affinity columns among them; else None (not a header)."""
    if _GPU.match(toks[0]):
        return 0
    at = next((i for i, t in enumerate(toks) if _GPU.match(t)), None)
    if at is None or not all(_HEADING.fullmatch(t) or _NIC_ROW.fullmatch(t) for t in toks[at:]):
        return None
    return at if any(t in _EXTRA_COLUMNS for t in toks[at:]) else None


def _mirror_rows(devices: list[str], rows: dict, nics: list[str]) -> None:
    """Rows for ``nics``, header columns without rows of their own (a paste that kept the GPU
    rows only): the matrix is symmetric, so each takes its column's cells from the other rows;
    among those NICs the relation is unknown (``?``)."""
    for nic in nics:
        j = devices.index(nic)
        cells = ["X" if d == nic else "?" if d in nics else rows[d][1][j] for d in devices]
        rows[nic] = (rows[devices[0]][0], cells, [])


def _add_row(rows: dict, devices: list[str], number: int, toks: list[str]) -> None:
    name, cells = toks[0], toks[1:1 + len(devices)]
    if name in rows:
        raise TopologyError(f"nvidia-smi topology line {number}: second row for {name}")
    if len(cells) < len(devices):
        raise TopologyError(f"nvidia-smi topology line {number}: row {name} has {len(cells)} "
                            f"cells; expected {len(devices)} (one per device column)")
    for column, cell in zip(devices, cells):
        if not _CELL.fullmatch(cell):
            raise TopologyError(f"nvidia-smi topology line {number}: cell {name}/{column} is "
                                f"{cell!r}; expected X, NV#, PIX, PXB, PHB, NODE or SYS")
        if (cell == "X") != (column == name):
            raise TopologyError(f"nvidia-smi topology line {number}: cell {name}/{column} is "
                                f"{cell!r}; expected X where a row meets its own column, and "
                                f"only there")
    rows[name] = (number, cells, toks[1 + len(devices):])


class _UnionFind:
    def __init__(self, items):
        self.parent = {x: x for x in items}

    def find(self, x):
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)

    def groups(self, order):
        out: dict = {}
        for x in order:
            out.setdefault(self.find(x), []).append(x)
        return list(out.values())


def from_nvidia_smi(source, nvlink_bw: float = 25.0, pcie_bw: float = 15.75,
                    smp_bw: float = 10.0) -> nx.DiGraph:
    """Build a topology from ``nvidia-smi topo -m`` output (text or a file path).

    Parameters
    ----------
    source : str or os.PathLike
        The matrix text, or a path to a file holding it.
    nvlink_bw, pcie_bw, smp_bw : float
        Line rates (GB/s per direction) to give NVLinks (per link), PCIe links and CPU-CPU
        links, which the matrix does not show.

    Raises
    ------
    TopologyError
        No header, a missing or short row, or an unknown cell (the message gives the line).

    See Also
    --------
    from_nccl_xml, collectx.topology.load
    """
    text = read_source(source, "nvidia-smi topology", one_line_file)
    devices, extras, rows, nic_names = _parse_matrix(text)
    ids = _device_ids(devices)
    G = new_graph("nvidia_smi", "imported from nvidia-smi topo -m")
    for dev in devices:
        attrs = _device_attrs(dev, extras, rows[dev][2], nic_names)
        add_node(G, ids[dev], "gpu" if _GPU.match(dev) else "nic", **attrs)
    rel = {(a, b): rows[a][1][j] for a in devices for j, b in enumerate(devices)}
    _add_nvlinks(G, devices, ids, rel, nvlink_bw)
    _add_pcie_tree(G, devices, ids, rel, rows, extras, pcie_bw)
    cpus = [n for n, k in G.nodes(data="kind") if k == "cpu"]
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            add_link(G, a, b, "smp", smp_bw)
    return G


def _device_ids(devices: list[str]) -> dict[str, str]:
    nics = [d for d in devices if not _GPU.match(d)]
    return {d: d if _GPU.match(d) else f"NIC{nics.index(d)}" for d in devices}


def _device_attrs(dev: str, extras: list[str], values: list[str], nic_names: dict) -> dict:
    attrs = {}
    if not _GPU.match(dev):
        attrs["name"] = nic_names.get(dev, dev)
    for column, value in zip(extras, values):
        if value == "N/A":
            continue
        if column == "CPU_Affinity":
            attrs["cpu_affinity"] = value
        elif value.lstrip("-").isdecimal():
            attrs["numa" if column == "NUMA_Affinity" else "gpu_numa_id"] = int(value)
    return attrs


def _add_nvlinks(G, devices, ids, rel, nvlink_bw) -> None:
    gpus = [d for d in devices if _GPU.match(d)]
    pair = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            counts = [int(c[2:]) for c in (rel[a, b], rel[b, a]) if c.startswith("NV")]
            if counts:
                pair[a, b] = pair[b, a] = max(counts)
    # Through NVSwitches every peer shows the GPU's whole link count (NV12 on HGX A100, NV18
    # on H100): GPUs all NVLinked to each other with more links in a row than a GPU has ports
    # share a switch fabric.
    switched = [g for g in gpus
                if sum(n for (a, _), n in pair.items() if a == g) > MAX_NVLINKS_PER_GPU]
    if any((a, b) not in pair for a in switched for b in switched if a != b):
        switched = []
    if switched:
        add_node(G, "NVS0", "nvswitch")
        for g in switched:
            links = max(n for (a, _), n in pair.items() if a == g)
            add_link(G, ids[g], "NVS0", "nvlink", links * nvlink_bw, links)
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            if (a, b) in pair and not (a in switched and b in switched):
                add_link(G, ids[a], ids[b], "nvlink", pair[a, b] * nvlink_bw, pair[a, b])


def _add_pcie_tree(G, devices, ids, rel, rows, extras, pcie_bw) -> None:
    numa, pxb, pix = (_UnionFind(devices) for _ in range(3))
    for (a, b), cell in rel.items():
        if cell in ("PIX", "PXB", "PHB", "NODE"):
            numa.union(a, b)
        if cell in ("PIX", "PXB"):
            pxb.union(a, b)
        if cell == "PIX":
            pix.union(a, b)
    if not _join_by_affinity(numa, devices, rows, extras):
        _join_fewest(numa, devices, rel)
    switches = 0
    for group in numa.groups(devices):
        cpu = _cpu_for(G, group, ids)
        for cluster in pxb.groups(group):
            pix_groups = pix.groups(cluster)
            top = cpu
            if len(pix_groups) > 1:
                top, switches = f"PSW{switches}", switches + 1
                add_node(G, top, "pci_switch")
                add_link(G, top, cpu, "pcie", pcie_bw)
            for members in pix_groups:
                parent = top
                # Devices PXB apart cross several bridges: each side gets its own leaf switch.
                if len(members) > 1 or top != cpu:
                    parent, switches = f"PSW{switches}", switches + 1
                    add_node(G, parent, "pci_switch")
                    add_link(G, parent, top, "pcie", pcie_bw)
                for dev in members:
                    add_link(G, ids[dev], parent, "pcie", pcie_bw)


def _join_by_affinity(numa: _UnionFind, devices, rows, extras) -> bool:
    """Join devices of one NUMA (else CPU) affinity; False where the matrix has neither column."""
    column = "NUMA_Affinity" if "NUMA_Affinity" in extras else "CPU_Affinity"
    if column not in extras:
        return False
    seen: dict[str, str] = {}
    for dev in devices:
        values = rows[dev][2]
        k = extras.index(column)
        if k < len(values) and values[k] != "N/A":
            numa.union(dev, seen.setdefault(values[k], dev))
    return True


def _join_fewest(numa: _UnionFind, devices, rel) -> None:
    """Without affinity columns, NVLinked GPUs show no PCIe relation, and alone each would get
    a CPU of its own. Only SYS says two devices sit on different NUMA nodes, so join the
    groups into as few nodes as that allows (first fit, in device order): a server has a
    socket or two, not one per GPU."""
    apart = {pair for pair, cell in rel.items() if cell in ("SYS", "SOC")}
    nodes: list[list] = []
    for group in numa.groups(devices):
        fit = next((n for n in nodes
                    if not any((a, b) in apart for a in group for b in n)), None)
        if fit is None:
            nodes.append(list(group))
        else:
            numa.union(group[0], fit[0])
            fit.extend(group)


def _cpu_for(G, group, ids) -> str:
    numas = {G.nodes[ids[d]].get("numa") for d in group} - {None}
    wanted = numas.pop() if len(numas) == 1 else None
    cid = f"CPU{wanted}" if wanted is not None and wanted >= 0 else None
    if cid is None or cid in G:
        k = 0
        while f"CPU{k}" in G:
            k += 1
        cid = f"CPU{k}"
    add_node(G, cid, "cpu", **({"numa": wanted} if wanted is not None else {}))
    return cid
