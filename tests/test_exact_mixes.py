"""Equal spanning trees counted by the integer program of collectx.planner.exact_mixes."""

from __future__ import annotations

import itertools
import random

import pytest

import collectx.topology as topo
from collectx.planner import plan
from collectx.topology.view import job_graph
from collectx.planner.exact_mixes import (_partition_labels, exact_equal_mixes, exact_rooted_mix,
                                         tree_counts)
from collectx.planner.tree_split import partition_forests
from collectx.planner.treesched import pack_both_ways, pack_rooted

BELL = {2: 2, 3: 5, 4: 15, 5: 52, 6: 203, 7: 877}
DGX1V_SEVEN = ("GPU0", "GPU1", "GPU3", "GPU4", "GPU5", "GPU6", "GPU7")


def _nash_williams(ends, n, k) -> bool:
    """Whether ``ends`` holds ``k`` edge-disjoint spanning trees of ``range(n)``, by every
    partition (Nash-Williams–Tutte)."""
    for labels in _partition_labels(n):
        crossing = sum(labels[a] != labels[b] for a, b in ends)
        if crossing < k * int(labels.max()):
            return False
    return True


def _is_forest(ends, edges) -> bool:
    root = {}

    def find(v):
        while root.get(v, v) != v:
            v = root[v]
        return v
    for e in edges:
        a, b = map(find, ends[e])
        if a == b:
            return False
        root[a] = b
    return True


@pytest.mark.parametrize("n", sorted(BELL))
def test_partitions_are_every_split_into_two_or_more_parts(n):
    labels = _partition_labels(n)
    assert len(labels) == BELL[n] - 1
    assert len({tuple(row) for row in labels}) == len(labels)
    assert all(row[0] == 0 and row.max() >= 1 for row in labels)


@pytest.mark.parametrize("seed", range(40))
def test_forests_cover_the_edges_exactly_when_nash_williams_holds(seed):
    rng = random.Random(seed)
    n, k = rng.randint(3, 6), rng.randint(1, 4)
    pairs = list(itertools.combinations(range(n), 2))
    ends = [rng.choice(pairs) for _ in range(k * (n - 1))]
    forests = partition_forests(ends, k)
    assert (forests is not None) == _nash_williams(ends, n, k)
    if forests is not None:
        assert sorted(e for f in forests for e in f) == list(range(len(ends)))
        assert all(_is_forest(ends, f) and len(f) == n - 1 for f in forests)


def test_tree_counts_fill_the_smallest_link_with_whole_trees():
    assert tree_counts(80.25, 25.0)[:5] == [3, 6, 9, 12, 16]
    assert tree_counts(100.0, 100.0) == list(range(2, 37))
    assert tree_counts(10.0, 50.0)[:2] == [2, 3]


def _dgx1v_seven():
    packing, caps = pack_both_ways(job_graph(topo.load("dgx1v"), DGX1V_SEVEN), DGX1V_SEVEN,
                                   host=True)
    return packing, caps


def test_sixteen_equal_trees_keep_the_rate_the_lp_columns_miss():
    # The column generation's trees mix into at most 0.935 of the LP's rate here (up to 31
    # trees); 16 other equal trees keep 0.997 of it.
    packing, caps = _dgx1v_seven()
    (k, units), = exact_equal_mixes(packing, caps, DGX1V_SEVEN)
    assert k == 16 and len(units.trees) == 16
    assert units.rate >= 0.99 * packing.rate
    load = {}
    for tree in units.trees:
        assert tree.rate == pytest.approx(units.rate / 16)
        reached = {tree.root}
        for (p, c), path in zip(tree.edges, tree.paths):
            assert p in reached and c not in reached
            reached.add(c)
            for link, w in path:
                load[link] = load.get(link, 0.0) + w * tree.rate
        assert reached == set(DGX1V_SEVEN)
    assert all(used <= caps[link] * (1 + 1e-9) for link, used in load.items())
    assert any(t.staged or t.staged_up for t in units.trees)   # the host adds the last 7%


def test_staged_edges_keep_their_direction_when_a_tree_turns_them_round():
    packing, caps = _dgx1v_seven()
    staged = {}
    for tree in packing.columns:
        for i, ((p, c), path) in enumerate(zip(tree.edges, tree.paths)):
            staged.setdefault((p, c, path), (i in tree.staged, i in tree.staged_up))
            staged.setdefault((c, p, path), (i in tree.staged_up, i in tree.staged))
    (_, units), = exact_equal_mixes(packing, caps, DGX1V_SEVEN)
    for tree in units.trees:
        for i, ((p, c), path) in enumerate(zip(tree.edges, tree.paths)):
            assert staged[p, c, path] == (i in tree.staged, i in tree.staged_up)


def test_no_mix_past_seven_gpus_or_below_the_keep():
    gpus = tuple(f"GPU{i}" for i in range(8))
    packing, caps = pack_both_ways(job_graph(topo.load("dgx1v"), gpus), gpus, host=True)
    assert exact_equal_mixes(packing, caps, gpus) == []


def test_dgx1v_seven_gpu_allreduce_reaches_the_reference():
    p = plan(topo.load("dgx1v"), "allreduce", 1 << 30, gpus=[0, 1, 3, 4, 5, 6, 7])
    assert p.verified and p.algorithm.startswith("blink")
    assert p.efficiency >= 0.95   # 0.898 with the columns' mixes alone


def _within_capacity(units, caps) -> bool:
    load = {}
    for tree in units.trees:
        for path in tree.paths:
            for link, w in path:
                load[link] = load.get(link, 0.0) + w * tree.rate
    return all(used <= caps[link] * (1 + 1e-9) for link, used in load.items())


def test_full_dgx1v_broadcast_takes_31_equal_out_trees():
    # GPU 0's six NVLink lanes and its share of PCIe: 31 trees of 5 GB/s keep 0.994 of the
    # bound; the LP's columns mix into at most 0.962 of it
    gpus = tuple(f"GPU{i}" for i in range(8))
    packing, caps = pack_rooted(job_graph(topo.load("dgx1v"), gpus), gpus, ["GPU0"], False,
                                host=True)
    (k, units), = exact_rooted_mix(packing, caps, gpus, 0)
    assert k == 31 and len(units.trees) == 31 and units.rate >= 0.99 * packing.rate
    for tree in units.trees:
        reached = {"GPU0"}
        for p, c in tree.edges:
            assert p in reached and c not in reached
            reached.add(c)
        assert reached == set(gpus) and tree.root == "GPU0"
    assert _within_capacity(units, caps)
    assert any(t.staged for t in units.trees)


def test_rooted_mix_never_enters_the_root():
    gpus = ("GPU0", "GPU1", "GPU3", "GPU4", "GPU5")
    packing, caps = pack_rooted(job_graph(topo.load("dgx1v"), gpus), gpus, ["GPU3"], False,
                                host=True)
    for _, units in exact_rooted_mix(packing, caps, gpus, 2):
        assert all(c != "GPU3" for t in units.trees for _, c in t.edges)
        assert _within_capacity(units, caps)


def test_full_dgx1v_broadcast_reaches_the_bound():
    p = plan(topo.load("dgx1v"), "broadcast", 1 << 30)
    assert p.verified and p.efficiency >= 0.95   # 0.943 with a host relay joined instead
