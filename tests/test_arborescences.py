"""Edmonds' disjoint arborescences by Lovász's construction (the packing program's split)."""

from __future__ import annotations

import numpy as np
import pytest

from collectx._native import compiled_helper
from collectx.planner import integral_trees
from collectx.topology import flows
from collectx.planner.integral_trees import disjoint_arborescences


def _check_trees(mult, root, trees):
    n = len(mult)
    used = np.zeros_like(mult)
    for edges in trees:
        reached = {root}
        for p, c in edges:
            assert p in reached and c not in reached
            reached.add(c)
            used[p, c] += 1
        assert reached == set(range(n))
    assert (used <= mult).all()


def test_disjoint_arborescences_small_multigraph():
    # a triangle with doubled arcs out of the root: two unit trees from 0
    mult = np.array([[0, 2, 1], [1, 0, 1], [1, 1, 0]], dtype=np.int32)
    trees = disjoint_arborescences(mult, 0, 2)
    assert trees is not None and len(trees) == 2
    _check_trees(mult, 0, trees)
    assert disjoint_arborescences(mult, 0, 3) is None


@pytest.mark.parametrize("seed", range(60))
def test_both_constructions_find_trees_exactly_when_edmonds_condition_holds(seed, monkeypatch):
    # Small fabrics grow every tree at once, tested over every vertex set; larger ones grow
    # one tree after another by max-flows. Both must find k trees within the counts exactly
    # when the counts hold them.
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(3, 9)), int(rng.integers(1, 6))
    mult = rng.integers(0, 4, size=(n, n)).astype(np.int32)
    np.fill_diagonal(mult, 0)
    root = int(rng.integers(0, n))
    together = disjoint_arborescences(mult, root, k)
    monkeypatch.setattr(integral_trees, "SET_ROWS", 0)
    one_by_one = disjoint_arborescences(mult, root, k)
    assert (together is None) == (one_by_one is None) == (not _edmonds(mult, root, k))
    for trees in (together, one_by_one):
        if trees is not None:
            assert len(trees) == k
            _check_trees(mult, root, trees)


def test_trees_grown_together_are_relay_trees_on_a_one_hop_fabric():
    # root 0 reaches each GPU once, every other pair once: the only packing of n-1 trees two
    # levels deep is one relay per tree, which growing the trees together finds
    n = 6
    mult = np.ones((n, n), dtype=np.int32)
    np.fill_diagonal(mult, 0)
    mult[1:, 0] = 0
    trees = disjoint_arborescences(mult, 0, n - 1)
    _check_trees(mult, 0, trees)
    assert max(max(_levels(t).values()) for t in trees) == 2


def _edmonds(mult, root, k) -> bool:
    """Every vertex set without the root entered k times (by brute force)."""
    n = len(mult)
    for mask in range(1, 1 << n):
        inside = [v for v in range(n) if mask >> v & 1]
        if root in inside:
            continue
        entering = sum(mult[u, v] for v in inside for u in range(n) if u not in inside)
        if entering < k:
            return False
    return True


def test_local_moves_keep_every_arc_count_and_never_deepen_the_trees():
    rng = np.random.default_rng(7)
    n, k = 7, 4
    mult = rng.integers(1, 3, size=(n, n)).astype(np.int32) * 2
    np.fill_diagonal(mult, 0)
    trees = disjoint_arborescences(mult, 0, k)
    _check_trees(mult, 0, trees)
    deepest = max(max(_levels(t).values()) for t in trees)
    assert deepest <= n - 1 and len(trees) == k


def _levels(edges):
    level = {edges[0][0]: 0}
    for p, c in edges:
        level[c] = level[p] + 1
    return level


@pytest.mark.parametrize("seed", range(40))
def test_compiled_max_flow_is_the_python_one(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 20))
    cap = rng.integers(0, 4, size=(n, n)).astype(float) * rng.choice([0.5, 1.0], size=(n, n))
    s, t = (int(v) for v in rng.choice(n, 2, replace=False))
    enough = float(rng.choice([np.inf, 1.0, 3.0]))
    got = flows.max_flow(cap, s, t, enough)
    monkeypatch.setattr(flows, "compiled_helper", lambda name: None)
    assert flows.max_flow(cap, s, t, enough) == got


@pytest.mark.parametrize("seed", range(40))
def test_compiled_paths_ok_is_the_python_one(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 17))
    mult = rng.integers(0, 3, size=(n, n)) * (rng.random((n, n)) < 0.6)
    np.fill_diagonal(mult, 0)
    root, k = int(rng.integers(n)), int(rng.integers(1, 4))
    inside = {root} | {int(v) for v in rng.choice(n, int(rng.integers(n)), replace=False)}
    got = integral_trees._paths_ok(mult, root, k, inside)
    monkeypatch.setattr(integral_trees, "compiled_helper", lambda name: None)
    assert integral_trees._paths_ok(mult, root, k, inside) == got


