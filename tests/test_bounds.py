"""Bounds: preset numbers, brute force on small graphs, the line-of-3 example, DGX-1 allocations."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest

import collectx.topology as topo
from collectx.errors import ArgumentError, TopologyError
from collectx.planner.bounds import Bounds, bounds
from collectx.topology.flows import cut_rate, max_flows
from collectx.topology.view import job_graph

import _dumps as dumps

# From the topology README: ForestColl cut bound, allgather / reduce-scatter busbw at line rates.
PRESET_CUT = {"dgx1p": 95.75, "dgx1v": 165.75, "dgx2": 150.0, "dgx_a100": 300.0,
              "dgx_h100": 450.0, "mi250_16gcd": 321.43, "mi300x": 448.0, "pcie_gen4_8gpu": 31.5}


# What the hardware can run where the cut counts PCIe peer traffic CUDA sends over NVLink: two
# GPUs below one PCIe switch share its 15.75 GB/s downlink from host memory.
SPLIT = {"dgx1p": 80 + 15.75 / 2, "dgx1v": 150 + 15.75 / 2}


@pytest.mark.parametrize("name", sorted(PRESET_CUT))
def test_preset_cut_bound_matches_reference(name):
    G = topo.load(name)
    g = topo.gpus(G)
    assert (len(g) - 1) * cut_rate(job_graph(G, g), g)[0] == pytest.approx(PRESET_CUT[name],
                                                                          abs=0.01)
    b = bounds(G, "allgather")
    assert b.bound_busbw == pytest.approx(SPLIT.get(name, PRESET_CUT[name]), abs=0.01)
    assert b.kind == "allgather" and b.ceiling_busbw is None


def test_split_switches_copy_nothing():
    # DGX-1P GPUs 0, 1 (one PCIe switch) and 4, 5 (another), NVLinks 0-1, 0-4, 1-5, 4-5 at
    # 20 GB/s. Each GPU takes in 3 units: GPUs 0 and 1 together 6, over 4 NVLinks (80) and one
    # downlink (15.75), which their switch cannot copy onto both: x <= 95.75 / 6 per root. The
    # cut bound, which lets the downlink feed both at 15.75, says 18.58.
    G = topo.load("dgx1p")
    four = ("GPU0", "GPU1", "GPU4", "GPU5")
    assert bounds(G, "allgather", gpus=four).bound_busbw == pytest.approx(3 * 95.75 / 6)
    assert 3 * cut_rate(job_graph(G, four), four)[0] == pytest.approx(3 * 18.5833, rel=1e-4)
    # Broadcast from GPU0 to GPUs 2 and 3 (one switch; NVLinks 0-2, 0-3, 2-3): together they
    # take in 2x over 40 GB/s from GPU0, 40 between them and the shared 15.75 downlink, where
    # max-flow to either one alone is 20 + 20 + 15.75.
    three = ("GPU0", "GPU2", "GPU3")
    assert bounds(G, "broadcast", gpus=three).bound_busbw == pytest.approx((80 + 15.75) / 2)
    assert bounds(G, "reduce", gpus=three).bound_busbw == pytest.approx((80 + 15.75) / 2)


def test_line_of_three_needs_trees():
    b = bounds(topo.line(3, bw=100.0), "allreduce")
    assert b.cut_busbw == pytest.approx(100.0)
    assert b.tree_busbw == pytest.approx(400 / 3)
    assert b.ceiling_busbw == pytest.approx(400 / 3)
    assert b.bound_busbw == pytest.approx(400 / 3)


def test_rooted_bounds_on_line():
    G = topo.line(3, bw=100.0)
    assert bounds(G, "broadcast", root=0).bound_busbw == pytest.approx(100.0)
    assert bounds(G, "reduce", root=1).bound_busbw == pytest.approx(100.0)


def test_alltoall_full_mesh_is_link_rate():
    # each GPU sends (N-1) pair payloads over its N-1 direct links
    b = bounds(topo.fully_connected(4, bw=25.0), "alltoall")
    assert b.bound_busbw == pytest.approx(75.0, rel=1e-6)


def test_alltoall_below_cut_form_on_switch():
    G = topo.switch(4, bw=30.0)
    b = bounds(G, "alltoall")
    # single-GPU cut: 30 GB/s out for 3 pair payloads -> rate 10, busbw 3 * 10
    assert b.bound_busbw == pytest.approx(30.0, rel=1e-6)


def _random_graph(seed: int, n_gpu: int, n_relay: int) -> nx.DiGraph:
    rng = random.Random(seed)
    G = nx.DiGraph()
    names = [f"GPU{i}" for i in range(n_gpu)] + [f"SW{i}" for i in range(n_relay)]
    for v in names:
        G.add_node(v, kind="gpu" if v.startswith("GPU") else "nvswitch")
    for a, b in itertools.combinations(names, 2):
        if rng.random() < 0.55:
            bw = rng.choice([10.0, 25.0, 50.0, 15.75])
            G.add_edge(a, b, bw_gbps=bw)
            G.add_edge(b, a, bw_gbps=bw if rng.random() < 0.7 else bw / 2)
    for i in range(len(names)):      # keep it strongly connected: a thin ring under everything
        a, b = names[i], names[(i + 1) % len(names)]
        for u, v in ((a, b), (b, a)):
            if not G.has_edge(u, v):
                G.add_edge(u, v, bw_gbps=5.0)
    return G


def _brute_cut(G: nx.DiGraph, gpus) -> float:
    nodes = list(G.nodes)
    best = float("inf")
    for k in range(1, len(nodes) + 1):
        for S in itertools.combinations(nodes, k):
            S = set(S)
            inside = sum(g in S for g in gpus)
            if inside == 0 or inside == len(gpus):
                continue
            out = sum(d["cap"] for u, v, d in G.edges(data=True) if u in S and v not in S)
            best = min(best, out / inside)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_cut_rate_matches_brute_force(seed):
    n_gpu, n_relay = 3 + seed % 3, seed % 3
    G0 = _random_graph(seed, n_gpu, n_relay)
    gpus = tuple(f"GPU{i}" for i in range(n_gpu))
    G = job_graph(G0, gpus)
    x, S = cut_rate(G, gpus)
    assert x == pytest.approx(_brute_cut(G, gpus), rel=1e-9)
    assert 0 < sum(g in S for g in gpus) < n_gpu


def test_cut_rate_does_not_depend_on_the_order_links_were_added():
    # Seven GPUs of two 4-GPU xGMI rings behind two sockets (an RCCL dump): the order a job
    # graph's nodes and links come in follows string hashing, which differs per process.
    # Partitions read off a floating-point preflow by exact comparison named a GPU-less side
    # in about half of those orders, and the bound divided by zero.
    G0 = topo.load(dumps.REAL / "mi50_8gpu_2xgmi_rings_2socket_rccl_topo.xml")
    gpus = [topo.gpus(G0)[i] for i in (0, 1, 3, 4, 5, 6, 7)]
    J = job_graph(G0, gpus)
    rng, rates = random.Random(5), set()
    for _ in range(24):
        nodes, edges = list(J.nodes(data=True)), list(J.edges(data=True))
        rng.shuffle(nodes)
        rng.shuffle(edges)
        G = nx.DiGraph()
        G.add_nodes_from(nodes)
        G.add_edges_from(edges)
        x, S = cut_rate(G, gpus)
        assert 0 < sum(g in S for g in gpus) < len(gpus)
        rates.add(round(x, 9))
    assert len(rates) == 1 and 6 * rates.pop() == pytest.approx(71.265)   # its allgather bound


def _partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


def _brute_tree_rate(G: nx.DiGraph, gpus) -> float:
    """Nash-Williams–Tutte: min over partitions of crossing capacity / (parts - 1)."""
    best = float("inf")
    for part in _partitions(list(gpus)):
        if len(part) < 2:
            continue
        where = {v: i for i, block in enumerate(part) for v in block}
        cross = sum(min(G[u][v]["bw_gbps"], G[v][u]["bw_gbps"])
                    for u, v in itertools.combinations(gpus, 2)
                    if G.has_edge(u, v) and G.has_edge(v, u) and where[u] != where[v])
        best = min(best, cross / (len(part) - 1))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_tree_optimum_matches_nash_williams(seed):
    n = 3 + seed % 3
    G = _random_graph(100 + seed, n, 0)
    for u, v in list(G.edges):           # undirected capacities: make both directions equal
        G[v][u]["bw_gbps"] = G[u][v]["bw_gbps"] = min(G[u][v]["bw_gbps"], G[v][u]["bw_gbps"])
    b = bounds(G, "allreduce")
    assert b.tree_busbw == pytest.approx(2 * (n - 1) / n * _brute_tree_rate(G, b.gpus), rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_reference_never_above_ceiling(seed):
    G = _random_graph(200 + seed, 3 + seed % 3, seed % 2 + 1)
    b = bounds(G, "allreduce")
    assert b.cut_busbw <= b.bound_busbw <= b.ceiling_busbw * (1 + 1e-9)


def test_dgx1v_trees_beat_cut_bound_on_fragmented_allocations():
    G = topo.load("dgx1v")
    c = ("GPU1", "GPU2", "GPU3", "GPU4", "GPU5", "GPU6")
    ratio = bounds(G, "allreduce", gpus=c).tree_busbw / bounds(G, "allgather", gpus=c).cut_busbw
    assert ratio == pytest.approx(107.64 / 65.75, rel=1e-3)


def test_pcie_switches_do_not_turn_traffic_between_nvlink_peers():
    # GPUs 0 and 1 of a DGX-1V share an NVLink (25 GB/s) and a PCIe switch (15.75 GB/s links).
    # CUDA sends their peer traffic over NVLink, so PCIe helps only through host memory, and
    # the switch's uplink carries that relay in both directions when both GPUs send.
    G = topo.load("dgx1v")
    pair = ("GPU0", "GPU1")
    assert bounds(G, "allgather", gpus=pair).bound_busbw == pytest.approx(25 + 15.75 / 2)
    assert bounds(G, "reduce_scatter", gpus=pair).bound_busbw == pytest.approx(25 + 15.75 / 2)
    assert bounds(G, "broadcast", gpus=pair).bound_busbw == pytest.approx(25 + 15.75)
    # Without NVLink between them the switch does turn peer traffic around (PCIe P2P).
    P = topo.load("pcie_gen4_8gpu")
    a, b = topo.gpus(P)[:2]
    assert bounds(P, "allgather", gpus=(a, b)).bound_busbw == pytest.approx(
        min(P.edges[a, nbr]["bw_gbps"] for nbr in P.successors(a)))


def test_other_gpus_are_not_relays():
    # GPU0 and GPU2 meet only through GPU1: without GPU1 they are disconnected
    with pytest.raises(TopologyError):
        bounds(topo.line(3), "allgather", gpus=["GPU0", "GPU2"])


def test_does_not_mutate_topology():
    G = topo.load("dgx1v")
    before = nx.to_dict_of_dicts(G)
    bounds(G, "allreduce", gpus=["GPU0", "GPU1", "GPU5"])
    assert nx.to_dict_of_dicts(G) == before


def test_bad_arguments_raise():
    G = topo.ring(4)
    with pytest.raises(ArgumentError, match="expected one of"):
        bounds(G, "allscatter")
    with pytest.raises(ArgumentError, match="not a GPU"):
        bounds(G, "allgather", gpus=["GPU0", "CPU9"])
    with pytest.raises(ArgumentError, match="root"):
        bounds(G, "broadcast", root=7)


def test_bounds_serialize():
    d = bounds(topo.ring(4), "allreduce").to_dict()
    assert d["kind"] == "allreduce" and d["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert isinstance(Bounds(**{**d, "gpus": tuple(d["gpus"])}), Bounds)


def test_remembered_bounds_follow_an_edited_graph():
    # Cut rates and tree rates are remembered per job-graph content: an edited topology must
    # get the numbers of its own, equal to what a fresh process computes.
    G = topo.ring(4, bw=100.0)
    first = bounds(G, "allreduce")
    assert bounds(topo.ring(4, bw=100.0), "allreduce") == first
    for u, v in (("GPU0", "GPU1"), ("GPU1", "GPU0")):
        G.edges[u, v]["bw_gbps"] = 50.0
    edited = bounds(G, "allreduce")
    assert edited.cut_busbw < first.cut_busbw
    from collectx.planner._build import forget_remembered
    forget_remembered()
    assert bounds(G, "allreduce") == edited


def test_tree_bound_relays_through_a_split_switch_climbing_up_and_down():
    # Trees used both ways relay GPU0 <-> GPU1 through host memory: up through the switch's
    # upward half, down through its downward one (not reverses of each other).
    G = topo.load("dgx1v")
    b = bounds(G, "allreduce", gpus=("GPU0", "GPU1"))
    assert b.tree_busbw == pytest.approx(25 + 15.75 / 2, rel=1e-6)
    assert bounds(G, "allreduce", gpus=("GPU1", "GPU6", "GPU7")).tree_busbw > 0


def _two_level_pcie_on_a_switch_fabric() -> nx.DiGraph:
    """Four GPUs on one NVSwitch (25 GB/s each), and a two-level PCIe tree: GPU0-1 under
    PLXA, GPU2-3 under PLXB, both under PLXTOP, under the CPU."""
    G = topo.switch(4)
    topo.add_node(G, "CPU0", "cpu")
    for plx in ("PLXTOP", "PLXA", "PLXB"):
        topo.add_node(G, plx, "pci_switch")
    topo.add_link(G, "PLXTOP", "CPU0", "pcie", 15.75)
    for plx, below in (("PLXA", ("GPU0", "GPU1")), ("PLXB", ("GPU2", "GPU3"))):
        topo.add_link(G, plx, "PLXTOP", "pcie", 15.75)
        for g in below:
            topo.add_link(G, g, plx, "pcie", 15.75)
    return G


def test_no_turnaround_between_gpus_of_one_nvswitch_fabric_at_any_pcie_level():
    from collectx.topology.flows import multicast_rate
    from collectx.topology.view import without_turnarounds
    G = _two_level_pcie_on_a_switch_fabric()
    gpus = topo.gpus(G)
    H = without_turnarounds(job_graph(G, gpus), gpus)
    assert {n for n in H if str(n).startswith("PLX")} == {
        f"{p}~{half}" for p in ("PLXTOP", "PLXA", "PLXB") for half in ("up", "dn")}
    # PCIe only climbs from a GPU and only descends to one: no route turns inside a switch.
    assert not nx.has_path(H.subgraph(n for n in H if n != "CPU0"), "PLXA~up", "GPU2")
    b = bounds(G, "allgather")
    assert b.bound_busbw == pytest.approx(3 * multicast_rate(H, gpus), rel=1e-9)
    assert b.bound_busbw < 3 * cut_rate(job_graph(G, gpus), gpus)[0]


def test_hgx_a100_dump_counts_no_pcie_turnaround_between_its_nvswitched_gpus():
    dump = dumps.load("hgx_a100_8gpu_5nic_bond_nccl_topo.xml")
    assert bounds(dump, "allgather").bound_busbw == pytest.approx(315.76, abs=0.01)


def _sockets(smp: dict) -> nx.DiGraph:
    """GPU0 under CPU0, GPU1 under CPU1 (PCIe 32 GB/s), a NIC under CPU2, and socket links
    ``smp`` {(a, b): GB/s} both ways."""
    G = nx.DiGraph()
    for g, c in (("GPU0", "CPU0"), ("GPU1", "CPU1"), ("NIC0", "CPU2")):
        G.add_node(g, kind="nic" if g.startswith("NIC") else "gpu")
        G.add_node(c, kind="cpu")
        G.add_edge(g, c, type="pcie", bw_gbps=32.0)
        G.add_edge(c, g, type="pcie", bw_gbps=32.0)
    for (a, b), bw in smp.items():
        G.add_edge(a, b, type="smp", bw_gbps=bw)
        G.add_edge(b, a, type="smp", bw_gbps=bw)
    return G


def test_traffic_between_two_sockets_crosses_their_own_link_only():
    # Every socket pair linked, no detour wider: memory traffic takes the direct link, so a
    # third socket adds nothing (it used to count a second route through CPU2: 20 GB/s).
    full = _sockets({("CPU0", "CPU1"): 10.0, ("CPU0", "CPU2"): 10.0, ("CPU1", "CPU2"): 10.0})
    for coll in ("allgather", "broadcast", "allreduce"):
        assert bounds(full, coll).bound_busbw == pytest.approx(10.0), coll
    # A pair without a link of its own goes through a third socket, which then forwards.
    chain = _sockets({("CPU0", "CPU2"): 10.0, ("CPU1", "CPU2"): 10.0})
    assert bounds(chain, "allgather").bound_busbw == pytest.approx(10.0)
    # A detour wider than the direct link is a route the hardware (and the simulator) takes.
    wide = _sockets({("CPU0", "CPU1"): 10.0, ("CPU0", "CPU2"): 20.0, ("CPU1", "CPU2"): 20.0})
    assert bounds(wide, "allgather").bound_busbw == pytest.approx(30.0)


def test_socket_links_of_real_dumps_carry_no_detours():
    l40s = dumps.load("l40s_8gpu_2socket_nvidia-smi-topo.txt")   # two sockets, a NIC node
    assert bounds(l40s, "allgather", ["GPU0", "GPU7"]).bound_busbw == pytest.approx(10.0)
    assert bounds(l40s, "broadcast").bound_busbw == pytest.approx(10.0)
    mi100 = dumps.load("mi100_8gpu_2hives_4numa_4nic_rccl_topo.xml")   # four NUMA nodes
    # GPU6 reaches GPUs 2 and 3 over one 16 GB/s NUMA link; a NIC switch under a third node
    # no longer turns a second route around
    assert bounds(mi100, "allgather", ["GPU2", "GPU3", "GPU6"]).bound_busbw <= 2 * 16.0 + 1e-6


def test_gpus_joined_by_xgmi_hops_through_a_third_gpu_do_not_turn_at_their_pcie_switch():
    # MI250 dump: GCDs 8 and 11 share no xGMI link, but their copies go over xGMI through
    # GCD10, so none of the three talks over PSW14, and PSW14 is split like a switch whose
    # GPUs all share direct links.
    from collectx.topology.view import peer_linked, without_turnarounds
    G = dumps.load("mi250_16gcd_8nic_rccl_topo.xml")
    gpus = ("GPU8", "GPU10", "GPU11")
    J = job_graph(G, gpus)
    assert ("GPU8", "GPU11") in peer_linked(J, gpus)
    H = without_turnarounds(J, gpus)
    assert "PSW14" not in H and {"PSW14~up", "PSW14~dn"} <= set(H)
    # Without GCD10 in the job, 8 and 11 talk over PCIe again, and PSW14 keeps its turn.
    pair = ("GPU8", "GPU11")
    assert pair not in peer_linked(job_graph(G, pair), pair)
    assert "PSW14" in without_turnarounds(job_graph(G, pair), pair)


def test_tree_bound_is_the_packing_lp_where_pcie_turns_were_its_only_extra_freedom():
    # Nine GCDs of the MI250 dump: the tree bound once let GCD pairs that talk over xGMI turn
    # at PCIe switches (175.35 GB/s). Without those turns it is exactly the packing program's
    # LP over the simulator's peer and host-staged routes.
    import collectx.planner.program as P
    G = dumps.load("mi250_16gcd_8nic_rccl_topo.xml")
    gpus = tuple(f"GPU{i}" for i in (5, 6, 7, 8, 10, 11, 12, 13, 14))
    b = bounds(G, "allreduce", gpus=gpus)
    lp = P.fractional(P.problem(job_graph(G, gpus), gpus, "allreduce", host=True))
    assert b.tree_busbw == pytest.approx(2 * 8 / 9 * lp.rate, rel=1e-6)
    assert b.tree_busbw < 160


def _through(H, index, path) -> dict:
    """The kinds of node each GPU pair's relay path enters."""
    kinds = dict(H.nodes(data="kind"))
    return {pair: {kinds[index.links[link][1]] for link, _ in p} for pair, p in path.items()}


