"""rocm-smi --showtopo tables: which pairs are joined by xGMI, NUMA nodes, and bad input."""

import json

import pytest

import collectx.topology as topo
from collectx.errors import TopologyError
from collectx.topology.rocmsmi import from_rocm_smi

from _dumps import REAL

# Four GCDs of two MI250X packages as the driver weighs them: 15 a direct xGMI hop, 30 two
# hops; every pair says hop 1 and XGMI all the same (the hop table does not count links).
FOUR = """
======================= ROCm System Management Interface =======================
=========================== Weight between two GPUs ============================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            15           15           30
GPU1   15           0            30           15
GPU2   15           30           0            15
GPU3   30           15           15           0

============================ Hops between two GPUs =============================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            1            1            1
GPU1   1            0            1            1
GPU2   1            1            0            1
GPU3   1            1            1            0

========================== Link Type between two GPUs ==========================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            XGMI         XGMI         XGMI
GPU1   XGMI         0            XGMI         XGMI
GPU2   XGMI         XGMI         0            XGMI
GPU3   XGMI         XGMI         XGMI         0

================================== Numa Nodes ==================================
GPU[0]          : (Topology) Numa Node: 0
GPU[0]          : (Topology) Numa Affinity: 0
GPU[1]          : (Topology) Numa Node: 0
GPU[1]          : (Topology) Numa Affinity: 0
GPU[2]          : (Topology) Numa Node: 1
GPU[2]          : (Topology) Numa Affinity: 1
GPU[3]          : (Topology) Numa Node: 1
GPU[3]          : (Topology) Numa Affinity: 1
============================= End of ROCm SMI Log ==============================
"""


HEADER = "       GPU0         GPU1         GPU2         GPU3\n"


def _xgmi(G):
    return sorted((a, b) for a, b, t in G.edges(data="type") if t == "xgmi" and a < b)


def test_only_the_least_weighed_xgmi_pairs_are_joined_directly():
    G = from_rocm_smi(FOUR)
    assert _xgmi(G) == [("GPU0", "GPU1"), ("GPU0", "GPU2"), ("GPU1", "GPU3"), ("GPU2", "GPU3")]
    assert {g: G.nodes[g]["numa"] for g in topo.gpus(G)} == {"GPU0": 0, "GPU1": 0, "GPU2": 1,
                                                             "GPU3": 1}
    assert sorted(G.successors("CPU0")) == ["CPU1", "GPU0", "GPU1"]
    assert G.edges["GPU0", "GPU1"]["bw_gbps"] == 50.0
    assert from_rocm_smi(FOUR, xgmi_bw=64.0).edges["GPU0", "GPU1"]["bw_gbps"] == 64.0


def test_pcie_pairs_and_missing_tables_read_as_the_tables_say():
    # no weights: every XGMI pair is direct; PCIE pairs meet at the CPU; no NUMA lines: one CPU
    text = FOUR.split("=== Link Type")[0].split("=== Weight")[0] + \
        "=== Link Type between two GPUs ===\n" + \
        "\n".join(["      GPU0  GPU1  GPU2", "GPU0  0     XGMI  PCIE", "GPU1  XGMI  0     PCIE",
                   "GPU2  PCIE  PCIE  0"])
    G = from_rocm_smi(text)
    assert _xgmi(G) == [("GPU0", "GPU1")]
    assert sorted(G.successors("CPU0")) == ["GPU0", "GPU1", "GPU2"]


def test_lines_that_are_not_the_tables_rows_are_passed_over():
    warning = "WARNING: GPU1 in low power state\n"
    noisy = FOUR.replace("GPU1   XGMI         0", warning + "GPU1   XGMI   0")
    assert _xgmi(from_rocm_smi(noisy)) == _xgmi(from_rocm_smi(FOUR))


def test_the_real_tables_load_through_topology_load():
    for name in ("mi300a_4apu_xgmi_4numa_mzank_rocm-smi-topo.txt",
                 "mi210_4gpu_xgmi_4numa_archer2_rocm-smi-topo.txt"):
        G = topo.load(REAL / name)
        assert len(_xgmi(G)) == 6
        assert sorted(G.nodes[g]["numa"] for g in topo.gpus(G)) == [0, 1, 2, 3]


