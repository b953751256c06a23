"""amd-smi topology tables and --json: which pairs are joined by xGMI, at what rate, bad input."""

import json
import re

import pytest

import collectx.topology as topo
from collectx.errors import TopologyError
from collectx.topology.amdsmi import from_amd_smi
from collectx.topology.jsonio import parse_text

# Four GCDs of two MI250X packages as the driver weighs them (15 a direct xGMI hop, 30 two
# hops; every pair says hop 1 and XGMI all the same), with the tables amd-smi prints between
# the ones read and the legend after them.
BUSIDS = ["0000:c1:00.0", "0000:c6:00.0", "0000:c9:00.0", "0000:ce:00.0"]


HEADER = " " * 13 + " ".join(f"{b:<12}" for b in BUSIDS)


def _table(title: str, rows: list[str]) -> str:
    return "\n".join([f"{title} TABLE:", HEADER] +
                     [(f"{b} " + " ".join(f"{c:<12}" for c in row.split())).rstrip()
                      for b, row in zip(BUSIDS, rows)]) + "\n"


WEIGHTS = ["0 15 15 30", "15 0 30 15", "15 30 0 15", "30 15 15 0"]
TYPES = ["SELF XGMI XGMI XGMI", "XGMI SELF XGMI XGMI", "XGMI XGMI SELF XGMI",
         "XGMI XGMI XGMI SELF"]
BW = ["N/A 50000-100000 50000-100000 0-0", "50000-100000 N/A 0-0 50000-50000",
      "50000-100000 0-0 N/A 50000-50000", "0-0 50000-50000 50000-50000 N/A"]
FOUR = (_table("ACCESS", ["ENABLED " * 4] * 4) + _table("WEIGHT", WEIGHTS) +
        _table("HOPS", ["0 1 1 1", "1 0 1 1", "1 1 0 1", "1 1 1 0"]) +
        _table("LINK TYPE", TYPES) + _table("NUMA BW", BW) +
        _table("CACHE COHERANCY", ["SELF C C C", "C SELF C C", "C C SELF C", "C C C SELF"]) +
        "\n\nLegend:\n  SELF = Current GPU\n  <BW from>-<BW to>\n")


def _xgmi(G):
    return {(a, b): bw for a, b, bw in sorted(G.edges(data="bw_gbps"))
            if G.edges[a, b]["type"] == "xgmi" and a < b}


def test_the_least_weighed_xgmi_pairs_are_joined_at_the_tables_bandwidth():
    G = from_amd_smi(FOUR)
    assert _xgmi(G) == {("GPU0", "GPU1"): 100.0, ("GPU0", "GPU2"): 100.0,
                        ("GPU1", "GPU3"): 50.0, ("GPU2", "GPU3"): 50.0}
    assert [G.nodes[g]["busid"] for g in topo.gpus(G)] == BUSIDS
    assert sorted(G.successors("CPU0")) == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert G.edges["GPU0", "CPU0"]["type"] == "pcie"


def test_a_pair_without_bandwidth_takes_xgmi_bw():
    no_bw = re.sub(r"\d+-\d+", "0-0", FOUR)
    assert set(_xgmi(from_amd_smi(no_bw)).values()) == {50.0}
    assert set(_xgmi(from_amd_smi(no_bw, xgmi_bw=64.0)).values()) == {64.0}


def test_without_bandwidths_all_weights_zero_join_every_xgmi_pair():
    # an 8-GPU MI355X's amd-smi gives weight 0 and bandwidth 0-0 to every pair: a full mesh
    flat = re.sub(r"\d+-\d+", "0-0", FOUR).replace(_table("WEIGHT", WEIGHTS),
                                                    _table("WEIGHT", ["0 0 0 0"] * 4))
    assert len(_xgmi(from_amd_smi(flat))) == 6


