"""Probe against a fake NVML and a fake sysfs tree; COLLECTX_TOPO_FILE / _DUMP_FILE."""

import json
import os
from types import SimpleNamespace

import collectx.topology as topo
from collectx.config import Config
from collectx.topology.paths import PathClass, path_class
from collectx.topology.probe import local_topology, numa_nodes, probe, probe_host


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """The pynvml functions the probe calls, over a table of GPUs.

    gpus: list of (busid, {link index: (remote busid, version, remote is switch)}).
    """

    NVML_FEATURE_ENABLED = 1
    NVML_P2P_CAPS_INDEX_READ = (0,)  # as nvidia-ml-py 12.x defines it
    NVML_P2P_STATUS_OK = 0
    NVMLError = FakeNVMLError

    def __init__(self, gpus, p2p_blocked=(), fail_init=False, links_supported=12):
        self.gpus, self.p2p_blocked, self.fail_init = gpus, set(p2p_blocked), fail_init
        self.links_supported = links_supported
        self.shut = False

    def nvmlInit(self):
        if self.fail_init:
            raise FakeNVMLError("NVML_ERROR_DRIVER_NOT_LOADED")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=("0000" + self.gpus[h][0]).upper().encode())

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (7, 0)

    def nvmlDeviceGetCpuAffinity(self, h, words):
        return [0x0F if h < 2 else 0xF0] + [0] * (words - 1)

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= self.links_supported:
            raise FakeNVMLError("NVML_ERROR_INVALID_ARGUMENT")
        return 1 if link in self.gpus[h][1] else 0

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self.gpus[h][1][link][1]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self.gpus[h][1][link][0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return 2 if self.gpus[h][1][link][2] else 0

    def nvmlDeviceGetP2PStatus(self, a, b, caps):
        if not isinstance(caps, int):  # ctypes would reject it, as the real binding does
            raise TypeError(f"caps index must be an int, got {caps!r}")
        return 1 if frozenset((a, b)) in self.p2p_blocked else 0


def make_sysfs(root, devices, nodes=("0-3", "4-7"), ib=()):
    """Fake sysfs: devices maps busid -> (chain of bridge busids from the root port, numa, gen).

    Each device directory sits under its bridges, as in /sys/devices/pci0000:00/...; the
    /sys/bus/pci/devices entries are symlinks into that tree.
    """
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for busid, (bridges, numa, speed) in devices.items():
        path = root / "devices" / "pci0000:00"
        for hop in (*bridges, busid):
            path = path / hop
            path.mkdir(parents=True, exist_ok=True)
            (path / "numa_node").write_text(f"{numa}\n")
            (path / "max_link_speed").write_text(f"{speed} GT/s PCIe\n")
            (path / "max_link_width").write_text("16\n")
            if not (bus / hop).exists():
                os.symlink(path, bus / hop)
    for i, cpus in enumerate(nodes):
        node = root / "devices" / "system" / "node" / f"node{i}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(cpus + "\n")
    for name, busid, rate in ib:
        dev = root / "class" / "infiniband" / name
        (dev / "ports" / "1").mkdir(parents=True)
        (dev / "ports" / "1" / "rate").write_text(rate + "\n")
        os.symlink(bus / busid, dev / "device")
    return str(root)


BUS = ["0000:1a:00.0", "0000:1b:00.0", "0000:3a:00.0", "0000:3b:00.0"]
# root port 00:01.0 -> switch (up 10:00.0, down 11:00.0) for GPUs 0,1; the same shape on 00:02.0
SWITCHED = {BUS[0]: (["0000:00:01.0", "0000:10:00.0", "0000:11:00.0"], 0, "8.0"),
            BUS[1]: (["0000:00:01.0", "0000:10:00.0", "0000:11:08.0"], 0, "8.0"),
            BUS[2]: (["0000:00:02.0", "0000:30:00.0", "0000:31:00.0"], 1, "8.0"),
            BUS[3]: (["0000:00:02.0", "0000:30:00.0", "0000:31:08.0"], 1, "8.0")}


def dgx1_like_links():
    """4 GPUs, NVLink2: 0-1 x2, 0-2 x1, 1-3 x1, 2-3 x2, 0-3 x1 (six links on GPU0 is too many
    for this toy, so 4 per GPU)."""
    pairs = {(0, 1): 2, (0, 2): 1, (1, 3): 1, (2, 3): 2, (0, 3): 1, (1, 2): 1}
    links = [dict() for _ in range(4)]
    for (a, b), n in pairs.items():
        for _ in range(n):
            links[a][len(links[a])] = (BUS[b], 2, False)
            links[b][len(links[b])] = (BUS[a], 2, False)
    return [(BUS[i], links[i]) for i in range(4)]


def test_nvlink_system(tmp_path):
    nvml = FakeNVML(dgx1_like_links())
    G = probe(nvml=nvml, sysfs_root=make_sysfs(tmp_path, SWITCHED))
    assert nvml.shut
    assert topo.gpus(G) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert G.nodes["GPU0"]["busid"] == BUS[0] and G.nodes["GPU0"]["sm"] == "70"
    assert G.edges["GPU0", "GPU1"]["count"] == 2 and G.edges["GPU1", "GPU0"]["bw_gbps"] == 50.0
    assert G.edges["GPU0", "GPU3"]["count"] == 1
    assert sum(d["count"] for d in G["GPU0"].values() if d["type"] == "nvlink") == 4
    # two PCIe switches (one per upstream port), each under its socket
    assert G.nodes["PSW0"]["busid"] == "0000:10:00.0"
    assert set(G["PSW0"]) == {"CPU0", "GPU0", "GPU1"} and set(G["PSW1"]) == {"CPU1", "GPU2", "GPU3"}
    assert G.edges["GPU2", "PSW1"]["bw_gbps"] == 15.75
    assert G.edges["CPU0", "CPU1"]["type"] == "smp"
    assert G.nodes["GPU0"]["p2p"] == ["GPU1", "GPU2", "GPU3"]
    assert G.nodes["GPU0"]["cpu_affinity"] == "0-3" and G.nodes["GPU3"]["cpu_affinity"] == "4-7"


def test_pcie_only_system_with_p2p_blocked_and_a_nic(tmp_path):
    devices = dict(SWITCHED)
    devices["0000:12:00.0"] = (["0000:00:01.0", "0000:10:00.0", "0000:11:10.0"], 0, "8.0")
    sysfs = make_sysfs(tmp_path, devices, ib=[("mlx5_0", "0000:12:00.0", "100 Gb/sec (4X EDR)")])
    nvml = FakeNVML([(b, {}) for b in BUS], p2p_blocked=[frozenset((0, 2))], links_supported=0)
    G = probe(nvml=nvml, sysfs_root=sysfs)
    assert not [e for e in G.edges(data="type") if e[2] == "nvlink"]
    assert path_class(G, "GPU0", "GPU1") == PathClass.PIX
    assert path_class(G, "GPU0", "GPU2") == PathClass.SYS
    assert G.nodes["NIC0"]["name"] == "mlx5_0" and G.nodes["NIC0"]["net_gbps"] == 12.5
    assert set(G["NIC0"]) == {"PSW0"}
    assert "GPU2" not in G.nodes["GPU0"]["p2p"]


def test_nvswitch_system(tmp_path):
    switches = ["0000:f3:00.0", "0000:f4:00.0"]
    gpus = []
    for b in BUS:
        links = {k: (switches[k % 2], 4, True) for k in range(6)}  # 3 links to each switch
        gpus.append((b, links))
    G = probe(nvml=FakeNVML(gpus, links_supported=18), sysfs_root=make_sysfs(tmp_path, SWITCHED))
    assert topo.nodes_of_kind(G, "nvswitch") == ["NVS0", "NVS1"]
    assert G.nodes["NVS1"]["busid"] == "0000:f4:00.0"
    assert G.edges["GPU3", "NVS0"]["count"] == 3 and G.edges["GPU3", "NVS0"]["bw_gbps"] == 75.0
    assert path_class(G, "GPU0", "GPU3") == PathClass.NVB
    assert topo.paths(G)["GPU0", "GPU3"].bw_gbps == 75.0


def test_without_nvml_the_probe_returns_the_cpu_host(tmp_path):
    sysfs = make_sysfs(tmp_path, {}, nodes=("0-3", "4-7"))
    G = probe(nvml=FakeNVML([], fail_init=True), sysfs_root=sysfs)
    assert topo.gpus(G) == [f"RANK{i}" for i in range(8)]
    assert topo.nodes_of_kind(G, "cpu") == ["CPU0", "CPU1"]
    assert G.edges["RANK1", "CPU1"]["type"] == "shm"
    assert numa_nodes(sysfs) == {0: 4, 1: 4}
    assert topo.gpus(probe(nvml=FakeNVML([]), sysfs_root=sysfs))[-1] == "RANK7"


def test_probe_host_on_this_machine_has_one_rank_per_cpu():
    G = probe_host()
    assert len(topo.gpus(G)) >= 1
    assert all(G.nodes[r]["device"] == "cpu" for r in topo.gpus(G))


def test_topo_file_replaces_probing_and_dump_file_records_it(tmp_path):
    sysfs = make_sysfs(tmp_path / "sys", SWITCHED)
    dump = tmp_path / "probed.json"
    G = local_topology(Config(topo_dump_file=str(dump)), nvml=FakeNVML(dgx1_like_links()),
                       sysfs_root=sysfs)
    doc = json.loads(dump.read_text())
    assert doc["schema"] == "collectx.topology/1" and doc == topo.to_json(G)
    again = local_topology(Config(topo_file=str(dump)), nvml=FakeNVML([], fail_init=True))
    assert topo.to_json(again) == doc
    preset = local_topology(Config(topo_file=str(topo.preset_path("dgx2"))))
    assert len(topo.gpus(preset)) == 16


def test_unreadable_remote_ends_are_one_hidden_nvswitch(tmp_path):
    class HiddenSwitchNVML(FakeNVML):
        def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
            raise FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")

    gpus = [(b, {k: (None, 3, False) for k in range(12)}) for b in BUS[:2]]
    G = probe(nvml=HiddenSwitchNVML(gpus), sysfs_root=make_sysfs(tmp_path, SWITCHED))
    assert topo.nodes_of_kind(G, "nvswitch") == ["NVS0"]
    assert G.edges["GPU1", "NVS0"]["count"] == 12 and G.edges["GPU1", "NVS0"]["bw_gbps"] == 300.0


def test_link_rate_from_nvml_version_when_the_compute_capability_is_unknown(tmp_path):
    class NoCapabilityNVML(FakeNVML):
        def nvmlDeviceGetCudaComputeCapability(self, h):
            raise FakeNVMLError("NVML_ERROR_FUNCTION_NOT_FOUND")

    # nvmlNvlinkVersion_t 7 is NVLink 5.0 (50 GB/s per link), 6 is 4.0 (25 GB/s)
    gpus = [(BUS[0], {0: (BUS[1], 7, False), 1: (BUS[1], 7, False)}),
            (BUS[1], {0: (BUS[0], 7, False), 1: (BUS[0], 7, False)})]
    G = probe(nvml=NoCapabilityNVML(gpus), sysfs_root=make_sysfs(tmp_path, SWITCHED))
    assert "sm" not in G.nodes["GPU0"]
    assert G.edges["GPU0", "GPU1"]["count"] == 2 and G.edges["GPU0", "GPU1"]["bw_gbps"] == 100.0