def test_a_switch_with_a_port_per_gpu_turns_only_the_pairs_that_talk_over_pcie():
    # 16-GPU MI100 dump, GPUs 0-2: 1 and 2 share a hive (xGMI), 0 reaches both over PCIe, each
    # on its own port of PSW1. The graph keeps PSW1's turns for 0's pairs only: with xGMI
    # priced out, 0 -> 1 still turns inside the switch, while 1 -> 2 has to climb to the CPU
    # (host memory) and come back down.
    # (PSW0 above it, one port wide, is left whole: the rule keeps 1 -> 2 from turning back
    # there.)
    from collectx.topology.view import LinkIndex, relay_paths, turn_rule, without_turnarounds
    G = dumps.load("mi100_16gpu_4hives_16nic_rccl_topo.xml")
    gpus = ("GPU0", "GPU1", "GPU2")
    J = job_graph(G, gpus)
    H = without_turnarounds(J, gpus)
    assert "PSW1" not in H and H.has_edge("PSW1~from~PSW2", "PSW1~to~PSW3")
    assert not H.has_edge("PSW1~from~PSW3", "PSW1~to~PSW4")
    index = LinkIndex.of(H)
    price = [1e6 if H.edges[e].get("type") == "xgmi" else 1.0 for e in index.links]
    through = _through(H, index, relay_paths(index, gpus, price, turn_rule(J, H, gpus))[1])
    assert "cpu" in through["GPU1", "GPU2"] and "cpu" not in through["GPU0", "GPU1"]


