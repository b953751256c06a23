"""simulate(): link-model timings checked against hand computations and bounds."""

import networkx as nx
import pytest

import collectx.topology as topo
from collectx.errors import ArgumentError
from collectx.schedule import Ref, ScheduleBuilder, simulate, verify
from collectx.schedule._fairshare import fair_rates

MB = 1_000_000


def two_gpus(bw=25.0, latency=1.0):
    G = nx.DiGraph()
    for g in ("GPU0", "GPU1"):
        G.add_node(g, kind="gpu")
    for a, b in (("GPU0", "GPU1"), ("GPU1", "GPU0")):
        G.add_edge(a, b, type="nvlink", bw_gbps=bw, count=1, latency_us=latency)
    return G


def star(n, bw=25.0, latency=1.0):
    """n GPUs, each with one link to a switch."""
    G = nx.DiGraph()
    G.add_node("NVS0", kind="nvswitch")
    for i in range(n):
        G.add_node(f"GPU{i}", kind="gpu")
        for a, b in ((f"GPU{i}", "NVS0"), ("NVS0", f"GPU{i}")):
            G.add_edge(a, b, type="nvlink", bw_gbps=bw, count=1, latency_us=latency)
    return G


def ring_allgather(n, nchunks=1, directions=(1,)):
    """Push ring allgather; with directions (1, -1) half of each slot goes each way round."""
    assert nchunks % len(directions) == 0
    per = nchunks // len(directions)
    b = ScheduleBuilder("allgather", n, nchunks, algorithm="ring")
    for r in range(n):
        b.copy(r, 0, Ref(r, "output", r * nchunks, nchunks), Ref(r, "input", 0, nchunks))
    for lane, step in enumerate(directions):
        for c in range(per * lane, per * (lane + 1)):
            prev = {}
            for t in range(n - 1):
                for r in range(n):
                    origin, nxt = (r - step * t) % n, (r + step) % n
                    chunk = origin * nchunks + c
                    src = Ref(r, "input", c) if t == 0 else Ref(r, "output", chunk)
                    prev[nxt, t] = b.copy(r, 1 + lane, Ref(nxt, "output", chunk), src,
                                          deps=[prev.get((r, t - 1))])
    return b.build()


def test_fair_rates_never_exceed_capacity():
    rates = fair_rates([0, 1, 2, 3], [(0,), (0, 1), (1,), (1, 2)], [10.0, 6.0, 1.0])
    assert rates[3] == pytest.approx(1.0)      # bottlenecked by link 2
    assert rates[1] == pytest.approx(2.5) and rates[2] == pytest.approx(2.5)
    assert rates[0] == pytest.approx(7.5)
    assert rates[0] + rates[1] <= 10.0 + 1e-9 and rates[1] + rates[2] + rates[3] <= 6.0 + 1e-9


def test_one_copy_over_a_link_is_bytes_over_bandwidth_plus_latency():
    b = ScheduleBuilder("sendrecv", 2, 1)
    b.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    r = simulate(b.build(), two_gpus(25.0, latency=1.0), 100 * MB)
    assert r.time_us == pytest.approx(100 * MB / 25e9 * 1e6 + 1.0)
    assert r.link_bytes == {("GPU0", "GPU1"): 100 * MB}
    assert r.link_util["GPU0", "GPU1"] == pytest.approx(4000 / 4001)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps) and r.algbw_GBps < 25.0


def test_two_concurrent_flows_share_a_link():
    single = ScheduleBuilder("sendrecv", 2, 2)
    single.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    both = ScheduleBuilder("sendrecv", 2, 2)
    both.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    both.copy(1, 1, Ref(1, "output", 1), Ref(0, "input", 1))
    G = two_gpus(latency=0.0)
    t1 = simulate(single.build(), G, 50 * MB).time_us
    t2 = simulate(both.build(), G, 50 * MB).time_us
    assert t2 == pytest.approx(2 * t1)


def test_dependent_copies_run_one_after_the_other():
    b = ScheduleBuilder("broadcast", 3, 1)
    d = b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0))
    d = b.copy(1, 0, Ref(1, "output", 0), Ref(0, "output", 0), deps=[d])
    b.copy(2, 0, Ref(2, "output", 0), Ref(1, "output", 0), deps=[d])
    s = b.build()
    verify(s)
    r = simulate(s, topo.line(3, bw=25.0), 25 * MB, local_bw_gbps=1000.0)
    local = 25 * MB / 1000e3
    hop = 25 * MB / 25e3 + topo.DEFAULT_LATENCY_US["nvlink"]
    assert r.time_us == pytest.approx(local + 2 * hop)


