"""Topology model, JSON round trip, presets, generators and subsets."""

import json

import networkx as nx
import numpy as np
import pytest

import collectx.topology as topo
from collectx.errors import TopologyError


@pytest.mark.parametrize("name", topo.presets())
def test_every_preset_round_trips_to_the_same_dict(name):
    on_disk = json.loads(topo.preset_path(name).read_text())
    G = topo.load(name)
    assert topo.to_json(G) == on_disk
    assert topo.to_json(topo.from_json(json.dumps(on_disk))) == on_disk


@pytest.mark.parametrize("name", topo.presets())
def test_every_link_becomes_two_directed_edges(name):
    on_disk = json.loads(topo.preset_path(name).read_text())
    G = topo.load(name)
    assert G.number_of_edges() == 2 * len(on_disk["links"])
    for link in on_disk["links"]:
        ab, ba = G.edges[link["a"], link["b"]], G.edges[link["b"], link["a"]]
        assert ab == ba
        assert ab["bw_gbps"] == link["bw_gbps"] and ab["count"] == link["count"]
        assert ab["latency_us"] == topo.DEFAULT_LATENCY_US[link["type"]]
    assert G.graph["bw_convention"] == "line_rate"


def test_presets_include_the_catalogue():
    assert {"dgx1v", "dgx1p", "dgx2", "dgx_a100", "dgx_h100", "mi300x"} <= set(topo.presets())


def test_unknown_preset_lists_known_ones():
    with pytest.raises(TopologyError, match="known presets: .*dgx1v"):
        topo.load("dgx9000")


def test_load_returns_a_graph_as_is():
    G = topo.ring(4)
    assert topo.load(G) is G


def test_gpus_are_in_natural_order():
    G = topo.load("dgx2")
    assert topo.gpus(G)[:3] == ["GPU0", "GPU1", "GPU2"]
    assert topo.gpus(G).index("GPU10") == 10
    assert topo.gpu_index(G)["GPU15"] == 15


def test_subset_keeps_relays_and_drops_other_gpus():
    G = topo.load("dgx1v")
    S = topo.subset(G, [0, 1, "GPU5"])
    assert topo.gpus(S) == ["GPU0", "GPU1", "GPU5"]
    assert {"PLX0", "PLX3", "CPU0", "CPU1", "NIC2"} <= set(S)
    assert not S.has_node("GPU4")
    assert topo.gpus(G) == [f"GPU{i}" for i in range(8)]  # input untouched


@pytest.mark.parametrize("bad, message", [
    ([0, 0], "listed twice"),
    ([0, "GPU0"], "listed twice"),
    ([8], "out of range.*8 GPUs"),
    (["GPU9"], "not in"),
    ([1.5], "expected an index"),
])
def test_subset_rejects_bad_gpu_lists(bad, message):
    with pytest.raises(TopologyError, match=message):
        topo.subset(topo.load("dgx1v"), bad)


def test_subset_then_to_json_writes_only_surviving_links():
    S = topo.subset(topo.load("dgx1v"), [0, 3])
    doc = topo.to_json(S)
    ends = {(link["a"], link["b"]) for link in doc["links"]}
    assert ("GPU0", "GPU3") in ends and ("GPU0", "GPU1") not in ends
    assert topo.to_json(topo.from_json(doc)) == doc


def test_json_errors_name_the_problem():
    with pytest.raises(TopologyError, match="schema"):
        topo.from_json({"schema": "other/2", "nodes": [], "links": []})
    with pytest.raises(TopologyError, match="line 1"):
        topo.from_json("{nope")
    doc = {"schema": topo.SCHEMA, "nodes": [{"id": "GPU0", "kind": "gpu"}],
           "links": [{"a": "GPU0", "b": "GPU7", "type": "nvlink", "bw_gbps": 25}]}
    with pytest.raises(TopologyError, match="'GPU7'"):
        topo.from_json(doc)
    doc["nodes"].append({"id": "GPU7", "kind": "tpu"})
    with pytest.raises(TopologyError, match="kind 'tpu'"):
        topo.from_json(doc)


def test_directed_links_and_custom_latency_round_trip():
    doc = {"schema": topo.SCHEMA, "name": "odd", "description": "", "units": dict(topo.model.UNITS),
           "nodes": [{"id": "GPU0", "kind": "gpu", "busid": "0000:01:00.0"},
                     {"id": "GPU1", "kind": "gpu"}],
           "links": [{"a": "GPU0", "b": "GPU1", "type": "pcie", "count": 1, "bw_gbps": 10.0,
                      "directed": True},
                     {"a": "GPU1", "b": "GPU0", "type": "pcie", "count": 1, "bw_gbps": 5.0,
                      "latency_us": 3.0, "directed": True}]}
    G = topo.from_json(doc)
    assert G.edges["GPU1", "GPU0"]["bw_gbps"] == 5.0 and G.edges["GPU0", "GPU1"]["bw_gbps"] == 10.0
    assert topo.to_json(G) == doc


