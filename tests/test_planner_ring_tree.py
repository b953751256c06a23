"""Ring packing and the double binary tree: structure, not just correctness."""

import pytest

import collectx.topology as T
from collectx.errors import NoFeasiblePlan, PlanError
from collectx.planner.ring import plan_ring
from collectx.planner.ring_search import find_rings
from collectx.planner.tree import double_tree, plan_tree, rooted_trees, tree_neighbors


def _ranks(G):
    return tuple(T.gpus(G))


def test_ring_topology_gets_both_directions():
    rings = find_rings(T.ring(5), _ranks(T.ring(5)))
    assert [r.order for r in rings] == [(0, 1, 2, 3, 4), (0, 4, 3, 2, 1)]
    assert all(r.bw_gbps == 25.0 for r in rings)


def test_dgx1v_prefers_nvlink_rings_and_falls_back_to_pcie():
    G = T.load("dgx1v")
    rings = find_rings(G, _ranks(G))
    bws = [r.bw_gbps for r in rings]
    assert bws[:4] == [50.0, 50.0, 25.0, 25.0]       # the doubled-NVLink rings come first
    for r in rings[:4]:                                # ...and use only NVLink hops
        assert all(G.edges[u, v]["type"] == "nvlink" for route in r.routes
                   for u, v in zip(route, route[1:]))
    # GPUs 0, 3, 5: no NVLink ring exists; the ring crosses the CPU socket link (6 GB/s)
    S = T.subset(G, [0, 3, 5])
    (only,) = find_rings(S, _ranks(S))
    assert only.bw_gbps == 6.0


def test_dgx1p_rings_cover_every_nvlink_both_ways():
    # Hybrid cube-mesh, four 20 GB/s NVLinks per GPU: the widest rings taken one by one leave
    # no fourth after three; two Hamiltonian cycles, each used both ways, use every link.
    G = T.load("dgx1p")
    rings = find_rings(G, _ranks(G))
    assert [r.bw_gbps for r in rings] == [20.0] * 4
    hops = [(r.order[i], r.order[(i + 1) % 8]) for r in rings for i in range(8)]
    assert len(set(hops)) == 32                       # 16 links, each direction once
    assert rings[1].order == rings[0].order[:1] + rings[0].order[:0:-1]   # a ring's reverse


@pytest.mark.parametrize("name", ["dgx1p", "dgx1v"])
def test_rings_never_oversubscribe_a_link(name):
    G = T.load(name)
    use = {}
    for r in find_rings(G, _ranks(G)):
        for route in r.routes:
            for e in zip(route, route[1:]):
                use[e] = use.get(e, 0.0) + r.bw_gbps
    assert all(use[e] <= G.edges[e]["bw_gbps"] + 1e-9 for e in use)


def test_ring_shares_follow_bandwidth():
    G = T.load("dgx1v")
    s = plan_ring(G, _ranks(G), "allgather", 1 << 30)
    rings = s.meta_dict()["rings"]
    chunks = [k for _, _, _, k in rings]
    assert sum(chunks) == s.nchunks and chunks[0] > chunks[-1] > 0
    assert chunks[0] / chunks[-1] == pytest.approx(rings[0][1] / rings[-1][1], rel=0.1)


def test_line_ring_relays_the_wrap_hop_through_the_middle_gpu():
    (ring,) = find_rings(T.line(3), _ranks(T.line(3)))
    assert ring.bw_gbps == 25.0 and ("GPU2", "GPU1", "GPU0") in ring.routes + tuple(
        r[::-1] for r in ring.routes)


def test_no_ring_when_a_gpu_would_relay_pcie():
    G = T.new_graph("pcie-star")
    for g in ("GPU0", "GPU1", "GPU2"):
        T.add_node(G, g, "gpu")
    T.add_link(G, "GPU0", "GPU1", "pcie", 15.75)
    T.add_link(G, "GPU0", "GPU2", "pcie", 15.75)
    with pytest.raises(NoFeasiblePlan, match="no ring"):
        find_rings(G, _ranks(G))


def test_ring_rejects_alltoall():
    with pytest.raises(PlanError, match="ring does not support alltoall"):
        plan_ring(T.ring(3), _ranks(T.ring(3)), "alltoall", 64)


def test_ring_allreduce_has_2n_minus_2_steps_per_lane():
    s = plan_ring(T.ring(6), _ranks(T.ring(6)), "allreduce", 1 << 20)
    assert all(len(lane) == 2 * (6 - 1) for lanes in s.lanes for lane in lanes)


@pytest.mark.parametrize("n", range(1, 40))
def test_tree_neighbors_form_one_tree(n):
    parents = [tree_neighbors(r, n)[0] for r in range(n)]
    for r in range(n):
        assert set(tree_neighbors(r, n)[1]) == {c for c in range(n) if parents[c] == r}
    assert parents.count(-1) == 1 and parents[0] == -1


@pytest.mark.parametrize("n", [4, 8, 16])
def test_double_tree_interiors_are_disjoint_for_powers_of_two(n):
    for t0, t1 in (double_tree(n), rooted_trees(n, 0)):
        interior0 = {p for p in t0 if p >= 0}
        interior1 = {p for p in t1 if p >= 0}
        assert len(interior0 & interior1) <= 1  # at most the shared root


def test_rooted_trees_have_the_requested_root():
    for t in rooted_trees(7, 3):
        assert t[3] == -1 and t.count(-1) == 1


def test_tree_depth_is_logarithmic():
    from collectx.planner.cost import steps
    s = plan_tree(None, tuple(map(str, range(16))), "allreduce", 64)
    assert steps(s) <= 2 * 5 + 1  # up log2(16)+1 levels, then down


def test_tree_pieces_grow_with_size():
    from collectx.planner.cost_tables import MAX_PIECES
    from collectx.topology import gpus, switch
    names = tuple(map(str, range(8)))
    assert plan_tree(None, names, "allreduce", 8 << 10).nchunks == 2
    # Without a topology to pace them, as many pieces as the smallest piece allows.
    assert plan_tree(None, names, "allreduce", 1 << 30).nchunks == 2 * MAX_PIECES
    # With one, the pipeline's latency makes a few large pieces better than many small ones.
    G = switch(8, bw=100.0)
    ids = tuple(gpus(G))
    counts = [plan_tree(G, ids, "allreduce", n).nchunks for n in (1 << 20, 64 << 20, 1 << 30)]
    assert counts == sorted(counts) and counts[0] < counts[-1] < 2 * MAX_PIECES
