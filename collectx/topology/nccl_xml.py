"""Import NCCL / RCCL topology XML (``NCCL_TOPO_DUMP_FILE``, ``NCCL_TOPO_FILE``).

How it works: the ``<system>`` tree is walked once. Each ``<cpu>`` becomes a ``CPU<numaid>``
node; each ``<pci>`` bridge (class 0x0604xx, or any ``<pci>`` holding further ``<pci>``) becomes a
``pci_switch``; a ``<pci>`` holding ``<gpu>`` becomes ``GPU<dev>`` and one holding ``<nic>`` one
``NIC<dev>`` per ``<net>``, each linked to its parent by PCIe at the line rate of its
``link_speed`` x ``link_width``. NVLinks (``<nvlink>``) and RCCL's xGMI links (``<xgmi>``,
``<system version="2">``) are resolved at the end, once every GPU's bus id is known: a target that
is another GPU gives a GPU-GPU link, one with tclass 0x068000 (or an unknown bus id without a
tclass) an NVSwitch ``NVS<k>`` (numbered in bus-id order), one with tclass 0x068001 the GPU's
CPU; a GPU-class target missing from the file (a partial dump), or the GPU's own bus id (a
hand-edited ``NCCL_TOPO_FILE``), is skipped. xGMI line rates follow ``gcn`` (``gfx942`` or
RCCL's older bare numbers such as ``910``).

Tolerated quirks: ``link_width="0"`` or missing (VMs) counts as x16 and a missing speed as Gen3,
as NCCL does; a virtual bridge reporting a narrower link than its children (VMs show 2.5 GT/s x1)
gets the width of its widest child; a missing ``dev`` numbers devices in file order; NCCL's
hidden-NVSwitch sentinel ``fffffff:ff:ff.0`` becomes one NVSwitch. CPU-CPU links get NCCL's
inter-socket figures by vendor and model (topo.h: BDW/SKL/SRP/ERP QPI, AMD, ARM, POWER9).

>>> G = from_nccl_xml('''<system version="1"><cpu numaid="0" vendor="GenuineIntel" modelid="85">
...   <pci busid="0000:17:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
...     <gpu dev="0" sm="70"><nvlink target="0000:18:00.0" count="2" tclass="0x030200"/></gpu></pci>
...   <pci busid="0000:18:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
...     <gpu dev="1" sm="70"><nvlink target="0000:17:00.0" count="2" tclass="0x030200"/></gpu></pci>
... </cpu></system>''')
>>> G.edges["GPU0", "GPU1"]["bw_gbps"], G.edges["GPU1", "CPU0"]["bw_gbps"]
(50.0, 15.75)
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import networkx as nx

from ..errors import TopologyError
from .model import add_link, add_node, new_graph, read_source
from .pcie import copy_bw_for_sm, nvlink_bw_for_sm, normalize_busid, pcie_bw, xgmi_bw_for_arch

NVSWITCH_CLASS = "0x068000"
CPU_CLASS = "0x068001"
_BRIDGE_PREFIX = "0x0604"
DEFAULT_NET_GBPS = 1.25  # NCCL reads a missing or non-positive speed as 10,000 Mb/s (topo.cc)


def _smp_bw(cpu: ET.Element) -> float:
    """Inter-socket bandwidth as NCCL sets it (topo.h *_QPI_BW, AMD_BW, ARM_BW, P9_BW)."""
    vendor, arch = cpu.get("vendor", ""), cpu.get("arch", "")
    if arch == "ppc64":
        return 32.0
    if arch == "arm64":
        return 6.0
    if "AMD" in vendor:
        return 16.0
    try:
        model = int(cpu.get("modelid", "0"), 0)
    except ValueError:
        model = 0
    return 40.0 if model >= 0xCF else 22.0 if model >= 0x8F else 10.0 if model >= 0x55 else 6.0


def _c2c_gbps(gid: str, link: ET.Element) -> float:
    """GB/s per direction of a ``<c2c bw= count=>`` link, as NCCL reads it: ``bw`` is NVML's
    MB/s per link."""
    try:
        bw, count = float(link.get("bw", "")), int(link.get("count", "1"))
    except ValueError:
        bw, count = 0.0, 0
    if not 0 < bw < float("inf") or count < 1:
        raise TopologyError(f"<c2c bw={link.get('bw')!r} count={link.get('count')!r}> of {gid}; "
                            f"expected a positive bw in MB/s per link and a positive integer count")
    return bw * count / 1000.0


def _net_gbps(speed) -> float:
    """NIC line rate from NCCL's ``speed`` (Mb/s); unknown or <= 0 gives the default."""
    try:
        mbps = float(speed)
    except (TypeError, ValueError):
        return DEFAULT_NET_GBPS
    return mbps / 8000 if mbps > 0 else DEFAULT_NET_GBPS


