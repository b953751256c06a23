"""Importers: NCCL/RCCL topology XML and nvidia-smi topo -m matrices (real and hand-made)."""

import re
from pathlib import Path

import pytest

import collectx.topology as topo
from collectx.errors import TopologyError
from collectx.topology.nccl_xml import from_nccl_xml
from collectx.topology.nvsmi import from_nvidia_smi
from collectx.topology.paths import PathClass, path_class

from _dumps import REAL

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "topology"


TWO_GPUS_AND_A_NIC = ("        GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity\n"
                      "GPU0     X      NV4     PIX     0-15    0\n"
                      "GPU1    NV4      X      SYS     16-31   1\n"
                      "NIC0    PIX     SYS      X\n")


def _as_lists(G):
    """A graph's nodes and edges with their attributes, in order: two readings compare equal."""
    return sorted(G.nodes(data=True)), sorted(G.edges(data=True))


def _nvlink_bundles(G):
    return {(frozenset((a, b)), d["count"]) for a, b, d in G.edges(data=True)
            if d["type"] == "nvlink"}


def test_hgx_h100_dump_gives_8_gpus_with_18_nvlinks_to_4_nvswitches():
    G = topo.load(REAL / "hgx_h100_nccl_topo.xml")
    assert topo.gpus(G) == [f"GPU{i}" for i in range(8)]
    assert len(topo.nodes_of_kind(G, "nvswitch")) == 4
    for g in topo.gpus(G):
        nv = [(peer, d) for peer, d in G[g].items() if d["type"] == "nvlink"]
        assert {G.nodes[p]["kind"] for p, _ in nv} == {"nvswitch"}
        assert sum(d["count"] for _, d in nv) == 18
        assert sum(d["bw_gbps"] for _, d in nv) == 450.0  # 18 x 25 GB/s line rate
        assert sorted(d["count"] for _, d in nv) == [4, 4, 5, 5]
    assert len(topo.nodes_of_kind(G, "nic")) == 8
    assert len(topo.nodes_of_kind(G, "cpu")) == 2
    # link_width="0" in the VM dump counts as x16: Gen5 x16 line rate.
    assert G.edges["GPU0", "PSW0"]["bw_gbps"] == pytest.approx(63.02)
    # the virtual bridge claims 2.5 GT/s x1; its uplink takes its children's width instead
    assert G.edges["PSW0", "CPU0"]["bw_gbps"] == pytest.approx(63.02)
    assert G.edges["CPU0", "CPU1"]["bw_gbps"] == 22.0  # Sapphire Rapids (model 143)


def test_hgx_h100_dump_matches_the_preset_nvlink_counts_per_gpu():
    G = topo.load(REAL / "hgx_h100_nccl_topo.xml")
    P = topo.load("dgx_h100")
    per_gpu = lambda H, g: sorted(d["count"] for d in H[g].values() if d["type"] == "nvlink")  # noqa: E731
    assert all(per_gpu(G, g) == per_gpu(P, g) for g in topo.gpus(P))


def test_dgx1v_nvidia_smi_gives_the_preset_nvlink_pairs_and_counts():
    G = topo.load(REAL / "dgx1v_nvidia-smi-topo.txt")
    assert _nvlink_bundles(G) == _nvlink_bundles(topo.load("dgx1v"))
    assert topo.gpus(G) == [f"GPU{i}" for i in range(8)]
    assert G.nodes["NIC0"]["name"] == "mlx5_0"
    # GPU2, GPU3 and the NIC share a PCIe switch (PIX); GPU0 reaches it through CPU0 (NODE)
    switch = next(iter(set(G["GPU2"]) & set(G["NIC0"])))
    assert G.nodes[switch]["kind"] == "pci_switch" and G.has_edge("GPU3", switch)
    assert set(G["GPU0"]) & {"CPU0"} and set(G["GPU5"]) & {"CPU1"}
    assert path_class(G, "GPU0", "GPU3") == PathClass.NVL


def test_rccl_v2_xml_reads_xgmi_links_once_per_pair():
    G = from_nccl_xml(FIXTURES / "rccl_v2_xgmi.xml")
    assert topo.gpus(G) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    xgmi = {(frozenset((a, b)), d["count"], d["bw_gbps"]) for a, b, d in G.edges(data=True)
            if d["type"] == "xgmi"}
    assert xgmi == {(frozenset(("GPU0", "GPU1")), 4, 200.0), (frozenset(("GPU2", "GPU3")), 4, 200.0),
                    (frozenset(("GPU0", "GPU2")), 2, 100.0), (frozenset(("GPU1", "GPU3")), 2, 100.0)}
    assert G.edges["CPU0", "CPU1"]["bw_gbps"] == 16.0  # AMD inter-socket, as NCCL
    assert G.nodes["NIC0"]["name"] == "mlx5_0"
    assert path_class(G, "GPU0", "GPU1") == PathClass.NVL