def test_a_port_without_gpus_keeps_its_turns_and_linked_ports_lose_theirs():
    # Four GPUs on the ports of one switch, GPUs 0 and 1 joined by NVLink, and a port leading
    # to a NIC alone. The switch turns 0 <-> 2 and 2 <-> 3 (PCIe peers) and every port to and
    # from the NIC's (it may lead to other machines), but not 0 <-> 1; the NIC's own switch is
    # split, so no route turns back up through it.
    from collectx.topology.view import without_turnarounds
    G = topo.pcie_tree(1, 1, 4)
    topo.add_link(G, "GPU0", "GPU1", "nvlink", 50.0)
    topo.add_node(G, "SWN", "pci_switch")
    topo.add_link(G, "SWN", "PLX0", "pcie", 31.5)
    topo.add_node(G, "NIC0", "nic", net_gbps=25.0)
    topo.add_link(G, "NIC0", "SWN", "pcie", 31.5)
    gpus = ("GPU0", "GPU1", "GPU2", "GPU3")
    H = without_turnarounds(job_graph(G, gpus), gpus)
    turns = lambda a, b: H.has_edge(f"PLX0~from~{a}", f"PLX0~to~{b}")  # noqa: E731
    assert turns("GPU0", "GPU2") and turns("GPU3", "GPU2") and turns("GPU1", "SWN")
    assert turns("SWN", "GPU0") and not turns("GPU0", "GPU1") and not turns("GPU1", "GPU0")
    assert "SWN" not in H and {"SWN~up", "SWN~dn"} <= set(H)