def _check_complete(root: ET.Element) -> None:
    """A GPU's ``<pci>`` (class 0x03xxxx) without its ``<gpu>`` is a hand-written
    ``NCCL_TOPO_FILE`` (a cloud VM's published one, say): NCCL completes it from the running
    machine (NVLinks, SM, rank), so the file alone has no GPU-GPU links, and reading its GPUs as
    PCIe-only ones would draw a different machine. Only a file without any ``<gpu>`` is refused:
    in a dump, a display-class device beside the GPUs (a BMC's VGA) carries no traffic. Some
    such files give their devices no class at all (bus ids only, for NCCL to match), and are
    refused alike: NCCL writes a class for every device it dumps."""
    if next(root.iter("gpu"), None) is not None:
        return
    bare = [el.get("busid") for el in root.iter("pci")
            if (el.get("class") or "").lower().startswith("0x03")]
    unnamed = [el.get("busid") for cpu in root.iter("cpu") for el in cpu.iter("pci")
               if not el.get("class") and el.find("pci") is None]   # devices, not bridges
    if bare or unnamed:
        seen = bare or unnamed
        what = "GPU PCI device(s) without a <gpu> element" if bare else \
            "PCI device(s) without a class and no <gpu> element in the file"
        raise TopologyError(
            f"{len(seen)} {what} (bus ids {', '.join(map(str, seen[:4]))}"
            f"{', ...' if len(seen) > 4 else ''}): this is a partial NCCL_TOPO_FILE, which NCCL "
            f"completes from the running machine (NVLinks, SM); expected a full dump: run one "
            f"NCCL job there with NCCL_TOPO_DUMP_FILE=topo.xml and load that file")


def _parse(text: str) -> ET.Element:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        line, col = exc.position
        raise TopologyError(f"NCCL topology XML does not parse at line {line} column {col} "
                            f"({exc.msg.split(':')[0]}); is the file truncated?") from None
    if root.tag == "graphs":   # NCCL_GRAPH_DUMP_FILE: the rings and trees NCCL searched
        raise TopologyError("this is an NCCL graph file (<graphs>: the channels NCCL chose, "
                            "NCCL_GRAPH_DUMP_FILE), not a topology; expected <system>: load "
                            "the NCCL_TOPO_DUMP_FILE of the same job")
    if root.tag != "system":
        raise TopologyError(f"NCCL topology XML has root <{root.tag}>; expected <system>")
    return root