_TWO_GPU_HIVE = """<system version="2">
  <cpu numaid="0" affinity="ffffffff" arch="x86_64" vendor="AuthenticAMD" familyid="26" modelid="2">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:08:00.0" class="0x120000" link_speed="32.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="256" gcn="{gcn}" rank="0" gdr="1">
          <xgmi target="0000:18:00.0" count="1" tclass="0x120000"/>
        </gpu>
      </pci>
      <pci busid="0000:18:00.0" class="0x120000" link_speed="32.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="256" gcn="{gcn}" rank="1" gdr="1">
          <xgmi target="0000:08:00.0" count="1" tclass="0x120000"/>
        </gpu>
      </pci>
    </pci>
  </cpu>
</system>
"""


@pytest.mark.parametrize("gcn, per_link", [("gfx942:sramecc+:xnack-", 64.0), ("gfx950", 76.8),
                                           ("910", 50.0)])
def test_xgmi_links_run_at_their_generations_rate(tmp_path, gcn, per_link):
    # MI355X (gfx950) links carry 153.6 GB/s both ways, MI300X (gfx942) 128, MI250 (910) 100
    path = tmp_path / "hive.xml"
    path.write_text(_TWO_GPU_HIVE.format(gcn=gcn))
    G = from_nccl_xml(path)
    assert G.edges["GPU0", "GPU1"]["type"] == "xgmi"
    assert G.edges["GPU0", "GPU1"]["bw_gbps"] == pytest.approx(per_link)


def test_vm_dump_with_zero_widths_and_hidden_nvswitch():
    G = from_nccl_xml(FIXTURES / "vm_hidden_nvswitch.xml")
    assert topo.gpus(G) == ["GPU0", "GPU1"]  # the GPU without dev gets the next free number
    assert topo.nodes_of_kind(G, "nvswitch") == ["NVS0"]
    assert G.edges["GPU1", "NVS0"]["count"] == 12 and G.edges["GPU0", "NVS0"]["bw_gbps"] == 300.0
    assert G.edges["GPU0", "CPU0"]["bw_gbps"] == pytest.approx(31.51)  # width 0 -> x16 Gen4
    assert G.edges["GPU1", "CPU0"]["bw_gbps"] == pytest.approx(15.75)  # no speed -> Gen3
    assert G.edges["NIC0", "CPU0"]["bw_gbps"] == pytest.approx(25000 / 8000)


def test_nested_pcie_switches_give_pix_and_pxb_paths():
    G = from_nccl_xml(FIXTURES / "nested_pcie.xml")
    assert len(topo.nodes_of_kind(G, "pci_switch")) == 3
    assert path_class(G, "GPU0", "GPU1") == PathClass.PIX
    assert path_class(G, "GPU0", "GPU2") == PathClass.PXB
    assert path_class(G, "GPU0", "GPU4") == PathClass.SYS
    assert G.edges["CPU0", "CPU1"]["bw_gbps"] == 10.0  # Skylake (model 85)
    assert len(topo.gpus(G)) == 5  # the NVMe endpoint is not a node


def test_truncated_xml_names_the_line():
    with pytest.raises(TopologyError, match=r"line \d+ column \d+.*truncated"):
        topo.load(FIXTURES / "truncated.xml")


@pytest.mark.parametrize("xml, message", [
    ("<graphs version='1'/>", "NCCL graph file.*NCCL_TOPO_DUMP_FILE"),
    ("<topology/>", "root <topology>; expected <system>"),
    ("<system><cpu><pci busid='0000:01:00.0' class='0x030200'><gpu dev='0'><nvlink count='2'/>"
     "</gpu></pci></cpu></system>", "<nvlink> of GPU0 has no 'target'"),
    ("<system><cpu><pci busid='0000:01:00.0' class='0x030200'><gpu dev='0'>"
     "<nvlink target='0000:02:00.0' count='two'/></gpu></pci></cpu></system>", "count='two'"),
    ("<system><pci busid='0000:01:00.0'/></system>", "directly under <system>"),
    ("<system><cpu><pci busid='0002:81:00.0' class='0x030200'><gpu dev='0' mlopart='0'/>"
     "<gpu dev='0' mlopart='1'/></pci></cpu></system>", "holds 2 <gpu> elements.*one rank per"),
])
def test_bad_xml_is_a_topology_error(xml, message):
    with pytest.raises(TopologyError, match=message):
        from_nccl_xml(xml)


