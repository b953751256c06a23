"""Tree packings lowered in C (collectx._fastpath.lower_words) are the schedules the Python
emitter builds, byte for byte, and malformed phases are refused with typed errors."""

from __future__ import annotations

import random

import pytest

import collectx.schedule.treesched as ts
from collectx.planner import trees
from collectx.planner.program import BOTH, DOWN, UP
from collectx.planner.treepack import Packing, Tree
from collectx.errors import ArgumentError
from collectx.schedule.treesched import ChunkRefs, Share, WordEmitter, chunk_refs
from collectx.schedule import ScheduleBuilder, verify
from collectx.schedule.ir import Ref

LOWER = ts.compiled_helper("lower_words")
needs_native = pytest.mark.skipif(LOWER is None, reason="no compiled collectx._fastpath")

# Trees over 5 ranks, top-down edges, of several depths and fan-outs.
SHAPES = {
    0: [((0, 1), (1, 2), (1, 3), (3, 4)), ((0, 2), (0, 4), (2, 3), (3, 1))],
    1: [((1, 0), (1, 2), (2, 3), (2, 4)), ((1, 4), (4, 3), (3, 2), (2, 0))],
    2: [((2, 3), (3, 4), (4, 0), (0, 1)), ((2, 1), (2, 0), (2, 4), (1, 3))],
    3: [((3, 0), (0, 1), (0, 2), (2, 4)), ((3, 4), (3, 2), (2, 1), (1, 0))],
    4: [((4, 1), (1, 0), (1, 3), (0, 2)), ((4, 2), (2, 0), (0, 3), (3, 1))],
}
NRANKS = 5


def _trees(group, root, staged: bool, both: bool = False):
    """The two trees of ``root`` in ``group``; with ``staged`` some of their edges (different
    ones up and down) go through host memory."""
    out = []
    for i, edges in enumerate(SHAPES[root]):
        down = (i % 2, 2 + i % 2) if staged else ()
        up = (1, 3 - i % 2) if staged and both else ()
        out.append(Tree(group, root, edges, (), 1.0, staged=down, staged_up=up))
    return out


def _packing(kind: str, staged: bool):
    """``(packing, modes, collective)``: blink (one group, broadcast/reduce/allreduce with
    trees used both ways) or forest (a group per root, and for allreduce one per root and way)."""
    collective, layout = kind.split("/")
    if layout == "blink":
        mode = {"broadcast": DOWN, "reduce": UP, "allreduce": BOTH}[collective]
        tree_list = _trees(0, 0, staged, both=mode == BOTH)
        if mode == UP:   # a reduction stages its edges up
            tree_list = [Tree(t.group, t.root, t.edges, (), 1.0, staged_up=t.staged)
                         for t in tree_list]
        return Packing(1.0, tuple(tree_list)), {0: mode}, collective
    modes = {"allgather": (DOWN,), "reduce_scatter": (UP,), "allreduce": (UP, DOWN)}[collective]
    groups, out = {}, []
    for w, mode in enumerate(modes):
        for r in range(NRANKS):
            g = w * NRANKS + r
            groups[g] = mode
            for t in _trees(g, r, staged):
                out.append(t if mode == DOWN else
                           Tree(g, r, t.edges, (), 1.0, staged_up=t.staged))
    return Packing(1.0, tuple(out)), groups, collective


def _lowered(packing, modes, collective, per_group, buffers, native: bool, n: int = NRANKS,
             root: int = 0):
    """The schedule of ``packing``, lowered in C (as words) or by the Python emitter."""
    with pytest.MonkeyPatch.context() as mp:
        if not native:
            mp.setattr(ts, "compiled_helper", lambda name: None)
        return trees.lower(packing, modes, collective, n, per_group, buffers=buffers,
                           packed=native, root=root)


KINDS = ["broadcast/blink", "reduce/blink", "allreduce/blink", "allgather/forest",
         "reduce_scatter/forest", "allreduce/forest"]


