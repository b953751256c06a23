"""Probe this machine: NVML for GPUs and NVLinks, sysfs for the PCIe tree, NUMA nodes and NICs.

How it works: NVML lists the GPUs with their PCI bus ids and, per NVLink, its state, version and
the bus id of the remote end (a GPU we know, else an NVSwitch). sysfs gives each device's path
from its root port (``/sys/bus/pci/devices/<busid>`` links into ``/sys/devices/pci<dom:bus>/...``),
its NUMA node and link speed/width; RDMA NICs come from ``/sys/class/infiniband``. Bridges on
that path are read as PCIe switches in the usual shape (root port, then upstream + downstream
port per switch), so each switch becomes one ``pci_switch`` named after its upstream port.

Without NVML or without GPUs, :func:`probe` returns :func:`probe_host`: the CPU-rank topology of
this machine (one rank per core, spread over its NUMA nodes).

>>> H = probe_host(sysfs_root="/nonexistent", nranks=3)
>>> gpus(H), H.nodes["RANK0"]["device"]
(['RANK0', 'RANK1', 'RANK2'], 'cpu')
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import networkx as nx

from .generators import DEFAULT_SMP_BW, host
from .model import add_link, add_node, gpus, natural_key, new_graph
from .pcie import (DEFAULT_NVLINK_GBPS, NVLINK_GBPS_BY_VERSION, normalize_busid, nvlink_bw_for_sm,
                   pcie_bw)

_BUSID = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
_NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of older bindings (newer ones say 36)
_DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
_AFFINITY_WORDS = 16  # 1024 CPUs in 64-bit words, as NCCL asks NVML


def _read(path: Path, default: str | None = None) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def _cpulist_size(text: str) -> int:
    total = 0
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def numa_nodes(sysfs_root: str = "/sys") -> dict[int, int]:
    """NUMA node id -> number of CPUs, from ``<sysfs_root>/devices/system/node``; {} if absent."""
    base = Path(sysfs_root) / "devices" / "system" / "node"
    out = {}
    for node in sorted(base.glob("node[0-9]*"), key=lambda p: natural_key(p.name)):
        cpus = _read(node / "cpulist")
        if cpus is not None:
            out[int(node.name[4:])] = _cpulist_size(cpus)
    return out


def probe_host(sysfs_root: str = "/sys", nranks: int | None = None) -> nx.DiGraph:
    """The CPU-rank topology of this machine (see :func:`collectx.topology.host`).

    Parameters
    ----------
    sysfs_root : str
        Where sysfs is mounted (tests pass a fake tree).
    nranks : int, optional
        Ranks to place; default one per online CPU.
    """
    nodes = {k: v for k, v in numa_nodes(sysfs_root).items() if v > 0}
    cores = sum(nodes.values()) or os.cpu_count() or 1
    G = host(nranks or cores, numa_nodes=max(1, len(nodes)))
    G.graph["name"] = "local_host"
    G.graph["description"] = (f"probed CPU host: {cores} CPUs on {max(1, len(nodes))} NUMA "
                              f"node(s), {nranks or cores} ranks")
    return G


class _Sysfs:
    """The bits of sysfs the probe reads, rooted anywhere so tests can fake it."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def device_dir(self, busid: str) -> Path | None:
        link = self.root / "bus" / "pci" / "devices" / busid
        return Path(os.path.realpath(link)) if link.exists() else None

    def bridges_above(self, busid: str) -> list[str]:
        """Bus ids of the bridges from the root port down to ``busid`` (excluded)."""
        where = self.device_dir(busid)
        if where is None:
            return []
        chain = [p for p in where.parts if _BUSID.match(p)]
        return chain[:-1]

    def link_bw(self, busid: str) -> float:
        where = self.device_dir(busid)
        if where is None:
            return pcie_bw(None, None)
        return pcie_bw(_read(where / "max_link_speed"), _read(where / "max_link_width"))

    def numa(self, busid: str) -> int:
        where = self.device_dir(busid)
        value = _read(where / "numa_node", "-1") if where else "-1"
        return max(0, int(value)) if value.lstrip("-").isdecimal() else 0

    def rdma_nics(self) -> list[tuple[str, str, float | None]]:
        """(name, busid, GB/s) of each RDMA device under /sys/class/infiniband."""
        out = []
        for dev in sorted((self.root / "class" / "infiniband").glob("*")):
            busid = Path(os.path.realpath(dev / "device")).name
            rate = _read(dev / "ports" / "1" / "rate", "")
            gbits = re.match(r"\s*([0-9.]+)\s*Gb", rate or "")
            out.append((dev.name, normalize_busid(busid),
                        float(gbits.group(1)) / 8 if gbits else None))
        return out