def test_tab_separated_matrix_with_numa_columns_and_nic_legend():
    G = topo.load(FIXTURES / "smi_tabs_numa.txt")
    assert topo.gpus(G) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert [G.nodes[n]["name"] for n in topo.nodes_of_kind(G, "nic")] == ["mlx5_0", "mlx5_1"]
    assert G.edges["GPU0", "GPU1"]["count"] == 12 and G.edges["GPU0", "GPU1"]["bw_gbps"] == 300.0
    assert not G.has_edge("GPU0", "GPU3")
    assert G.nodes["GPU2"]["numa"] == 1 and G.nodes["GPU2"]["cpu_affinity"] == "32-63,96-127"
    assert topo.nodes_of_kind(G, "cpu") == ["CPU0", "CPU1"]
    assert path_class(G, "NIC1", "GPU2") == PathClass.PIX
    assert path_class(G, "NIC0", "GPU0") == PathClass.PXB
    # with the NVLinked peers gone, the only way between the sockets' NICs is the SMP link
    assert path_class(topo.subset(G, [0, 3]), "NIC0", "NIC1") == PathClass.SYS


def test_of_a_log_of_two_hosts_the_first_matrix_reads_with_its_own_nic_names():
    def host(name, nic):
        return (f"2025/05/21 09:40:05 {name} nvidia-smi topo -m\n" + TWO_GPUS_AND_A_NIC +
                f"\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: {nic}\n\n")
    G = from_nvidia_smi(host("s114", "rocep4s0f0") + host("s116", "mlx5_0"))
    assert [G.nodes[n]["name"] for n in topo.nodes_of_kind(G, "nic")] == ["rocep4s0f0"]
    assert _as_lists(G)[1] == _as_lists(from_nvidia_smi(host("s114", "rocep4s0f0")))[1]


def test_space_separated_matrix_without_affinity_columns():
    text = ("     GPU0  GPU1  GPU2\n"
            "GPU0  X    PHB   SYS\n"
            "GPU1  PHB   X    SYS\n"
            "GPU2  SYS  SYS    X\n")
    G = from_nvidia_smi(text, pcie_bw=31.5, smp_bw=16.0)
    assert len(topo.nodes_of_kind(G, "cpu")) == 2
    assert G.edges["GPU0", "CPU0"]["bw_gbps"] == 31.5
    assert path_class(G, "GPU0", "GPU1") == PathClass.PHB
    assert path_class(G, "GPU0", "GPU2") == PathClass.SYS


def test_nvlinked_gpus_without_affinity_columns_share_the_fewest_numa_nodes_sys_allows():
    # NV# hides the PCIe relation; only SYS says "another NUMA node". GPU3 is NVLinked to
    # GPU0 across the sockets, as in a hybrid cube-mesh.
    text = ("     GPU0  GPU1  GPU2  GPU3\n"
            "GPU0  X    NV2   SYS   NV1\n"
            "GPU1  NV2   X    SYS   SYS\n"
            "GPU2  SYS  SYS    X    NV2\n"
            "GPU3  NV1  SYS   NV2    X\n")
    G = from_nvidia_smi(text)
    cpu = {g: next(p for p in G[g] if G.nodes[p]["kind"] == "cpu") for g in topo.gpus(G)}
    assert len(topo.nodes_of_kind(G, "cpu")) == 2
    assert cpu["GPU0"] == cpu["GPU1"] != cpu["GPU2"] == cpu["GPU3"]


@pytest.mark.parametrize("underline", ["\x1b[4m", "[4m"])
def test_header_underlined_by_a_terminal_is_read(underline):
    end = underline.replace("4", "0")
    text = (f"\t{underline}GPU0\tGPU1\tCPU Affinity\tNUMA Affinity{end}\n"
            "GPU0\t X \tNV18\t0-63\t0\n"
            "GPU1\tNV18\t X \t0-63\t0\n")
    G = from_nvidia_smi(text)
    assert topo.gpus(G) == ["GPU0", "GPU1"]
    assert G.edges["GPU0", "GPU1"]["count"] == 18


def test_columns_run_together_by_fixed_width_output_are_split():
    # past a few dozen NICs nvidia-smi's columns overflow into each other (an 8x H20 node
    # with 36 NICs printed NIC12's and NIC13's cells as "NODENODE", "PIXPIX", "SYSSYS")
    text = ("        GPU0    GPU1    NIC0NIC1    CPU Affinity    NUMA Affinity\n"
            "GPU0     X      NV18    PIXNODE     0-47    0\n"
            "GPU1    NV18     X      NODEPIX     0-47    0\n"
            "NIC0    PIX     NODE     XNODE\n"
            "NIC1    NODE    PIX     NODEX\n")
    G = from_nvidia_smi(text)
    assert topo.gpus(G) == ["GPU0", "GPU1"] and G.edges["GPU0", "GPU1"]["count"] == 18
    switch = {n: [p for p in G[n] if G.nodes[p]["kind"] == "pci_switch"] for n in G}
    assert switch["NIC0"] == switch["GPU0"] != switch["NIC1"] == switch["GPU1"] != []