@needs_native
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("buffers", [1, 2])
@pytest.mark.parametrize("staged", [False, True], ids=["direct", "host"])
def test_c_words_are_the_python_schedule(kind, buffers, staged):
    packing, modes, collective = _packing(kind, staged)
    per_group = 14 if "forest" in kind else 22   # pieces of 2 chunks and 1 on two buffers
    if collective == "allreduce" and "forest" in kind:
        per_group = 3 * 2   # the chunks of each root: a multiple of the trees per group
    c = _lowered(packing, modes, collective, per_group, buffers, True)
    py = _lowered(packing, modes, collective, per_group, buffers, False)
    assert c.code == py.to_packed()["code"] and c.unpacked() == py
    assert (c.scratch_units, c.host_units) == (py.scratch_units, py.host_units)
    assert py.n_instructions > 0 and py.uses_host == staged
    pairs = any(ins.dst.count == 2 for _, ins in py.instructions())
    assert pairs == (buffers == 2)   # double buffering moves pieces of two chunks
    verify(py)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("buffers", [1, 2])
@pytest.mark.parametrize("staged", [False, True], ids=["direct", "host"])
def test_lanes_per_turn_counts_the_lanes_the_emitter_takes(kind, buffers, staged):
    # The rounding makes sure one packing it keeps fits every rank's lanes twice; counting
    # the pulled edges alone kept 31 staged trees of a bonded HGX A100 dump's broadcast,
    # which doubled shared lanes and ran slower than on one lane each.
    from collectx.planner.program import lanes_per_turn
    packing, modes, collective = _packing(kind, staged)
    per_group = 6 if collective == "allreduce" and "forest" in kind else 22
    s = trees.lower(packing, modes, collective, NRANKS, per_group, buffers=buffers)
    taken = max(len(rank_lanes) for rank_lanes in s.lanes)
    assert taken - buffers * lanes_per_turn(packing.trees, modes) in (0, 1)   # own slot


def _random_tree(rng, group, root: int, n: int) -> Tree:
    """A random spanning tree of ``n`` ranks from ``root``, edges top-down, some staged."""
    order = [root] + rng.sample([v for v in range(n) if v != root], n - 1)
    edges = tuple((rng.choice(order[:i]), v) for i, v in enumerate(order) if i)
    staged = lambda: tuple(i for i in range(len(edges)) if rng.random() < 0.3)  # noqa: E731
    return Tree(group, root, edges, (), 1.0, staged=staged(), staged_up=staged())


@needs_native
@pytest.mark.parametrize("seed", range(24))
def test_random_packings_lower_as_the_reference(seed):
    """Random trees of 2-9 ranks, random chunk counts, staging and buffers: the compiled words
    are the reference's schedule."""
    rng = random.Random(seed)
    n, per_group, buffers = rng.randint(2, 9), rng.randint(1, 30), rng.randint(1, 2)
    collective = rng.choice(["broadcast", "reduce", "allreduce", "allgather", "reduce_scatter"])
    if collective in ("allgather", "reduce_scatter") or rng.random() < 0.5:   # a forest
        ways = {"allgather": (DOWN,), "reduce_scatter": (UP,)}.get(collective, (UP, DOWN))
        collective = "allreduce" if len(ways) == 2 else collective
        modes = {w * n + r: mode for w, mode in enumerate(ways) for r in range(n)}
        per_group -= per_group % 2 if collective == "allreduce" else 0
        per_group = max(per_group, 2)
        tree_list = [_random_tree(rng, g, g % n, n) for g in modes for _ in range(2)]
    else:
        modes = {0: {"broadcast": DOWN, "reduce": UP, "allreduce": BOTH}[collective]}
        root = rng.randrange(n)
        tree_list = [_random_tree(rng, 0, root, n) for _ in range(rng.randint(1, 3))]
    packing, root = Packing(1.0, tuple(tree_list)), tree_list[0].root
    c, py = (_lowered(packing, modes, collective, per_group, buffers, native, n, root)
             for native in (True, False))
    assert c.code == py.to_packed()["code"] and c.unpacked() == py
    assert (c.scratch_units, c.host_units) == (py.scratch_units, py.host_units)
    verify(py)


@needs_native
def test_plans_are_the_same_through_the_c_lowering(monkeypatch):
    """Whole plans (their candidates lowered both ways): blink both ways, forest, with
    host-staged edges and double buffering among them."""
    import collectx.topology as topo
    from collectx.planner import plan
    G = topo.load("dgx1v")
    cases = (("allreduce", [0, 1, 2, 5]), ("allgather", [0, 1, 3, 4, 5, 7]),
             ("reduce_scatter", [0, 2, 3, 4]), ("broadcast", [0, 1, 2, 3, 5, 6, 7]))
    native = [plan(G, coll, 1 << 30, gpus=gpus, verify=False).schedule for coll, gpus in cases]
    assert any(s.uses_host for s in native)
    monkeypatch.setattr(ts, "compiled_helper", lambda name: None)
    python = [plan(G, coll, 1 << 30, gpus=gpus, verify=False).schedule for coll, gpus in cases]
    assert [s.to_json() for s in native] == [s.to_json() for s in python]