def test_bandwidths_decide_which_pairs_are_joined_where_weights_do_not():
    # the driver gives a bandwidth to direct pairs only, whatever the weights say
    even = FOUR.replace(_table("WEIGHT", WEIGHTS), _table("WEIGHT", ["0 15 15 15"] * 4))
    assert _xgmi(from_amd_smi(even)) == _xgmi(from_amd_smi(FOUR))


def test_hop_counts_put_gpus_under_the_cpus_they_share():
    # PCIe only: 2 hops under one CPU, 3 across CPUs
    types = ["SELF PCIE PCIE PCIE", "PCIE SELF PCIE PCIE", "PCIE PCIE SELF PCIE",
             "PCIE PCIE PCIE SELF"]
    hops = ["0 3 2 3", "3 0 3 2", "2 3 0 3", "3 2 3 0"]
    text = _table("HOPS", hops) + _table("LINK TYPE", types)
    G = from_amd_smi(text)
    assert sorted(G.successors("CPU0")) == ["CPU1", "GPU0", "GPU2"]
    assert sorted(G.successors("CPU1")) == ["CPU0", "GPU1", "GPU3"]
    assert "numa" not in G.nodes["CPU1"]   # which GPUs share a CPU, not the NUMA node's number
    assert sorted(from_amd_smi(text.replace("3", "2")).successors("CPU0")) == [
        "GPU0", "GPU1", "GPU2", "GPU3"]
    # hops that contradict each other (GPU1 two hops from GPU0 and GPU2, which are three
    # apart) say nothing: one CPU
    muddled = _table("HOPS", ["0 2 3 3", "2 0 2 3", "3 2 0 3", "3 3 3 0"])
    assert len(list(from_amd_smi(muddled + _table("LINK TYPE", types)).successors("CPU0"))) == 4


def test_gpus_joined_by_xgmi_share_a_cpu_where_hops_part_the_hives():
    types = ["SELF XGMI PCIE PCIE", "XGMI SELF PCIE PCIE", "PCIE PCIE SELF XGMI",
             "PCIE PCIE XGMI SELF"]
    hops = ["0 1 3 3", "1 0 3 3", "3 3 0 1", "3 3 1 0"]
    G = from_amd_smi(_table("HOPS", hops) + _table("LINK TYPE", types))
    assert sorted(G.successors("CPU0")) == ["CPU1", "GPU0", "GPU1"]
    assert list(_xgmi(G)) == [("GPU0", "GPU1"), ("GPU2", "GPU3")]


def test_pcie_pairs_meet_at_the_cpu():
    types = ["SELF XGMI PCIE PCIE", "XGMI SELF PCIE PCIE", "PCIE PCIE SELF N/A",
             "PCIE PCIE N/A SELF"]
    G = from_amd_smi(FOUR.replace(_table("LINK TYPE", TYPES), _table("LINK TYPE", types)))
    assert list(_xgmi(G)) == [("GPU0", "GPU1")]


def test_loads_through_topology_load_and_ignores_what_surrounds_it(tmp_path):
    path = tmp_path / "amd-smi.txt"
    path.write_text("$ amd-smi topology\n```\n" + FOUR + "```\n$ amd-smi static\nGPU: 0\n")
    G = topo.load(path)
    assert G.graph["name"] == "amd_smi" and _xgmi(G) == _xgmi(from_amd_smi(FOUR))


def _as_json() -> str:
    """FOUR's tables as ``amd-smi topology --json`` writes them."""
    types, weights, bw = ([r.split() for r in rows] for rows in (TYPES, WEIGHTS, BW))
    return json.dumps([{"gpu": a, "bdf": BUSIDS[a], "links": [
        {"gpu": b, "bdf": BUSIDS[b], "weight": int(weights[a][b]), "link_status": "ENABLED",
         "link_type": types[a][b], "num_hops": 1, "bandwidth": bw[a][b]}
        for b in range(len(BUSIDS))]} for a in range(len(BUSIDS))], indent=4)