def test_a_matrix_pasted_as_a_markdown_table_reads_as_the_plain_one():
    # a wiki page or README may carry the matrix as a Markdown table: a corner cell heads the
    # row names, pipes separate the cells and a dashed row underlines the header
    plain = TWO_GPUS_AND_A_NIC
    table = ("| GPU  | GPU0 | GPU1 | NIC0 | CPU Affinity | NUMA Affinity |\n"
             "|------|------|------|------|--------------|---------------|\n"
             "| GPU0 | X    | NV4  | PIX  | 0-15         | 0             |\n"
             "| GPU1 | NV4  | X    | SYS  | 16-31        | 1             |\n"
             "| NIC0 | PIX  | SYS  | X    |              |               |\n")
    G = from_nvidia_smi(table)
    assert _as_lists(G) == _as_lists(from_nvidia_smi(plain))
    assert G.edges["GPU0", "GPU1"]["count"] == 4
    assert path_class(G, "NIC0", "GPU0") == PathClass.PIX
    with pytest.raises(TopologyError, match="line 4: row GPU1 has 1 cells; expected 3"):
        from_nvidia_smi(table.replace("| NV4  | X    | SYS  | 16-31        | 1   ", "| NV4"))


def test_a_quoted_matrix_or_one_whose_header_lost_its_tabs_reads_as_the_plain_one():
    # a reply quotes the matrix ("> "), a source comment keeps it (" * ", or "# " in a script),
    # and a page copied from an old terminal runs the header's names together while the rows
    # keep their tabs
    plain = ("\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
             "GPU0\t X \tNV1\tPIX\t0-7\n"
             "GPU1\tNV1\t X \tSOC\t8-15\n"
             "mlx5_0\tPIX\tSOC\t X \n"
             "\n"
             "Legend:\n"
             "  SOC  = Connection traversing PCIe as well as the SMP link between\n"
             "  CPU sockets(e.g. QPI)\n")
    want = _as_lists(from_nvidia_smi(plain))
    assert want[1] and ("GPU0", "GPU1") in {(u, v) for u, v, _ in want[1]}
    glued = plain.replace("\tGPU0\tGPU1\tmlx5_0", "\t    GPU0GPU1mlx5_0")
    for prefix in ("> ", "   * ", "// ", "# "):
        quoted = "".join(prefix + line for line in plain.splitlines(keepends=True))
        assert _as_lists(from_nvidia_smi(quoted)) == want
    assert _as_lists(from_nvidia_smi(glued)) == want
    with pytest.raises(TopologyError, match="no header row naming GPU0"):
        from_nvidia_smi(glued.replace("GPU1mlx5_0", "GPU1mlx"))


def test_a_labelled_or_logged_matrix_and_overflowing_columns_read_as_the_plain_one():
    plain = ("        GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
             "GPU0     X      NV18    PIX     0-47,96-143     0               N/A\n"
             "GPU1    NV18     X      SYS     48-95,144-191   1               N/A\n"
             "NIC0    PIX     SYS      X\n")
    want = _as_lists(from_nvidia_smi(plain))
    lines = plain.splitlines(keepends=True)
    # the header on its label's line (rows as printed), every line behind a log's level and time
    assert _as_lists(from_nvidia_smi("GPU topology: " + plain.lstrip())) == want
    logged = "".join(f"INFO 2025-04-06T03:02:45.84{i}Z {line}" for i, line in enumerate(lines))
    assert _as_lists(from_nvidia_smi(logged)) == want
    # a wide last column runs into the affinity heading, a last cell into the affinity
    overflow = plain.replace("NIC0    CPU Affinity", "NIC0CPU Affinity").replace(
        "PIX     0-47", "PIX0-47").replace("SYS     48-95", "SYS48-95")
    assert _as_lists(from_nvidia_smi(overflow)) == want
    # prose that names a GPU is not a header: the matrix below it still is
    assert _as_lists(from_nvidia_smi("rank 0 runs on GPU0\n" + plain)) == want