class _Builder:
    """Walks the XML tree into a graph; links to NVLink targets wait until all GPUs are known."""

    def __init__(self) -> None:
        self.G = new_graph("nccl_xml")
        self.gpu_by_busid: dict[str, str] = {}
        self.cpu_of_gpu: dict[str, str] = {}
        self.pending: list[tuple[str, str, str, str, int, float]] = []
        self.counters = {"PSW": 0, "NIC": 0, "GPU": 0, "CPU": 0}
        self.nets: set[tuple] = set()   # (host, name, dev) of every named NIC read

    def fresh(self, prefix: str, wanted=None) -> str:
        """``prefix<wanted>`` if that is a free id, else the next free number."""
        if wanted is not None and str(wanted).lstrip("-").isdecimal() and int(wanted) >= 0 \
                and f"{prefix}{int(wanted)}" not in self.G:
            return f"{prefix}{int(wanted)}"
        while f"{prefix}{self.counters[prefix]}" in self.G:
            self.counters[prefix] += 1
        return f"{prefix}{self.counters[prefix]}"

    def cpu(self, el: ET.Element) -> None:
        cid = self.fresh("CPU", el.get("numaid"))
        attrs = {k: el.get(k) for k in ("arch", "vendor") if el.get(k)}
        add_node(self.G, cid, "cpu", smp_bw=_smp_bw(el), host_hash=el.get("host_hash"), **attrs)
        self.children(el, cid, cid)

    def children(self, el: ET.Element, parent: str, cpu: str) -> None:
        for child in el:
            if child.tag == "pci":
                self.pci(child, parent, cpu)
            elif child.tag == "nic":
                self.nic(child, parent, None, cpu)
            elif child.tag == "gpu":
                self.gpu(child, parent, cpu, None, None)

    def pci(self, el: ET.Element, parent: str, cpu: str) -> None:
        busid = normalize_busid(el.get("busid"))
        bw = pcie_bw(el.get("link_speed"), el.get("link_width"))
        cls = (el.get("class") or "").lower()
        gpus = el.findall("gpu")
        if len(gpus) > 1:
            raise TopologyError(
                f"<pci busid={el.get('busid')!r}> holds {len(gpus)} <gpu> elements "
                f"(MLOPart partitions, or several ranks on one GPU); expected one rank per GPU, "
                f"which is what collectx models: dump the topology from a job with one rank per "
                f"physical GPU")
        if gpus:
            self.gpu(gpus[0], parent, cpu, busid, bw)
        elif el.find("nic") is not None:
            self.nic(el.find("nic"), parent, bw, cpu)
        elif cls.startswith(_BRIDGE_PREFIX) or el.find("pci") is not None:
            widest_child = max((pcie_bw(c.get("link_speed"), c.get("link_width"))
                                for c in el.findall("pci")), default=bw)
            sw = self.fresh("PSW")
            add_node(self.G, sw, "pci_switch", busid=busid)
            add_link(self.G, sw, parent, "pcie", max(bw, widest_child))
            self.children(el, sw, cpu)
        # Any other endpoint (NVMe, an NVSwitch's own PCI function, ...) carries no traffic.

    def gpu(self, el: ET.Element, parent: str, cpu: str, busid, bw) -> None:
        gid = self.fresh("GPU", el.get("dev", el.get("rank")))
        attrs = {k: el.get(k) for k in ("sm", "gcn") if el.get(k)}
        copy_bw = None if el.get("gcn") else copy_bw_for_sm(el.get("sm"))  # RCCL's sm: no arch
        if copy_bw:
            attrs["mem_bw_gbps"] = copy_bw
        add_node(self.G, gid, "gpu", **({"busid": busid} if busid else {}), **attrs)
        add_link(self.G, gid, parent, "pcie", bw or pcie_bw(None, None))
        self.cpu_of_gpu[gid] = cpu
        if busid:
            self.gpu_by_busid[busid] = gid
        for tag, kind in (("nvlink", "nvlink"), ("xgmi", "xgmi")):
            for link in el.findall(tag):
                self.remember_link(gid, el, link, kind)
        c2c = [_c2c_gbps(gid, link) for link in el.findall("c2c")]
        if c2c:   # NVLink-C2C to the GPU's own CPU (Grace): its copies to host memory take it
            add_link(self.G, gid, cpu, "c2c", sum(c2c))

    def remember_link(self, gid: str, gpu_el: ET.Element, link: ET.Element, kind: str) -> None:
        target = link.get("target")
        if not target:
            raise TopologyError(f"<{link.tag}> of {gid} has no 'target' attribute; expected the "
                                f"bus id of the peer GPU or NVSwitch")
        try:
            count = int(link.get("count", "1"))
            if count < 0:
                raise ValueError
        except ValueError:
            raise TopologyError(f"<{link.tag} target={target!r}> of {gid} has count="
                                f"{link.get('count')!r}; expected a whole number") from None
        per_link = (nvlink_bw_for_sm(gpu_el.get("sm")) if kind == "nvlink"
                    else xgmi_bw_for_arch(gpu_el.get("gcn")))
        self.pending.append((gid, kind, normalize_busid(target),
                             (link.get("tclass") or "").lower(), count, per_link))

    def nic(self, el: ET.Element, parent: str, bw, cpu: str) -> None:
        host = self.G.nodes[cpu].get("host_hash")
        for net in el.findall("net") or [el]:
            seen = (host, net.get("name"), net.get("dev"))
            if net.get("name") and seen in self.nets:
                continue   # a NIC without a PCI device (eth0 in a container) listed under each
                           # CPU of its host: one device, read where it first appears
            self.nets.add(seen)
            net_gbps = _net_gbps(net.get("speed"))
            nid = self.fresh("NIC", net.get("dev"))
            attrs = {"name": net.get("name")} if net.get("name") else {}
            add_node(self.G, nid, "nic", net_gbps=net_gbps, **attrs)
            add_link(self.G, nid, parent, "pcie", bw or net_gbps)

    def resolve_links(self) -> None:
        # count 0: a link written out with no lanes (as files that mimic a failed link do),
        # which NCCL reads as a link of no bandwidth: no link
        self.pending = [p for p in self.pending if p[4] > 0]
        switch_ids = sorted({t for _, kind, t, c, _, _ in self.pending
                             if kind == "nvlink" and self.is_switch(t, c)})
        for k, busid in enumerate(switch_ids):
            add_node(self.G, f"NVS{k}", "nvswitch", busid=busid)
        per_side: dict[tuple[str, str], list] = {}
        for gid, kind, target, tclass, count, per_link in self.pending:
            peer = self.peer_of(gid, target, tclass, switch_ids)
            if peer is None or peer == gid:
                continue  # a GPU outside this (partial) dump, or the GPU's own bus id
            entry = per_side.setdefault((gid, peer), [kind, 0, per_link])
            entry[1] += count  # several <nvlink> lines to one target add up
        for (a, b), (kind, count, per_link) in per_side.items():
            if (b, a) in per_side and self.G.has_edge(b, a):
                continue  # a GPU-GPU bundle is listed by both GPUs: written once
            count = max(count, per_side.get((b, a), [kind, 0])[1])
            add_link(self.G, a, b, kind, count * per_link, count)

    def peer_of(self, gid: str, target: str, tclass: str, switch_ids: list[str]) -> str:
        if target in switch_ids:
            return f"NVS{switch_ids.index(target)}"
        if tclass == CPU_CLASS:
            return self.cpu_of_gpu[gid]
        return self.gpu_by_busid.get(target)

    def is_switch(self, target: str, tclass: str) -> bool:
        """NVSwitch by class; with no class, any bus id that is none of our GPUs."""
        if tclass == NVSWITCH_CLASS:
            return True
        return not tclass and target not in self.gpu_by_busid

    def join_cpus(self) -> None:
        """Every two sockets of one host by their SMP link. A dump fused over several hosts
        (a multi-node NVLink domain) names each CPU's ``host_hash``: sockets of different hosts
        share no memory, so they are not joined."""
        cpus = [n for n, k in self.G.nodes(data="kind") if k == "cpu"]
        host = {c: self.G.nodes[c].get("host_hash") for c in cpus}
        for i, a in enumerate(cpus):
            for b in cpus[i + 1:]:
                if host[a] and host[b] and host[a] != host[b]:
                    continue
                bw = min(self.G.nodes[a]["smp_bw"], self.G.nodes[b]["smp_bw"])
                add_link(self.G, a, b, "smp", bw)