def test_the_turn_rule_applies_pair_by_pair_where_a_port_leads_to_several_gpus():
    # MI250 dump, GCDs 4, 5 and 7: 4 and 5 (one package, xGMI) sit below one port of PSW7,
    # 7 below another, reaching both over PCIe. PSW7 stays whole, and the rule keeps 4 -> 5
    # from turning there: with xGMI priced out it climbs to the CPU, while 4 -> 7 turns.
    from collectx.topology.view import LinkIndex, relay_paths, turn_rule, without_turnarounds
    G = dumps.load("mi250_16gcd_8nic_rccl_topo.xml")
    gpus = ("GPU4", "GPU5", "GPU7")
    J = job_graph(G, gpus)
    H = without_turnarounds(J, gpus)
    turns = turn_rule(J, H, gpus)
    assert "PSW7" in H and "PSW7" in turns.below
    index = LinkIndex.of(H)
    price = [1e6 if H.edges[e].get("type") == "xgmi" else 1.0 for e in index.links]
    through = _through(H, index, relay_paths(index, gpus, price, turns)[1])
    assert "cpu" in through["GPU4", "GPU5"] and "cpu" not in through["GPU4", "GPU7"]
    assert "cpu" not in _through(H, index, relay_paths(index, gpus, price)[1])["GPU4", "GPU5"]