def test_nic_columns_without_nic_rows_still_give_the_nics():
    # a paste that kept the GPU rows only: each GPU row still relates it to every NIC
    full = TWO_GPUS_AND_A_NIC
    gpu_rows = "".join(full.splitlines(keepends=True)[:3])
    assert _as_lists(from_nvidia_smi(gpu_rows)) == _as_lists(from_nvidia_smi(full))
    with pytest.raises(TopologyError, match="the row for GPU1, NIC0 is missing"):
        from_nvidia_smi("".join(full.splitlines(keepends=True)[:2]))


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("GPU1    NV4      X", "GPU1     X      NV4"),
     "line 3: cell GPU1/GPU0 is 'X'; expected X where a row meets its own column"),
    (lambda t: t + "GPU2    SYS     SYS     SYS      16-31   1\n",
     "line 5: row GPU2 names a GPU the header at line 1 does not list"),
])
def test_a_matrix_whose_rows_disagree_with_its_header_is_refused(edit, message):
    # a hand-edited sample: more GPU rows than header columns, a self cell moved
    text = TWO_GPUS_AND_A_NIC
    from_nvidia_smi(text)
    with pytest.raises(TopologyError, match=message):
        from_nvidia_smi(edit(text))


def test_nic_rows_whose_columns_a_narrow_terminal_cut_off_still_give_the_nics():
    # a capture clipped on the right keeps the NIC rows but not their columns
    text = ("        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
            "GPU0     X      NV8     -31,64-95       0\n"
            "GPU1    NV8      X      32-63,96-127    1\n"
            "NIC0    PIX     SYS\n"
            "NIC1    SYS     PIX\n"
            "\n"
            "Legend:\n"
            "  X    = Self\n"
            "\n"
            "NIC Legend:\n"
            "  NIC0: mlx5_0\n"
            "  NIC1: mlx5_1\n")
    G = from_nvidia_smi(text)
    assert [G.nodes[n]["name"] for n in topo.nodes_of_kind(G, "nic")] == ["mlx5_0", "mlx5_1"]
    assert path_class(G, "NIC0", "GPU0") == path_class(G, "NIC1", "GPU1") == PathClass.PIX
    assert path_class(topo.subset(G, [1]), "NIC0", "GPU1") == PathClass.SYS   # NVLink aside
    with pytest.raises(TopologyError, match="line 4: row NIC0 has 1 cells; expected 2"):
        from_nvidia_smi(text.replace("NIC0    PIX     SYS", "NIC0    PIX"))


def test_matrix_with_a_missing_row_names_it():
    with pytest.raises(TopologyError, match="row for GPU2 is missing"):
        topo.load(FIXTURES / "smi_missing_row.txt")


@pytest.mark.parametrize("text, message", [
    ("nothing to see\n", "no header row"),
    ("    GPU0  GPU1\nGPU0  X  NV2\nGPU1  NV2\n", "line 3: row GPU1 has 1 cells"),
    ("    GPU0  GPU1\nGPU0  X  NVX\nGPU1  NV2  X\n", "line 2: cell GPU0/GPU1 is 'NVX'"),
])
def test_bad_matrices_name_the_line(text, message):
    with pytest.raises(TopologyError, match=message):
        from_nvidia_smi(text)


def test_an_empty_file_says_it_is_empty(tmp_path):
    empty = tmp_path / "machine.json"
    empty.write_text("\n")
    with pytest.raises(TopologyError, match="machine.json: the topology text is empty"):
        topo.load(empty)


def test_xml_with_missing_attributes_is_read_with_defaults():
    G = from_nccl_xml("<system><cpu><pci><gpu><nvlink target='0000:99:00.0'/></gpu></pci>"
                      "<pci class='0x030200'><gpu/></pci></cpu><cpu/></system>")
    assert topo.gpus(G) == ["GPU0", "GPU1"]
    assert topo.nodes_of_kind(G, "cpu") == ["CPU0", "CPU1"]
    assert G.edges["GPU0", "NVS0"]["count"] == 1 and G.edges["GPU0", "NVS0"]["bw_gbps"] == 25.0
    assert G.edges["GPU1", "CPU0"]["bw_gbps"] == 15.75  # no speed, no width: Gen3 x16
    assert G.edges["CPU0", "CPU1"]["type"] == "smp"


def test_links_to_gpus_missing_from_a_partial_dump_are_skipped():
    G = from_nccl_xml("<system><cpu numaid='0'><pci busid='0000:01:00.0' class='0x030200'>"
                      "<gpu dev='0' sm='80'><nvlink target='0000:02:00.0' count='4' tclass='0x030200'/>"
                      "<nvlink target='0000:03:00.0' count='2'/></gpu></pci>"
                      "<nic><net dev='0' speed='fast'/></nic></cpu></system>")
    assert [p for p in G["GPU0"] if G.nodes[p]["kind"] != "cpu"] == ["NVS0"]
    assert G.edges["GPU0", "NVS0"]["count"] == 2  # no tclass, unknown bus id: an NVSwitch
    assert G.nodes["NIC0"]["net_gbps"] == 1.25  # unreadable speed: NCCL's 10,000 Mb/s