def test_reduce_counts_every_remote_stream():
    # Rank 0 pulls two remote sources through its single switch link: 2x the bytes of a copy.
    b = ScheduleBuilder("reduce", 3, 1, root=0)
    b.reduce(0, 0, Ref(0, "output", 0), [Ref(0, "input", 0), Ref(1, "input", 0),
                                         Ref(2, "input", 0)])
    r = simulate(b.build(), star(3, latency=0.0), 25 * MB)
    assert r.time_us == pytest.approx(2 * 25 * MB / 25e3)
    assert r.link_bytes["NVS0", "GPU0"] == 2 * 25 * MB


def test_push_copy_between_third_parties_moves_data_twice():
    b = ScheduleBuilder("sendrecv", 3, 1, root=1)
    b.copy(0, 0, Ref(2, "output", 0), Ref(1, "input", 0))   # rank 0 relays 1 -> 2
    r = simulate(b.build(), star(3, latency=0.0), 25 * MB)
    assert r.link_bytes["GPU1", "NVS0"] == r.link_bytes["NVS0", "GPU2"] == 25 * MB
    assert r.link_bytes["NVS0", "GPU0"] == r.link_bytes["GPU0", "NVS0"] == 25 * MB


@pytest.mark.parametrize("directions,expect", [((1,), 25.0), ((1, -1), 50.0)])
def test_ring_allgather_approaches_but_never_beats_the_cut_bound(directions, expect):
    # Cut bound on ring(4) at 25 GB/s: S = 3 GPUs has B+(S) = 50 into the 4th, so
    # busbw* = (N-1) * 50 / 3 = 50. One ring direction uses half of it.
    s = ring_allgather(4, nchunks=2, directions=directions)
    verify(s)
    r = simulate(s, topo.ring(4, bw=25.0), 1 << 30)
    assert r.busbw_GBps <= 50.0
    assert r.busbw_GBps == pytest.approx(expect, rel=0.01)
    assert all(u <= 1.0 + 1e-9 for u in r.link_util.values())


def test_direct_allgather_respects_the_cut_bound_on_a_ring():
    b = ScheduleBuilder("allgather", 4, 1)
    for r in range(4):
        for q in range(4):
            b.copy(r, 0 if q == r else q, Ref(q, "output", r), Ref(r, "input", 0))
    res = simulate(b.build(), topo.ring(4), 1 << 28)
    assert 0 < res.busbw_GBps <= 50.0


def test_engine_allreduce_is_a_ring_over_its_group():
    G = nx.DiGraph()
    for i in range(2):
        G.add_node(f"GPU{i}", kind="gpu")
    for a, b in (("GPU0", "GPU1"), ("GPU1", "GPU0")):
        G.add_edge(a, b, type="net", bw_gbps=12.5, count=1, latency_us=0.0)
    b = ScheduleBuilder("allreduce", 2, 1)
    for r in range(2):
        b.engine(r, 0, Ref(r, "output", 0), [Ref(r, "input", 0)], "allreduce", (0, 1))
    s = b.build()
    verify(s)
    r = simulate(s, G, 25 * MB)
    assert r.time_us == pytest.approx(25 * MB / 12.5e3)   # each member sends 2(G-1)/G = 1x
    assert r.busbw_GBps == pytest.approx(12.5)


def test_rank_mapping_and_errors():
    b = ScheduleBuilder("sendrecv", 2, 1)
    b.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    s = b.build()
    G = topo.load("dgx1v")
    near = simulate(s, G, 50 * MB, ranks=["GPU0", "GPU3"]).time_us   # doubled NVLink
    far = simulate(s, G, 50 * MB, ranks=["GPU0", "GPU1"]).time_us    # single NVLink
    assert far == pytest.approx(2 * near, rel=0.01)
    with pytest.raises(ArgumentError, match="2-rank schedule"):
        simulate(s, G, MB, ranks=["GPU0"])
    with pytest.raises(ArgumentError, match="not nodes"):
        simulate(s, G, MB, ranks=["GPU0", "GPU99"])