def _holding_trees(rng, n: int, root: int, k: int, spare: int) -> np.ndarray:
    """Arc counts of ``n`` GPUs holding ``k`` random spanning trees out of ``root``, plus
    random spare arcs (fewer than ``spare`` each, on about 30% of the pairs)."""
    mult = (rng.integers(0, spare, size=(n, n)) * (rng.random((n, n)) < 0.3)).astype(np.int64)
    for _ in range(k):
        order = [root] + [int(v) for v in rng.permutation([v for v in range(n) if v != root])]
        for i in range(1, n):
            mult[order[int(rng.integers(i))], order[i]] += 1
    np.fill_diagonal(mult, 0)
    return mult


@pytest.mark.parametrize("seed", range(40))
def test_compiled_shallower_is_the_python_one(seed, monkeypatch):
    # counts that hold k random spanning trees plus spare arcs; odd seeds grow the trees one
    # after another (deeper, so more moves are tried and kept)
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 10)), int(rng.integers(1, 13))
    root = int(rng.integers(n))
    mult = _holding_trees(rng, n, root, k, spare=2)
    if seed % 2:
        monkeypatch.setattr(integral_trees, "SET_ROWS", 0)
    got = disjoint_arborescences(mult, root, k)
    monkeypatch.setattr(integral_trees, "compiled_helper", lambda name: None)
    assert got is not None and disjoint_arborescences(mult, root, k) == got


def test_compiled_shallower_refuses_trees_that_do_not_span():
    helper = compiled_helper("shallower")
    if helper is None:
        pytest.skip("collectx._fastpath is not built")
    for trees in ([], [[(0, 1)]], [[(1, 2), (2, 1)]], [[(0, 3), (0, 1)]], [[(1, 0), (0, 2)]]):
        with pytest.raises(ValueError, match="spanning trees"):
            helper(np.zeros((3, 3)), 0, trees)


@pytest.mark.parametrize("seed", range(40))
def test_compiled_grown_together_is_the_python_one(seed, monkeypatch):
    # counts that hold k random spanning trees plus spare arcs, up to 12 GPUs (every vertex set
    # written out); every fourth seed asks for one tree more than they hold, so no arc passes
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 13))
    root, k = int(rng.integers(n)), int(rng.integers(1, 13 if n < 9 else 6))
    mult = _holding_trees(rng, n, root, k, spare=3)
    sets = integral_trees._SetTest.of(n, root)
    if seed % 4 == 0:
        k = int((sets.enters @ mult.ravel()).min()) + 1
    lefts = [mult.copy(), mult.astype(np.float64)]
    got = [integral_trees._grown_together(lefts[0], root, k, sets),
           disjoint_arborescences(mult, root, k)]
    monkeypatch.setattr(integral_trees, "compiled_helper", lambda name: None)
    assert [integral_trees._grown_together(lefts[1], root, k, sets),
            disjoint_arborescences(mult, root, k)] == got
    assert (got[0] is None) == (seed % 4 == 0) and (lefts[0] == lefts[1]).all()


def test_compiled_grown_together_refuses_counts_it_cannot_take_arcs_from():
    helper = compiled_helper("grown_together")
    if helper is None:
        pytest.skip("collectx._fastpath is not built")
    frozen = np.ones((3, 3))
    frozen.flags.writeable = False
    for left, root, k in ((frozen, 0, 1), (np.ones((21, 21)), 0, 1),
                          (np.full((2, 2), np.nan), 0, 1), (np.ones((2, 2)), 2, 1),
                          (np.ones((2, 2)), 0, -1)):
        with pytest.raises(ValueError, match="expected a float64 n x n array"):
            helper(left, root, k)


@pytest.mark.parametrize("name,args", [("max_flow", (0, 1, 1.0)), ("paths_ok", (0, 1, b"\1\0")),
                                       ("min_arborescence", (0,)), ("shallower", (0, [[(0, 1)]])),
                                       ("grown_together", (0, 1))])
@pytest.mark.parametrize("matrix", [np.zeros((2, 3)), np.zeros((2, 2), dtype=np.int64),
                                    np.zeros((0, 0))])
def test_compiled_graph_helpers_refuse_what_is_not_a_float_square(name, args, matrix):
    helper = compiled_helper(name)
    if helper is None:
        pytest.skip("collectx._fastpath is not built")
    with pytest.raises(ValueError, match="expected a float64 n x n array"):
        helper(matrix, *args)