class _PcieTree:
    """Places devices under CPUs and PCIe switches as sysfs shows them."""

    def __init__(self, G: nx.DiGraph, sysfs: _Sysfs) -> None:
        self.G, self.sysfs = G, sysfs
        self.switch_of: dict[str, str] = {}

    def cpu(self, numa: int) -> str:
        cid = f"CPU{numa}"
        if cid not in self.G:
            add_node(self.G, cid, "cpu", numa=numa)
        return cid

    def attach(self, node: str, busid: str) -> None:
        """Link ``node`` (already added) to its switch or CPU, creating switches on the way."""
        parent = self.cpu(self.sysfs.numa(busid))
        upstream_ports = self.sysfs.bridges_above(busid)[1::2]  # skip the root port
        for port in upstream_ports:
            if port not in self.switch_of:
                sw = f"PSW{len(self.switch_of)}"
                self.switch_of[port] = sw
                add_node(self.G, sw, "pci_switch", busid=port)
                add_link(self.G, sw, parent, "pcie", self.sysfs.link_bw(port))
            parent = self.switch_of[port]
        add_link(self.G, node, parent, "pcie", self.sysfs.link_bw(busid))


def cpulist_of_mask(words, bits_per_word: int = 64) -> str:
    """A CPU bitmask (NVML's array of unsigned longs, lowest CPUs first) as a cpulist string.

    >>> cpulist_of_mask([0b1111, 0]), cpulist_of_mask([1 << 63, 0b11])
    ('0-3', '63-65')
    """
    cpus = [w * bits_per_word + b for w, word in enumerate(words)
            for b in range(bits_per_word) if int(word) >> b & 1]
    ranges, start = [], None
    for i, cpu in enumerate(cpus):
        start = cpu if start is None else start
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            ranges.append(f"{start}-{cpu}" if cpu != start else str(cpu))
            start = None
    return ",".join(ranges)


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _optional(fn, *args, default=None):
    """Call an NVML function that older drivers or bindings may lack; None-safe."""
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported, AttributeError on old bindings, ...
        return default


def _nvlinks(nvml, handle, sm: str | None) -> dict[str, list]:
    """Remote bus id -> [count, per-link GB/s, remote is a switch] over the active links."""
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    out: dict[str, list] = {}
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception:
            break  # links are numbered densely; the first unsupported one ends the list
        if state != enabled:
            continue
        info = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        # An unreadable remote end is an NVSwitch hidden from us (VMs), as NCCL assumes.
        remote = normalize_busid(_text(info.busId)) if info is not None else "hidden-nvswitch"
        if sm:
            per_link = nvlink_bw_for_sm(sm)
        else:
            version = _optional(nvml.nvmlDeviceGetNvLinkVersion, handle, link)
            per_link = NVLINK_GBPS_BY_VERSION.get(version, DEFAULT_NVLINK_GBPS)
        kind = _optional(getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None), handle, link)
        entry = out.setdefault(remote, [0, per_link, kind == _DEVICE_TYPE_SWITCH])
        entry[0] += 1
    return out


def _probe_gpus(nvml, sysfs: _Sysfs) -> nx.DiGraph:
    G = new_graph("local", "probed with NVML and sysfs")
    tree = _PcieTree(G, sysfs)
    handles, busids = [], {}
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        busid = normalize_busid(_text(nvml.nvmlDeviceGetPciInfo(h).busId))
        attrs = {"busid": busid, "name": _text(_optional(nvml.nvmlDeviceGetName, h, default="?"))}
        cc = _optional(nvml.nvmlDeviceGetCudaComputeCapability, h)
        if cc:
            attrs["sm"] = str(cc[0] * 10 + cc[1])
        mask = _optional(getattr(nvml, "nvmlDeviceGetCpuAffinity", None), h, _AFFINITY_WORDS)
        if mask:
            attrs["cpu_affinity"] = cpulist_of_mask(mask)
        add_node(G, f"GPU{i}", "gpu", **attrs)
        handles.append(h)
        busids[busid] = f"GPU{i}"
    for gid, busid in ((g, G.nodes[g]["busid"]) for g in gpus(G)):
        tree.attach(gid, busid)
    _add_nvlinks(G, nvml, handles, busids)
    _record_p2p(G, nvml, handles)
    for nic, (name, busid, gbps) in enumerate(sysfs.rdma_nics()):
        add_node(G, f"NIC{nic}", "nic", name=name, busid=busid,
                 **({"net_gbps": gbps} if gbps else {}))
        tree.attach(f"NIC{nic}", busid)
    cpus = sorted((n for n, k in G.nodes(data="kind") if k == "cpu"), key=natural_key)
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            add_link(G, a, b, "smp", DEFAULT_SMP_BW)
    return G