def test_zero_bytes_costs_only_latency():
    b = ScheduleBuilder("sendrecv", 2, 1)
    b.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    r = simulate(b.build(), two_gpus(latency=2.0), 0)
    assert r.time_us == pytest.approx(2.0) and r.algbw_GBps == 0.0


def test_eight_gpu_ring_of_hundreds_of_instructions_is_paced_by_its_slowest_link():
    from test_verify import ring_allreduce

    s = ring_allreduce(8, seg=4, lanes=2)
    r = simulate(s, topo.load("dgx1v"), 1 << 26)
    assert s.n_instructions == 448
    # GPU0->GPU1 is a single 25 GB/s NVLink on DGX-1V: the ring can not beat it.
    assert r.busbw_GBps <= 25.0 and r.busbw_GBps == pytest.approx(25.0, rel=0.01)


@pytest.mark.parametrize("alloc", [[0, 1, 2], [0, 3, 5], [1, 2, 5, 6], [0, 1, 2, 3, 4, 5, 6, 7]])
def test_never_beats_the_cut_bound_on_dgx1(alloc):
    from collectx.planner.bounds import bounds

    G = topo.subset(topo.load("dgx1v"), alloc)   # GPUs outside the job relay nothing
    n = len(alloc)
    bound = bounds(G, "allgather").bound_busbw
    direct = ScheduleBuilder("allgather", n, 1)
    for r in range(n):
        for q in range(n):
            direct.copy(r, q, Ref(q, "output", r), Ref(r, "input", 0))
    for s in (direct.build(), ring_allgather(n, nchunks=2, directions=(1, -1))):
        res = simulate(s, G, 1 << 30)
        assert 0 < res.busbw_GBps <= bound * (1 + 1e-9), (s.algorithm, res.busbw_GBps, bound)
        assert max(res.link_util.values()) <= 1.0 + 1e-9


def test_links_without_bandwidth_are_refused():
    from collectx.errors import TopologyError

    G = two_gpus()
    del G.edges["GPU0", "GPU1"]["bw_gbps"]
    b = ScheduleBuilder("sendrecv", 2, 1)
    b.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    with pytest.raises(TopologyError, match="GPU0->GPU1 has bw_gbps=None"):
        simulate(b.build(), G, MB)


def test_transfer_through_nvswitch_planes_uses_every_switch():
    # Two GPUs, each with one 25 GB/s link to each of 4 switches: a copy is striped over all
    # four planes (100 GB/s), not limited to one switch's 25 GB/s.
    import networkx as nx
    from collectx.schedule import Ref, ScheduleBuilder, simulate

    g = nx.DiGraph()
    for gpu in ("GPU0", "GPU1"):
        g.add_node(gpu, kind="gpu")
    for s in range(4):
        g.add_node(f"SW{s}", kind="nvswitch")
        for gpu in ("GPU0", "GPU1"):
            for a, b in ((gpu, f"SW{s}"), (f"SW{s}", gpu)):
                g.add_edge(a, b, type="nvlink", bw_gbps=25.0, count=1, latency_us=0.0)
    b = ScheduleBuilder("sendrecv", 2, nchunks=1)
    b.copy(0, 0, Ref(1, "output", 0), Ref(0, "input", 0))
    r = simulate(b.build(), g, nbytes=100_000_000)
    assert abs(r.time_us - 1000.0) < 1.0
    assert all(abs(u - 1.0) < 1e-6 for u in r.link_util.values())


def planes(bws):
    """GPUs joined by one switch per plane; ``bws[g][s]``: GPU g's GB/s to and from switch s."""
    g = nx.DiGraph()
    for s in range(len(bws[0])):
        g.add_node(f"SW{s}", kind="nvswitch")
    for i, row in enumerate(bws):
        g.add_node(f"GPU{i}", kind="gpu")
        for s, bw in enumerate(row):
            for a, b in ((f"GPU{i}", f"SW{s}"), (f"SW{s}", f"GPU{i}")):
                g.add_edge(a, b, type="nvlink", bw_gbps=bw, count=1, latency_us=0.7)
    return g