def test_cells_the_driver_could_not_read_are_unknown_not_refused():
    # rocm-smi prints XXXX for a type and None for a weight it could not read
    text = FOUR.replace("GPU3   XGMI         XGMI         XGMI         0",
                        "GPU3   XGMI         XGMI         XXXX         0").replace(
        "GPU2   15           30           0            15",
        "GPU2   15           30           0            None")
    G = from_rocm_smi(text)
    assert _xgmi(G) == [("GPU0", "GPU1"), ("GPU0", "GPU2"), ("GPU1", "GPU3"), ("GPU2", "GPU3")]


def _as_json(text: str) -> str:
    """``rocm-smi --showtopo --json`` of ``text``'s tables (upper triangle, as it writes)."""
    rows = {name: [line.split()[1:] for line in text.split(title)[1].splitlines()[2:6]]
            for name, title in (("Weight", "Weight between two GPUs"),
                                ("Link type", "Link Type between two GPUs"))}
    system = {f"(Topology) {name} between DRM devices {a} and {b}": cells[a][b]
              for name, cells in rows.items() for a in range(4) for b in range(a + 1, 4)}
    cards = {f"card{g}": {"(Topology) Numa Node": str(g // 2),
                          "(Topology) Numa Affinity": str(g // 2)} for g in range(4)}
    return json.dumps(dict(cards, system=system), indent=4)


def test_the_json_output_reads_as_the_tables_do():
    G = topo.parse_text(_as_json(FOUR))
    assert G.graph["name"] == "rocm_smi" and _xgmi(G) == _xgmi(from_rocm_smi(FOUR))
    assert sorted(G.successors("CPU1")) == ["CPU0", "GPU2", "GPU3"]


@pytest.mark.parametrize("text, message", [
    ('{"system": {"(Topology) Link type between DRM devices 0 and 1": "NVLINK"}}',
     "'NVLINK'; expected XGMI or PCIE or XXXX"),
    ('{"system": {"(Topology) Weight between DRM devices 0 and 1": "far", '
     '"(Topology) Link type between DRM devices 0 and 1": "XGMI"}}', "'far'; expected a whole"),
    ('{"card0": {"(Topology) Numa Node": "x"}, '
     '"system": {"(Topology) Link type between DRM devices 0 and 1": "XGMI"}}', "ValueError"),
    ('{"card0": {}, "system": []}', "expected a 'system' dict"),
])
def test_broken_json_is_refused(text, message):
    with pytest.raises(TopologyError, match=message):
        from_rocm_smi(text)


@pytest.mark.parametrize("broken, message", [
    (lambda t: t.replace("Link Type between two GPUs", "Link Kind"), "no 'Link Type between"),
    (lambda t: t.replace("GPU2   XGMI         XGMI         0            XGMI", "GPU2   XGMI"),
     "line 21: row GPU2 has 1 cells; expected 4"),
    (lambda t: t.replace("GPU3   XGMI         XGMI         XGMI         0",
                         "GPU3   XGMI         XGMI         NVLINK       0"),
     "cell GPU3/GPU2 is 'NVLINK'; expected XGMI or PCIE or XXXX"),
    (lambda t: t.replace("GPU1   15           0            30           15",
                         "GPU1   15           0            x            15"),
     "cell GPU1/GPU2 is 'x'; expected a whole number"),
    (lambda t: t.replace("GPU3   XGMI         XGMI         XGMI         0\n", ""),
     "table has no row for GPU3"),
    (lambda t: t.replace("GPU1   XGMI         0", "GPU0   XGMI         0"),
     "second row for GPU0"),
    (lambda t: t.replace(HEADER + "GPU0   0            X", HEADER.replace("GPU2 ", "CARD2") +
                         "GPU0   0            X"), "no 'Link Type between"),
])
def test_broken_tables_are_refused_with_the_line(broken, message):
    with pytest.raises(TopologyError, match=message):
        from_rocm_smi(broken(FOUR))