def test_the_json_output_reads_as_the_tables_do():
    G = parse_text(_as_json())
    assert G.graph["name"] == "amd_smi" and _xgmi(G) == _xgmi(from_amd_smi(FOUR))
    assert [G.nodes[g]["busid"] for g in topo.gpus(G)] == BUSIDS


def test_the_json_of_amd_smi_before_rocm_6_1_1_reads_as_well():
    # one dict per table, keyed gpu_N, and no bus ids
    types, weights, bw = ([r.split() for r in rows] for rows in (TYPES, WEIGHTS, BW))
    old = json.dumps([{"gpu": a, "link_type": {f"gpu_{b}": types[a][b] for b in range(4)},
                       "weight": {f"gpu_{b}": int(weights[a][b]) for b in range(4)},
                       "numa_bandwidth": {f"gpu_{b}": bw[a][b] for b in range(4)}}
                      for a in range(4)])
    G = parse_text(old)
    assert _xgmi(G) == _xgmi(from_amd_smi(FOUR)) and "busid" not in G.nodes["GPU0"]


@pytest.mark.parametrize("broken, message", [
    (lambda t: t.replace("LINK TYPE TABLE:", "LINK KIND TABLE:"), "no 'LINK TYPE TABLE:'"),
    (lambda t: t.replace("XGMI         SELF         XGMI         XGMI",
                         "XGMI         SELF         XGMI"), "row 0000:c6:00.0 has 3 cells"),
    (lambda t: t.replace("XGMI         XGMI         XGMI         SELF",
                         "XGMI         XGMI         NVLINK       SELF"),
     "cell 0000:ce:00.0/0000:c9:00.0 is 'NVLINK'; expected SELF or XGMI"),
    (lambda t: t.replace("15           0            30", "15           0            x"),
     "cell 0000:c6:00.0/0000:c9:00.0 is 'x'; expected a whole number or N/A"),
    (lambda t: t.replace("50000-50000  N/A", "fast         N/A"),
     "is 'fast'; expected MIN-MAX"),
    (lambda t: t.replace("0000:ce:00.0 XGMI         XGMI         XGMI         SELF\n", ""),
     "the LINK TYPE table has no row for 0000:ce:00.0"),
    (lambda t: t.replace("0000:c6:00.0 XGMI         SELF", "0000:c1:00.0 XGMI         SELF"),
     "second row for 0000:c1:00.0"),
    (lambda t: t.replace("LINK TYPE TABLE:\n" + " " * 13 + "0000:c1:00.0 0000:c6:00.0",
                         "LINK TYPE TABLE:\n" + " " * 13 + "0000:c6:00.0 0000:c1:00.0"),
     "expected the GPUs of the first table"),
    (lambda t: t.replace("LINK TYPE TABLE:\n" + HEADER + "\n", "LINK TYPE TABLE:\n"),
     "a row before the table's header"),
])
def test_broken_tables_are_refused_with_the_line(broken, message):
    with pytest.raises(TopologyError, match=message):
        from_amd_smi(broken(FOUR))


@pytest.mark.parametrize("text, message", [
    ('[{"gpu": 0, "bdf": "0000:c1:00.0", "links": [{"gpu": 3, "link_type": "XGMI"}]}]',
     "KeyError"),
    ('[{"gpu": 0, "bdf": "0000:c1:00.0"}]', "expected a list of GPUs"),
    ('[{"gpu": 0, "links": [{"gpu": 0, "link_type": "SELF", "bandwidth": "wide"}]}]',
     "GPU 0's bandwidth of GPU 0 is 'wide'; expected MIN-MAX"),
    ('[{"gpu": 0, "link_type": {"gpu_0": "SELF"}, "hops": {"gpu_0": "far"}}]',
     "GPU 0's hops of GPU 0 is 'far'; expected a whole number"),
])
def test_broken_json_is_refused(text, message):
    with pytest.raises(TopologyError, match=message):
        from_amd_smi(text)