def test_switch_planes_fold_only_where_every_gpu_links_them_in_one_ratio():
    from collectx.topology.routes import twin_planes
    assert twin_planes(planes([[25, 50, 25]] * 3)) == [("SW0", "SW1", "SW2")]
    assert twin_planes(planes([[25, 50, 25]] * 2 + [[50, 50, 25]])) == [("SW1", "SW2")]
    assert twin_planes(planes([[25, 50, 25]] * 2 + [[50, 25, 25]])) == []
    g = planes([[25, 25]] * 3)
    g.remove_edge("SW1", "GPU2")   # a plane that cannot reach one GPU
    assert twin_planes(g) == []
    g = planes([[25, 25]] * 3)
    g.edges["GPU1", "SW0"]["latency_us"] = 2.0
    assert twin_planes(g) == []


@pytest.mark.parametrize("name,coll,algo,narrowed", [
    ("dgx_h100", "allreduce", "forest", None), ("dgx_a100", "allgather", "ring", None),
    ("dgx_h100", "broadcast", "blink", None),
    ("dgx_h100", "allreduce", "blink", ("GPU1", "NVS0")),    # three planes fold, one apart
    ("dgx_a100", "allgather", "forest", ("GPU0", "NVS3")),   # five fold, one misses GPU0
    ("dgx2", "allgather", "forest", None),                 # planes of two linked switches
    ("dgx2", "broadcast", "blink", ("GPU14", "NVSB0"))])   # five fold, one apart
def test_folded_switch_planes_simulate_as_the_striped_planes_do(monkeypatch, name, coll, algo,
                                                                narrowed):
    # Fair shares scale with capacity: stripes over planes in their own proportions end
    # together, so one flow over the planes' summed links takes the same time and hands each
    # link the bytes its stripe carried.
    import collectx.topology.routes as routes
    from collectx.planner import registry
    from collectx.planner.api import allocation
    G = topo.load(name)
    if narrowed == ("GPU0", "NVS3"):
        G.remove_edges_from([narrowed, narrowed[::-1]])
    elif narrowed:
        for a, b in (narrowed, narrowed[::-1]):
            G.edges[a, b]["bw_gbps"] /= 2
    ranks, view = allocation(G, None)
    s = registry.call(algo, view, ranks, coll, 64 * MB)
    folded = simulate(s, view, 64 * MB, ranks=list(ranks))
    assert routes.routes_for(view).folded
    monkeypatch.setattr(routes, "twin_fabrics", lambda g: [])
    monkeypatch.setattr(routes, "_CACHE", {})
    striped = simulate(s, view, 64 * MB, ranks=list(ranks))
    assert not routes.routes_for(view).folded
    # One flow's floating-point sums are not its stripes': event times agree to rounding.
    # Six stripes that end apart by rounding are six events, and a flow that starts between
    # them shares a link a moment sooner or later (a DGX-2's planes: 2e-8 of the run).
    assert folded.time_us == pytest.approx(striped.time_us, rel=1e-7)
    assert folded.link_bytes.keys() == striped.link_bytes.keys()
    for link, nb in striped.link_bytes.items():
        assert folded.link_bytes[link] == pytest.approx(nb, rel=1e-9)


def test_planes_of_linked_switches_fold_where_their_links_are_in_one_ratio():
    # A DGX-2's planes are two switches each, one per baseboard, joined by a trunk: a
    # transfer across the boards stripes over all six as one flow, until one plane's trunk
    # is narrowed and that plane stripes apart.
    import collectx.topology.routes as routes
    g = topo.load("dgx2")
    assert [len(role) for role in routes.twin_fabrics(g)[0]] == [6, 6]
    assert len(routes.Routes(g, None).merged("GPU0", "GPU9")) == 1
    g.edges["NVSA2", "NVSB2"]["bw_gbps"] /= 2
    group = routes.twin_fabrics(g)
    assert [len(role) for role in group[0]] == [5, 5] and "NVSA2" not in group[0][0]
    stripes = routes.Routes(g, None).merged("GPU0", "GPU9")
    assert len(stripes) == 2 and sum(share for _, _, share in stripes) == pytest.approx(1.0)
    g.remove_edge("NVSB2", "NVSA2")   # a plane whose boards no longer reach each other
    assert [len(role) for role in routes.twin_fabrics(g)[0]] == [5, 5]