@pytest.mark.parametrize("seed", range(8))
def test_max_flow_values_are_networkxs_on_random_graphs(seed):
    # The bounds' max-flows run over a dense matrix (in C where built): every pair's value
    # must be the one networkx finds.
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    G = nx.DiGraph()
    G.add_nodes_from(range(n))
    for a, b in itertools.permutations(range(n), 2):
        if rng.random() < 0.4:
            G.add_edge(a, b, cap=rng.choice((12.0, 25.0, 15.75, 50.0)))
    value = max_flows(G)
    for s, t in itertools.permutations(range(n), 2):
        assert value(s, t) == pytest.approx(nx.maximum_flow_value(G, s, t, capacity="cap"))


def test_choosing_reads_bounds_without_their_cut_and_plans_report_them_whole():
    # DGX-1P GPUs 0, 1, 4, 5: split switches, so the cut is the multicast LP. Choosing an
    # allreduce reads the tree bound and the ceiling only; the plan still reports the whole bound.
    from collectx.planner import plan
    from collectx.planner._build import forget_remembered
    G, four = topo.load("dgx1p"), ["GPU0", "GPU1", "GPU4", "GPU5"]
    forget_remembered()
    whole, choice = bounds(G, "allreduce", gpus=four), bounds(G, "allreduce", gpus=four, cut=False)
    assert choice.cut_busbw is None and whole.cut_busbw > 0
    assert (choice.tree_busbw, choice.ceiling_busbw) == (whole.tree_busbw, whole.ceiling_busbw)
    assert choice.bound_busbw == choice.tree_busbw
    forget_remembered()
    assert plan(G, "allreduce", 1 << 20, gpus=four, verify=False).bound == whole
    # An allgather is chosen by the max-flow cut, above the LP's: no plan beats either.
    loose, whole = (bounds(G, "allgather", gpus=four, cut=c) for c in (False, True))
    assert loose.cut_busbw is None and loose.bound_busbw > whole.bound_busbw * (1 + 1e-6)
    forget_remembered()
    assert plan(G, "allgather", 1 << 20, gpus=four, verify=False).bound == whole
    # No split switch: the cut is max-flows, solved either way.
    assert bounds(topo.ring(4), "allgather", cut=False) == bounds(topo.ring(4), "allgather")
    assert bounds(topo.line(3, bw=100.0), "allreduce", cut=False).cut_busbw == 100.0   # max-flows
    # A broadcast is chosen by its rooted flow: the allgather cut beside it is only reported.
    whole, choice = (bounds(G, "broadcast", gpus=four, cut=c) for c in (True, False))
    assert choice.cut_busbw is None and choice.bound_busbw == whole.bound_busbw
    forget_remembered()
    assert plan(G, "broadcast", 1 << 20, gpus=four, verify=False).bound == whole