def _add_nvlinks(G: nx.DiGraph, nvml, handles: list, busids: dict[str, str]) -> None:
    switches: dict[str, str] = {}
    for i, h in enumerate(handles):
        gid = f"GPU{i}"
        links = _nvlinks(nvml, h, G.nodes[gid].get("sm"))
        for remote, (count, per_link, is_switch) in sorted(links.items()):
            peer = busids.get(remote)
            if peer is None or is_switch:
                # Not one of our GPUs: an NVSwitch (hidden ones report an empty or bogus id).
                peer = switches.setdefault(remote, f"NVS{len(switches)}")
                if peer not in G:
                    add_node(G, peer, "nvswitch", busid=remote)
            elif G.has_edge(gid, peer):
                continue  # the GPU-GPU bundle was recorded from the other side
            add_link(G, gid, peer, "nvlink", count * per_link, count)


def _record_p2p(G: nx.DiGraph, nvml, handles: list) -> None:
    """Each GPU's ``p2p`` attribute lists the GPUs it can read from directly (NVML P2P status)."""
    read_caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_READ", 0)
    if isinstance(read_caps, tuple):  # some nvidia-ml-py releases define it as (0,)
        read_caps = read_caps[0]
    ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    for i, h in enumerate(handles):
        peers = [f"GPU{j}" for j, other in enumerate(handles) if j != i and
                 _optional(nvml.nvmlDeviceGetP2PStatus, h, other, read_caps) == ok]
        G.nodes[f"GPU{i}"]["p2p"] = peers


def _default_nvml():
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def probe(nvml=None, sysfs_root: str = "/sys") -> nx.DiGraph:
    """Probe this machine's topology.

    Parameters
    ----------
    nvml : module-like, optional
        The NVML bindings (``pynvml`` from nvidia-ml-py by default); tests pass a fake with
        the same functions.
    sysfs_root : str
        Where sysfs is mounted.

    Returns
    -------
    nx.DiGraph
        GPUs, NVLinks (to GPUs and NVSwitches), PCIe switches, CPUs (NUMA nodes) and RDMA
        NICs; or, when NVML cannot start or sees no GPU, :func:`probe_host`.

    Notes
    -----
    NVLink bandwidth is count x the per-link line rate of the GPU's generation (by compute
    capability, else by NVML's link version: 20 GB/s for NVLink1, 25 for 2-4, 50 for 5);
    PCIe links use sysfs ``max_link_speed`` x ``max_link_width``; CPU-CPU links NCCL's
    Skylake UPI figure (10 GB/s).
    """
    nvml = nvml if nvml is not None else _default_nvml()
    if nvml is None:
        return probe_host(sysfs_root)
    try:
        nvml.nvmlInit()
    except Exception:  # no driver, no GPU, container without /dev/nvidia*
        return probe_host(sysfs_root)
    try:
        if nvml.nvmlDeviceGetCount() == 0:
            return probe_host(sysfs_root)
        return _probe_gpus(nvml, _Sysfs(sysfs_root))
    finally:
        _optional(nvml.nvmlShutdown)


def local_topology(config=None, nvml=None, sysfs_root: str = "/sys") -> nx.DiGraph:
    """The topology of this machine, as every command uses it when given no source.

    ``COLLECTX_TOPO_FILE`` (``config.topo_file``) names a file to load instead of probing;
    ``COLLECTX_TOPO_DUMP_FILE`` (``config.topo_dump_file``) receives what was probed, as
    ``collectx.topology/1`` JSON, so the run can be replayed elsewhere.
    """
    from ..config import get_config
    from .jsonio import load, write_json
    cfg = config if config is not None else get_config()
    if cfg.topo_file:
        return load(cfg.topo_file)
    G = probe(nvml=nvml, sysfs_root=sysfs_root)
    if cfg.topo_dump_file:
        write_json(G, cfg.topo_dump_file)
    return G