def from_nccl_xml(source) -> nx.DiGraph:
    """Build a topology from NCCL topology XML text or a path to such a file.

    Parameters
    ----------
    source : str or os.PathLike
        XML text (anything containing ``<``) or a file path.

    Raises
    ------
    TopologyError
        The XML does not parse (the message gives line and column) or an element lacks what
        it needs (the message names it).

    See Also
    --------
    from_nvidia_smi, collectx.topology.load

    Notes
    -----
    See the module docstring for the mapping and the tolerated quirks. Bandwidths are line
    rates: NVLink 25 GB/s per link (20 on sm60, 50 on sm100), PCIe from GT/s x width.
    """
    in_file = lambda text: "<" not in text  # noqa: E731  (a string without markup names a file)
    root = _parse(read_source(source, "NCCL topology XML", in_file))
    _check_complete(root)
    b = _Builder()
    for cpu in root.findall("cpu"):
        b.cpu(cpu)
    for stray in (el for el in root if el.tag in ("pci", "gpu", "nic")):
        raise TopologyError(f"<{stray.tag}> directly under <system>; expected it inside a <cpu>")
    b.resolve_links()
    b.join_cpus()
    for node in b.G.nodes.values():
        node.pop("smp_bw", None)
        node.pop("host_hash", None)
    kinds = [k for _, k in b.G.nodes(data="kind")]
    b.G.graph["description"] = (f"imported from NCCL topology XML (version "
                                f"{root.get('version', '?')}): {kinds.count('gpu')} GPUs, "
                                f"{kinds.count('nvswitch')} NVSwitches, {kinds.count('nic')} NICs, "
                                f"{kinds.count('cpu')} CPUs")
    return b.G