def test_split_switches_solve_the_multicast_lp_only_where_the_max_flow_cut_tops_the_trees(
        monkeypatch):
    # The max-flow cut lies above the multicast LP's. DGX-1V GPUs 0-3: even it is below the
    # trees, so they are the reference, and the LP is not solved. GPUs 0, 1, 4, 5: it is above
    # them, and the LP's cut is the reference.
    import collectx.planner.bounds as B
    from collectx.planner._build import forget_remembered
    from collectx.topology.view import job_graph, without_turnarounds
    G, lp, solved = topo.load("dgx1v"), B.multicast_rate, []
    monkeypatch.setattr(B, "multicast_rate", lambda *a, **k: solved.append(a) or lp(*a, **k))
    forget_remembered()
    four = ["GPU0", "GPU1", "GPU2", "GPU3"]
    b = bounds(G, "allreduce", gpus=four)
    assert not solved and b.bound_busbw == b.tree_busbw > b.cut_busbw
    H = without_turnarounds(job_graph(G, four), four)
    below = B._phases(4, lp(H.reverse(copy=True), four), lp(H, four))
    assert below <= b.cut_busbw * (1 + 1e-9)
    forget_remembered()
    b = bounds(G, "allreduce", gpus=["GPU0", "GPU1", "GPU4", "GPU5"])
    assert solved and b.bound_busbw == b.cut_busbw >= b.tree_busbw
    assert b.notes.startswith("reference = reduce-scatter + allgather")