def test_chunk_refs_is_data_and_a_ref_fn():
    refs = chunk_refs("input", 3)
    assert isinstance(refs, ChunkRefs) and (refs.buf, refs.per_root) == ("input", 3)
    assert refs(2, 1, 2, Share(4, (), (1, 2))) == Ref(2, "input", 13, 2)
    assert chunk_refs("output")(0, 5, 1, Share(4, (), (5,))) == Ref(0, "output", 5, 1)


CODES = ts._CODES


def _args(**change):
    """lower_words' arguments for a 3-rank broadcast down the path 0 -> 1 -> 2, the edge
    1 -> 2 staged through host memory, with ``change`` replacing some."""
    share = (0, ((0, 1), (1, 2)), ((0, 1), (1, 1)), (False, True), (False, False))
    args = dict(nranks=3, nchunks=2, lanes=64, turns=1, codes=CODES, scratch=[0, 0, 0],
                host=[0, 0, 0], phases=[(2, (share,), (0, 0), (1, 0), False)])
    args.update(change)
    return list(args.values())


@needs_native
def test_lower_words_reserves_the_host_chunks_it_hands_out():
    args = _args()
    words = LOWER(*args)
    assert isinstance(words, bytes) and len(words) % 8 == 0
    assert args[5] == [0, 0, 0] and args[6] == [0, 1, 0]   # rank 1 stages both chunks


def _bad_share(**change):
    share = dict(root=0, edges=((0, 1), (1, 2)), pieces=((0, 1),), down=(False, False),
                 up=(False, False))
    share.update(change)
    return [(2, (tuple(share.values()),), (0, 0), (1, 0), False)]


@needs_native
@pytest.mark.parametrize("change, error, match", [
    (dict(nranks=0), ValueError, "nranks"),
    (dict(turns=0), ValueError, "turns"),
    (dict(nchunks=1 << 40), ValueError, "nchunks"),
    (dict(codes=(0, 1)), TypeError, "codes"),
    (dict(scratch=[0, 0]), TypeError, "scratch"),
    (dict(host=[0, 0, -1]), ValueError, "host"),
    (dict(phases=()), TypeError, "phases must be a list"),
    (dict(phases=[(3, (), (0, 0), (1, 0))]), ValueError, "phase kind"),
    (dict(phases=[(0, 1)]), TypeError, "4 or 5 fields"),
    (dict(phases=[(0, 0, (0, 1, 0, 1), "ref")]), TypeError, "Ref"),
    (dict(phases=[(0, 0, (5, 1, 0, 1), (0, 0, 0, 1))]), ValueError, "Ref rank 5"),
    (dict(phases=[(2, (), (0, 0), (1, 1 << 50), False)]), ValueError, "per_root"),
    (dict(phases=_bad_share(root=3)), ValueError, "root"),
    (dict(phases=_bad_share(edges=((0, 1), (1, 7)))), ValueError, "tree edge"),
    (dict(phases=_bad_share(edges=((1, 2), (0, 1)))), ValueError, "top-down"),
    (dict(phases=_bad_share(pieces=((0,),))), TypeError, "piece"),
    (dict(phases=_bad_share(down=(False,))), TypeError, "staged down"),
])
def test_malformed_arguments_raise_and_change_nothing(change, error, match):
    args = _args(**change)
    units = [list(args[5]), list(args[6])]
    with pytest.raises(error, match=match):
        LOWER(*args)
    assert [args[5], args[6]] == units


@needs_native
def test_a_reduction_over_a_tree_that_reaches_a_node_twice_is_refused():
    share = (0, ((0, 1), (0, 2), (1, 2)), ((0, 1),), (False,) * 3, (False,) * 3)
    with pytest.raises(ValueError, match="reach each node once"):
        LOWER(*_args(phases=[(1, (share,), (0, 0), (1, 0))]))
    with pytest.raises(TypeError, match="lower_words"):
        LOWER()


def test_a_native_emitter_needs_a_builder_fresh_never_used():
    b = ScheduleBuilder("allreduce", 2, 4)
    assert b.unit_tables() == ([0, 0], [0, 0])
    b.fresh("scratch", 0, Ref(0, "input", 1))
    with pytest.raises(ArgumentError, match="fresh"):
        WordEmitter(b, LOWER).flush()