def test_an_nvlink_of_no_lanes_is_no_link_and_a_negative_count_is_refused():
    def two(count):   # two GPUs that name each other, as a file mimicking a failed link does
        return from_nccl_xml("<system><cpu numaid='0'>" + "".join(
            f"<pci busid='0000:0{a}:00.0' class='0x030200'><gpu dev='{a}' sm='80'><nvlink "
            f"target='0000:0{1 - a}:00.0' count='{count}' tclass='0x030200'/></gpu></pci>"
            for a in (0, 1)) + "</cpu></system>")
    assert [e for e in two(0).edges(data="type") if e[2] == "nvlink"] == []
    assert two(4).edges["GPU0", "GPU1"]["count"] == 4
    with pytest.raises(TopologyError, match="count='-2'; expected a whole number"):
        two(-2)


def test_a_nic_without_a_speed_runs_at_nccls_default():
    # NCCL's topo.cc: "if (mbps <= 0) mbps = 10000; // Some NICs define speed = -1"
    for net in ("<net dev='0' speed='-1'/>", "<net dev='0'/>", "<net dev='0' speed='0'/>"):
        G = from_nccl_xml(f"<system><cpu numaid='0'><nic>{net}</nic></cpu></system>")
        assert G.nodes["NIC0"]["net_gbps"] == 1.25 and G.edges["NIC0", "CPU0"]["bw_gbps"] == 1.25


def test_a_hand_written_topo_file_without_gpu_elements_is_refused_with_the_fix():
    # The shape of the NCCL_TOPO_FILEs cloud VMs ship: bare PCI devices, NVLinks left to NCCL.
    partial = ("<system version='1'><cpu numaid='0'><pci busid='ffff:ff:01.0' class='0x060400'>"
               "<pci busid='0001:00:00.0' class='0x030200' link_speed='16 GT/s' link_width='16'/>"
               "<pci busid='0101:00:00.0' class='0x020700'/></pci>"
               "<pci busid='0002:00:00.0' class='0x030200'/></cpu></system>")
    with pytest.raises(TopologyError, match=r"2 GPU PCI device\(s\) without a <gpu> element "
                       r"\(bus ids 0001:00:00.0, 0002:00:00.0\).*NCCL_TOPO_DUMP_FILE"):
        from_nccl_xml(partial)
    # beside real <gpu> elements, a display-class device is one more endpoint, as before
    G = from_nccl_xml(partial.replace("<pci busid='0002:00:00.0' class='0x030200'/>",
                                      "<pci busid='0002:00:00.0' class='0x030200'><gpu dev='0'/>"
                                      "</pci>"))
    assert topo.gpus(G) == ["GPU0"]


def test_a_topo_file_of_bus_ids_alone_is_refused_as_partial():
    # some clouds ship NCCL_TOPO_FILEs that give their devices bus ids only, no class
    skeleton = ("<system version='1'><cpu numaid='0'><pci busid='0000:00:16.0'/>"
                "<pci busid='0000:00:17.0'/></cpu><cpu numaid='1'><pci busid='0000:00:1a.0'>"
                "<pci busid='0000:01:00.0'/></pci></cpu></system>")
    with pytest.raises(TopologyError, match=r"3 PCI device\(s\) without a class and no <gpu> "
                       r"element in the file \(bus ids 0000:00:16.0, 0000:00:17.0, "
                       r"0000:01:00.0\): this is a partial NCCL_TOPO_FILE"):
        from_nccl_xml(skeleton)


def test_a_nic_listed_under_each_cpu_of_its_host_is_one_nic():
    # a container's eth0 has no PCI device; NCCL's dump lists it under every CPU of the host,
    # while two hosts fused into one file each keep their own NIC of that name
    def host(hash_, numas):
        return "".join(f"<cpu host_hash='{hash_}' numaid='{k}'><pci busid='000{k}:{hash_[-1]}0:00.0' "
                       f"class='0x030200'><gpu dev='{k}' sm='90'/></pci><nic><net name='eth0' "
                       f"dev='0' speed='10000'/></nic></cpu>" for k in numas)
    G = from_nccl_xml(f"<system>{host('0xa', [0, 1])}</system>")
    assert [G.nodes[n]["name"] for n in topo.nodes_of_kind(G, "nic")] == ["eth0"]
    assert "CPU0" in G["NIC0"]
    G = from_nccl_xml(f"<system>{host('0xa', [0])}{host('0xb', [1])}</system>")
    assert [G.nodes[n]["name"] for n in topo.nodes_of_kind(G, "nic")] == ["eth0", "eth0"]