def test_planes_a_relay_can_cross_alone_stay_striped():
    # GPU2's plane links are narrow, GPU1 -> GPU2 is a wide NVLink: GPU0 -> GPU2 takes
    # GPU0 -> SWk -> GPU1 -> GPU2 through one plane, which summed links would mis-share.
    import collectx.topology.routes as routes
    g = planes([[100, 100], [100, 100], [10, 10]])
    g.add_edge("GPU1", "GPU2", type="nvlink", bw_gbps=400.0, count=1, latency_us=0.7)
    g.add_edge("GPU2", "GPU1", type="nvlink", bw_gbps=400.0, count=1, latency_us=0.7)
    assert routes.twin_planes(g) == [("SW0", "SW1")]
    table = routes.Routes(g, None)
    assert len(table.spread("GPU0", "GPU2")) == 1
    assert not table.folded
    g.remove_edge("GPU1", "GPU2")
    assert not routes.Routes(g, None).folded   # GPU2 -> GPU1 -> SWk -> GPU0 is the wider
    g.remove_edge("GPU2", "GPU1")
    assert routes.Routes(g, None).folded


def test_a_plane_that_misses_a_gpu_never_counts_a_folded_link_twice():
    # SW0-SW2 join every GPU in one ratio and fold; SW3 misses GPU0, so GPU1 -> GPU2 also
    # stripes over SW3. Its other stripes must take the summed links, as GPU1 -> GPU0's do:
    # over the members themselves, a link would carry both at its full capacity.
    import collectx.topology.routes as routes
    g = planes([[50, 50, 50, 50]] * 3)
    g.remove_edge("GPU0", "SW3")
    g.remove_edge("SW3", "GPU0")
    table = routes.Routes(g, None)
    assert table.folded
    members = {link for parts in table.folded.values() for link, _ in parts}
    for a, b in [("GPU1", "GPU2"), ("GPU1", "GPU0"), ("GPU0", "GPU2")]:
        stripes = table.merged(a, b)
        assert not members & {r for res, _, _ in stripes for r in res}
        assert sum(share for _, _, share in stripes) == pytest.approx(1.0)
    assert len(table.merged("GPU1", "GPU2")) == 2   # the summed planes, and SW3


def test_trees_on_a_machine_with_a_missing_nvlink_stay_under_their_bound():
    from collectx.planner import plan
    g = topo.load("dgx_a100")
    g.remove_edge("GPU0", "NVS3")
    g.remove_edge("NVS3", "GPU0")
    p = plan(g, "allreduce", 1 << 30, algo="blink", verify=False)
    assert p.predicted.busbw_GBps <= p.bound.tree_busbw * 1.001


def test_gpus_joined_through_a_switch_copy_over_it_even_where_pcie_is_wider():
    # CUDA copies between GPUs that share an NVSwitch over NVLink; the PCIe switch above them
    # (63 GB/s) is wider than their 50 GB/s plane, but it is not the peer route.
    import collectx.topology.routes as routes
    g = planes([[50.0], [50.0]])
    g.add_node("PLX0", kind="pci_switch")
    for gpu in ("GPU0", "GPU1"):
        for a, b in ((gpu, "PLX0"), ("PLX0", gpu)):
            g.add_edge(a, b, type="pcie", bw_gbps=63.0, count=1, latency_us=1.0)
    table = routes.Routes(g, None)
    (res, _, share), = table.spread("GPU0", "GPU1")
    assert [table.names[r] for r in res] == [("GPU0", "SW0"), ("SW0", "GPU1")] and share == 1.0


def test_a_route_pays_its_slowest_links_latency_once():
    # Two GPUs under a chain of PCIe bridges: switches forward cut-through, so the copy waits
    # one PCIe latency, not one per bridge; a GPU's NVLink to the chain's top is the faster.
    import collectx.topology.routes as routes
    g = nx.DiGraph()
    chain = ["GPU0", "SWa", "SWb", "SWc", "GPU1"]
    for n in chain:
        g.add_node(n, kind="gpu" if n.startswith("GPU") else "pci_switch")
    for u, v in zip(chain, chain[1:]):
        for a, b in ((u, v), (v, u)):
            g.add_edge(a, b, type="pcie", bw_gbps=31.5, count=1, latency_us=1.0)
    g.edges["SWc", "GPU1"]["latency_us"] = 0.4
    table = routes.Routes(g, None)
    assert table.route("GPU0", "GPU1")[1] == pytest.approx(1.0)
    assert table.route("GPU1", "SWb")[1] == pytest.approx(1.0)
    assert table.wait_us("SWc", "GPU1") == pytest.approx(0.4)