def with_planes(G, planes: int, missing: tuple = (), bw: float = 50.0):
    """``G`` with ``planes`` NVSwitch planes (``NVS0``...) joined to every GPU by one NVLink
    of ``bw`` GB/s each way, but the ``(gpu, plane)`` pairs in ``missing``."""
    for k in range(planes):
        topo.add_node(G, f"NVS{k}", "nvswitch")
        for g in range(len(topo.gpus(G))):
            if (g, k) not in missing:
                topo.add_link(G, f"GPU{g}", f"NVS{k}", "nvlink", bw)
    return G


def test_uneven_switch_planes_are_bounded_by_their_stripes():
    # GPU1 reaches one of two planes: its pairs stripe over the planes in fixed proportions,
    # which the cut (free switching) overstates; a plan measures against the routes' LP.
    from collectx.planner import plan
    from collectx.planner.bounds import peer_bounds
    from collectx.topology.routes import uneven_planes
    G = with_planes(topo.pcie_tree(1, 1, 3, pcie_bw=31.5, smp_bw=40.0), 2, missing=((1, 0),))
    assert uneven_planes(G)
    lp = peer_bounds(G, "allreduce", host=True)
    assert lp.bound_busbw == pytest.approx(77.17, abs=0.01)
    assert bounds(G, "allreduce").bound_busbw == pytest.approx(87.67, abs=0.01)
    p = plan(G, "allreduce", 1 << 30, verify=False)
    assert p.bound.bound_busbw == pytest.approx(lp.bound_busbw)
    assert p.bound.ceiling_busbw == bounds(G, "allreduce").ceiling_busbw
    assert 0.95 < p.efficiency <= 1.0
    even = topo.load("dgx_h100")   # every GPU reaches every plane alike: the cut is exact
    assert not uneven_planes(even)
    assert plan(even, "allgather", 1 << 30, algo="direct").bound == bounds(even, "allgather")
