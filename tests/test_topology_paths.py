"""Path classes and widest-path bandwidths."""

import pytest

import collectx.topology as topo
from collectx.errors import TopologyError
from collectx.topology.paths import PathClass, classify, path_class, paths, widest_path

from _dumps import REAL


def test_path_classes_are_ordered_lower_is_better():
    order = [PathClass.LOC, PathClass.NVL, PathClass.NVB, PathClass.C2C, PathClass.PIX,
             PathClass.PXB, PathClass.PXN, PathClass.PHB, PathClass.SYS, PathClass.NET]
    assert sorted(order) == order


def test_a_nic_reaching_a_gpu_through_another_gpus_nvlinks_is_pxn():
    G = topo.load(REAL / "hgx_h100_nccl_topo.xml")
    assert path_class(G, "NIC7", "GPU0") == PathClass.PIX   # below the same PCIe switch
    p = widest_path(G, "NIC7", "GPU5")
    assert p.cls == PathClass.PXN and "GPU0" in p.hops[1:-1]


def test_dgx1v_direct_double_nvlink_is_nvl_50():
    p = widest_path(topo.load("dgx1v"), "GPU0", "GPU3")
    assert (p.cls, p.bw_gbps, p.hops) == (PathClass.NVL, 50.0, ("GPU0", "GPU3"))


def test_dgx1v_gpu0_to_gpu5_is_not_nvl_and_relays_over_nvlink():
    G = topo.load("dgx1v")
    p = widest_path(G, "GPU0", "GPU5")
    assert p.cls == PathClass.NVB
    assert p.bw_gbps == 50.0  # GPU0-GPU3-GPU2-GPU1-GPU5 are all double links
    assert all(G.edges[a, b]["type"] == "nvlink" for a, b in zip(p.hops, p.hops[1:]))


def test_widest_path_prefers_bandwidth_then_fewer_hops():
    G = topo.line(4, bw=25.0)
    topo.add_link(G, "GPU0", "GPU3", "pcie", 10.0)
    assert widest_path(G, "GPU0", "GPU3").hops == ("GPU0", "GPU1", "GPU2", "GPU3")
    G2 = topo.ring(6)
    assert len(widest_path(G2, "GPU0", "GPU2").hops) == 3  # not the long way round


def test_pcie_only_classes_on_a_pcie_box():
    G = topo.load("pcie_gen4_8gpu")
    P = paths(G)
    assert P["GPU0", "GPU1"].cls == PathClass.PIX and P["GPU0", "GPU1"].bw_gbps == 31.5
    assert P["GPU0", "GPU2"].cls == PathClass.PHB
    assert P["GPU0", "GPU4"].cls == PathClass.SYS  # the AMD sockets' xGMI link is SYS
    assert P["GPU0", "GPU4"].bw_gbps == G.edges["CPU0", "CPU1"]["bw_gbps"]


def test_cross_socket_pcie_is_sys_with_the_smp_bottleneck():
    G = topo.subset(topo.load("dgx1v"), [0, 1, 2, 3, 4, 5])
    # without NVLink between GPU0 and GPU6/7's side, a PCIe route crosses the sockets
    H = G.copy()
    H.remove_edges_from([(a, b) for a, b, d in G.edges(data=True) if d["type"] == "nvlink"])
    p = widest_path(H, "GPU0", "GPU5")
    assert p.cls == PathClass.SYS and p.bw_gbps == 6.0
    assert path_class(H, "GPU0", "GPU1") == PathClass.PIX


def test_nvswitch_paths_are_nvb_at_the_gpu_bandwidth():
    P = paths(topo.load("dgx_a100"))
    assert {(p.cls, p.bw_gbps) for p in P.values()} == {(PathClass.NVB, 50.0)}
    assert len(P) == 56


def test_pcie_never_relays_through_a_gpu():
    G = topo.line(3)
    topo.add_node(G, "CPU0", "cpu")
    topo.add_link(G, "GPU0", "CPU0", "pcie", 100.0)
    topo.add_link(G, "GPU1", "CPU0", "pcie", 100.0)
    topo.add_link(G, "GPU2", "CPU0", "pcie", 1.0)
    # GPU0 -> CPU0 -> GPU1 -> GPU2 would mix PCIe into an NVLink relay: not allowed
    p = widest_path(G, "GPU0", "GPU2")
    assert p.hops == ("GPU0", "GPU1", "GPU2") and p.bw_gbps == 25.0


def test_multi_node_paths_cross_the_network_via_the_rail_nic():
    G = topo.multi_node(topo.switch(4, bw=100.0), 2, nic_bw=50.0)
    p = widest_path(G, "n0/GPU0", "n1/GPU3")
    assert p.cls == PathClass.NET and p.bw_gbps == 50.0
    assert "RAIL0" in p.hops or "RAIL3" in p.hops
    assert len(paths(G)) == 8 * 7