def _xgmi_per_gpu(G, g):
    return sorted((d["count"], d["bw_gbps"]) for d in G[g].values() if d["type"] == "xgmi")


def test_hgx_a100_matrix_reads_nv12_to_every_peer_as_an_nvswitch():
    G = topo.load(REAL / "hgx_a100_8gpu_4nic_nvidia-smi-topo.txt")
    assert topo.gpus(G) == [f"GPU{i}" for i in range(8)]
    assert topo.nodes_of_kind(G, "nvswitch") == ["NVS0"]
    assert not _nvlink_bundles(G.subgraph(topo.gpus(G)))  # 12 links per GPU, not 12 per pair
    for g in topo.gpus(G):
        assert G.edges[g, "NVS0"]["count"] == 12 and G.edges[g, "NVS0"]["bw_gbps"] == 300.0
    assert [G.nodes[n]["name"] for n in topo.nodes_of_kind(G, "nic")] == [f"mlx5_{i}" for i in range(4)]
    assert path_class(G, "NIC0", "NIC1") == PathClass.PIX
    assert path_class(G, "GPU0", "GPU5") == PathClass.NVB


def test_h100_container_matrix_with_nv18_and_eight_phb_nics():
    G = topo.load(REAL / "h100_4gpu_8nic_vm_nvidia-smi-topo.txt")
    assert topo.gpus(G) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert {G.edges[g, "NVS0"]["bw_gbps"] for g in topo.gpus(G)} == {450.0}
    assert len(topo.nodes_of_kind(G, "nic")) == 8 and topo.nodes_of_kind(G, "cpu") == ["CPU0"]


def test_nvlink_rows_within_a_gpu_port_count_stay_direct_links():
    # 4x A100 SXM4 boards (no NVSwitch): NV4 to each of 3 peers is 12 of the GPU's 12 links
    text = ("        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity\n"
            "GPU0     X      NV4     NV4     NV4     0-15    0\n"
            "GPU1    NV4      X      NV4     NV4     0-15    0\n"
            "GPU2    NV4     NV4      X      NV4     0-15    0\n"
            "GPU3    NV4     NV4     NV4      X      0-15    0\n")
    G = from_nvidia_smi(text)
    assert not topo.nodes_of_kind(G, "nvswitch")
    assert len(_nvlink_bundles(G)) == 6 and {c for _, c in _nvlink_bundles(G)} == {4}


def test_rtx_a6000_matrix_gives_one_bridged_pair_and_the_nics():
    G = topo.load(REAL / "rtx_a6000_3gpu_2nic_nvidia-smi-topo.txt")
    assert _nvlink_bundles(G) == {(frozenset(("GPU0", "GPU1")), 4)}
    assert [G.nodes[n]["name"] for n in topo.nodes_of_kind(G, "nic")] == ["mlx5_0", "mlx5_1"]
    assert path_class(G, "GPU0", "GPU2") == PathClass.PHB


def test_azure_ncv4_xml_gives_two_nvlink_bridge_pairs_on_four_numa_nodes():
    G = topo.load(REAL / "azure_ncv4_a100_pcie_4gpu_nccl_topo.xml")
    assert topo.gpus(G) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert _nvlink_bundles(G) == {(frozenset(("GPU0", "GPU1")), 12), (frozenset(("GPU2", "GPU3")), 12)}
    assert G.edges["GPU0", "GPU1"]["bw_gbps"] == 300.0
    assert len(topo.nodes_of_kind(G, "cpu")) == 4
    assert G.nodes["NIC0"]["name"] == "eth0" and G.has_edge("NIC0", "CPU0")  # <nic> under <cpu>


def test_nvlink_naming_the_gpus_own_bus_id_is_skipped():
    # later azhpc-images versions of the NCv4 file point every <nvlink> at the GPU itself
    swap = {"0001": "0002", "0002": "0001", "0003": "0004", "0004": "0003"}
    xml = re.sub(r'target="(\d{4}):', lambda m: f'target="{swap[m.group(1)]}:',
                 (REAL / "azure_ncv4_a100_pcie_4gpu_nccl_topo.xml").read_text())
    G = from_nccl_xml(xml)
    assert topo.gpus(G) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert not _nvlink_bundles(G) and not any(a == b for a, b in G.edges)