@pytest.mark.parametrize("make, n, degree", [
    (topo.ring, 5, 2), (topo.line, 5, 1), (topo.fully_connected, 5, 4), (topo.switch, 5, 1),
])
def test_generators_shape(make, n, degree):
    G = make(n, bw=40.0)
    assert topo.gpus(G) == [f"GPU{i}" for i in range(n)]
    assert G.out_degree("GPU0") == degree
    assert all(d["bw_gbps"] == 40.0 and d["type"] == "nvlink" for *_, d in G.edges(data=True))
    assert nx.is_strongly_connected(G)


def test_generator_rejects_bad_sizes():
    with pytest.raises(TopologyError, match=">= 1"):
        topo.ring(0)
    for bad in (True, 4.0, "4"):
        with pytest.raises(TopologyError, match="expected an integer"):
            topo.ring(bad)
    assert topo.gpus(topo.ring(np.int64(3))) == ["GPU0", "GPU1", "GPU2"]


def test_multi_node_with_rails_joins_nic_i_to_rail_i():
    G = topo.multi_node("dgx1v", 3, nic_bw=12.5)
    assert len(topo.gpus(G)) == 24
    assert topo.gpus(G)[8] == "n1/GPU0"
    assert sorted(G.predecessors("RAIL2")) == ["n0/NIC2", "n1/NIC2", "n2/NIC2"]
    assert G.edges["n1/NIC2", "RAIL2"] == {"type": "net", "bw_gbps": 12.5, "count": 1,
                                          "latency_us": 2.0}
    assert G.edges["n2/GPU0", "n2/GPU3"]["bw_gbps"] == 50.0
    assert topo.to_json(topo.from_json(topo.to_json(G))) == topo.to_json(G)


def test_multi_node_adds_one_nic_per_gpu_when_the_node_has_none():
    G = topo.multi_node(topo.switch(4), 12, nic_bw=50.0, rails=False)
    assert topo.gpus(G)[4:6] == ["n1/GPU0", "n1/GPU1"]
    assert topo.gpus(G)[-1] == "n11/GPU3"
    assert G.edges["n0/GPU2", "n0/NIC2"]["type"] == "pcie"
    assert G.in_degree("NETSW") == 48
    assert nx.is_strongly_connected(G)


def test_host_spreads_ranks_round_robin_over_numa_nodes():
    G = topo.host(6, numa_nodes=2, shm_bw=8.0)
    assert topo.gpus(G) == [f"RANK{i}" for i in range(6)]
    assert all(G.nodes[r]["device"] == "cpu" for r in topo.gpus(G))
    assert G.edges["RANK3", "CPU1"] == {"type": "shm", "bw_gbps": 8.0, "count": 1,
                                        "latency_us": 0.3}
    assert G.edges["CPU0", "CPU1"]["type"] == "smp"
    assert G.nodes["CPU0"]["kind"] == "cpu"


def test_to_json_of_a_plain_networkx_graph():
    G = nx.DiGraph(name="handmade")
    G.add_node("GPU0", kind="gpu")
    G.add_node("GPU1", kind="gpu")
    G.add_edge("GPU0", "GPU1", type="nvlink", bw_gbps=25.0)
    G.add_edge("GPU1", "GPU0", type="nvlink", bw_gbps=25.0)
    doc = topo.to_json(G)
    assert doc["links"] == [{"a": "GPU0", "b": "GPU1", "type": "nvlink", "count": 1,
                             "bw_gbps": 25.0}]
    G.add_node("X")
    with pytest.raises(TopologyError, match="'X' has no 'kind'"):
        topo.to_json(G)
    G.nodes["X"]["kind"] = "cpu"
    G.add_edge("X", "GPU0")
    with pytest.raises(TopologyError, match="X->GPU0 lacks"):
        topo.to_json(G)


def test_write_json_then_load_sniffs_json(tmp_path):
    path = tmp_path / "t.json"
    topo.write_json(topo.load("mi250_16gcd"), path)
    assert topo.to_json(topo.load(path)) == topo.to_json(topo.load("mi250_16gcd"))
    assert topo.gpus(topo.load(str(path)))[:2] == ["GCD0", "GCD1"]