def test_host_ranks_share_memory_within_a_numa_node():
    G = topo.host(4, numa_nodes=2)
    assert path_class(G, "RANK0", "RANK2") == PathClass.PHB
    assert path_class(G, "RANK0", "RANK1") == PathClass.SYS


def test_classify_and_loc():
    G = topo.load("dgx1v")
    assert classify(G, ("GPU0",)) == PathClass.LOC
    assert path_class(G, "GPU2", "GPU2") == PathClass.LOC
    assert classify(G, ("GPU0", "PLX0", "GPU1")) == PathClass.PIX


def test_unreachable_and_unknown_nodes():
    G = topo.new_graph("split")
    topo.add_node(G, "GPU0", "gpu")
    topo.add_node(G, "GPU1", "gpu")
    assert paths(G) == {}
    with pytest.raises(TopologyError, match="no route from GPU0 to GPU1"):
        widest_path(G, "GPU0", "GPU1")
    with pytest.raises(TopologyError, match="'GPU7' is not a node"):
        path_class(G, "GPU0", "GPU7")


def test_pxn_a_gpu_reaches_another_rail_nic_through_its_nvlink_peer():
    G = topo.multi_node("dgx1v", 2, nic_bw=12.5)
    p = widest_path(G, "n0/GPU0", "n1/GPU5")
    assert p.cls == PathClass.NET and p.bw_gbps == 12.5  # not the 6 GB/s socket link
    relays = [h for h in p.hops[1:-1] if G.nodes[h]["kind"] == "gpu"]
    assert relays and all(G.nodes[h]["kind"] != "cpu" for h in p.hops)


def test_pxn_leg_never_reaches_a_cpu():
    G = topo.multi_node("dgx1v", 2, nic_bw=12.5)
    for path in paths(G).values():
        for i, hop in enumerate(path.hops[1:-1], start=1):
            if G.nodes[hop]["kind"] == "gpu" and G.edges[hop, path.hops[i + 1]]["type"] == "pcie":
                rest = path.hops[i + 1:]
                nic = next(j for j, h in enumerate(rest) if G.nodes[h]["kind"] == "nic")
                assert all(G.nodes[h]["kind"] == "pci_switch" for h in rest[:nic])


def _brute_force_widest(G, a, b):
    import networkx as nx
    best = (0.0, 0)
    for route in nx.all_simple_paths(G, a, b):
        width = min(G.edges[u, v]["bw_gbps"] for u, v in zip(route, route[1:]))
        best = max(best, (width, -len(route)))
    return best[0], -best[1]


def test_widest_path_matches_brute_force_on_random_nvlink_meshes():
    import random
    rng = random.Random(7)
    for trial in range(25):
        n = rng.randint(3, 6)
        G = topo.new_graph(f"random{trial}")
        for i in range(n):
            topo.add_node(G, f"GPU{i}", "gpu")
        for i in range(n):
            for j in range(i + 1, n):
                if rng.random() < 0.6:
                    topo.add_link(G, f"GPU{i}", f"GPU{j}", "nvlink", 25.0 * rng.randint(1, 4))
        P = paths(G)
        for a in topo.gpus(G):
            for b in topo.gpus(G):
                if a == b:
                    continue
                width, hops = _brute_force_widest(G, a, b)
                if width == 0.0:
                    assert (a, b) not in P
                    continue
                p = P[a, b]
                assert (p.bw_gbps, len(p.hops)) == (width, hops), (trial, a, b)
                assert all(G.has_edge(u, v) for u, v in zip(p.hops, p.hops[1:]))


@pytest.mark.parametrize("name", ["dgx1v", "dgx2", "pcie_gen4_8gpu", "mi250_16gcd"])
def test_one_search_from_a_gpu_routes_every_target_as_one_search_each(name):
    # The ring search asks for all of a GPU's hops at once, in residual widths and relaying
    # through no other GPU: each route must be the one a search for that target alone gives.
    import random
    from collectx.topology.paths import Router
    G = topo.load(name)
    rng, ids, router = random.Random(3), topo.gpus(G), Router(G)
    for a in ids[:4]:
        widths = {(u, v): rng.choice([0.0, 5.0, bw or 0.0])
                  for u, v, bw in G.edges(data="bw_gbps")}
        avoid = frozenset(ids) - {a}
        found = router.widest_from(a, ids, widths=widths, avoid=avoid)
        for b in ids:
            try:
                alone = router.widest(a, b, widths=widths, avoid=avoid - {b})
            except TopologyError:
                assert b not in found or b == a
                continue
            if b != a:
                assert found[b] == alone, (a, b)