def test_a100_pcie_dump_with_a_dual_port_nic():
    G = topo.load(REAL / "a100_pcie_2gpu_2socket_nic_nccl_topo.xml")
    assert topo.gpus(G) == ["GPU0", "GPU1"] and not _nvlink_bundles(G)
    assert [G.nodes[n]["name"] for n in topo.nodes_of_kind(G, "nic")] == ["mlx5_0", "mlx5_1"]
    assert G.edges["NIC0", "CPU0"]["bw_gbps"] == pytest.approx(15.75)  # Gen4 x8
    assert G.edges["GPU1", "CPU1"]["bw_gbps"] == pytest.approx(31.51)
    assert path_class(G, "GPU0", "GPU1") == PathClass.SYS


def test_mi300x_dump_gives_a_full_xgmi_mesh_at_64_gbps_and_eight_nics():
    G = topo.load(REAL / "mi300x_8gpu_8nic_rccl_topo.xml")
    assert topo.gpus(G) == [f"GPU{i}" for i in range(8)]
    for g in topo.gpus(G):
        assert _xgmi_per_gpu(G, g) == [(1, 64.0)] * 7
    assert {G.nodes[n]["net_gbps"] for n in topo.nodes_of_kind(G, "nic")} == {50.0}
    assert len(topo.nodes_of_kind(G, "nic")) == 8


def test_rccl_legacy_gcn_numbers_give_each_generations_xgmi_rate():
    mi250 = topo.load(REAL / "mi250_16gcd_8nic_rccl_topo.xml")  # gcn="910" = gfx90a
    assert len(topo.gpus(mi250)) == 16 and len(topo.nodes_of_kind(mi250, "nic")) == 8
    assert _xgmi_per_gpu(mi250, "GPU0") == [(1, 50.0), (2, 100.0), (4, 200.0)]
    assert _xgmi_per_gpu(mi250, "GPU1") == [(1, 50.0), (1, 50.0), (1, 50.0), (4, 200.0)]
    mi100 = topo.load(REAL / "mi100_4gpu_xgmi_rccl_topo.xml")  # gcn="908"
    assert all(_xgmi_per_gpu(mi100, g) == [(1, 46.0)] * 3 for g in topo.gpus(mi100))
    mi300a = topo.load(REAL / "mi300a_4apu_4nic_rccl_topo.xml")  # gcn="940"
    assert all(_xgmi_per_gpu(mi300a, g) == [(1, 64.0)] * 3 for g in topo.gpus(mi300a))
    assert len(topo.nodes_of_kind(mi300a, "cpu")) == 4 and len(topo.nodes_of_kind(mi300a, "nic")) == 4


def test_mi50_pcie_only_dump_crosses_the_sockets_over_pcie():
    G = topo.load(REAL / "mi50_8gpu_pcie_2socket_rccl_topo.xml")
    assert len(topo.gpus(G)) == 8 and not any(d["type"] == "xgmi" for *_, d in G.edges(data=True))
    assert path_class(G, "GPU0", "GPU1") == PathClass.PHB
    assert path_class(G, "GPU0", "GPU4") == PathClass.SYS
    assert G.edges["CPU0", "CPU1"]["bw_gbps"] == 16.0


GRACE_TRAYS = (FIXTURES / "grace_two_trays.xml").read_text()


def test_c2c_links_each_gpu_to_its_grace_cpu_at_nccls_rate():
    G = from_nccl_xml(GRACE_TRAYS)
    c2c = {(a, b): d["bw_gbps"] for a, b, d in G.edges(data=True) if d["type"] == "c2c"}
    assert c2c == {(g, c): 223.56 for g, c in [("GPU0", "CPU0"), ("GPU1", "CPU0"),
                                               ("GPU2", "CPU1"), ("GPU3", "CPU1")]
                   for g, c in [(g, c), (c, g)]}
    assert path_class(G, "GPU0", "CPU0") == PathClass.C2C
    assert {G.nodes[g]["mem_bw_gbps"] for g in topo.gpus(G)} == {4000.0}


def test_sockets_of_different_hosts_in_one_dump_are_not_joined():
    G = from_nccl_xml(GRACE_TRAYS)
    assert not G.has_edge("CPU0", "CPU1")   # two trays: their memories are apart
    one_host = GRACE_TRAYS.replace("0xbbbb", "0xaaaa")
    assert from_nccl_xml(one_host).edges["CPU0", "CPU1"]["type"] == "smp"


@pytest.mark.parametrize("c2c", ["<c2c bw='fast' count='5'/>", "<c2c bw='44712' count='0'/>",
                                 "<c2c count='5'/>"])
def test_bad_c2c_is_a_topology_error(c2c):
    xml = GRACE_TRAYS.replace("<c2c bw='44712' count='5'/>", c2c)
    with pytest.raises(TopologyError, match=r"<c2c bw=.*of GPU0; expected"):
        from_nccl_xml(xml)
