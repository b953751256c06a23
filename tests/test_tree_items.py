"""The tree emitter's items built in C (collectx._fastpath.tree_broadcast and tree_reduce) are
the Python loops' items, item for item, and so the schedules are the same byte for byte."""

from __future__ import annotations

import sys

import pytest

import collectx.planner.treesched as ts
from collectx.planner import trees
from collectx.planner.program import BOTH, DOWN, UP
from collectx.planner.treepack import Packing, Tree
from collectx.planner.treesched import ChunkRefs, Share, TreeEmitter, chunk_refs
from collectx.schedule import ScheduleBuilder, verify
from collectx.schedule.ir import Ref

NATIVE = ("tree_broadcast", "tree_reduce")
REAL_HELPER = ts.compiled_helper
needs_native = pytest.mark.skipif(
    any(REAL_HELPER(name) is None for name in NATIVE), reason="no compiled collectx._fastpath")

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
        return Packing(1.0, tuple(tree_list), 0), {0: mode}, collective
    modes = {"allgather": (DOWN,), "reduce_scatter": (UP,), "allreduce": (UP, DOWN)}[collective]
    groups, out = {}, []
    for w, mode in enumerate(modes):
        for r in range(NRANKS):
            g = w * NRANKS + r
            groups[g] = mode
            for t in _trees(g, r, staged):
                out.append(t if mode == DOWN else
                           Tree(g, r, t.edges, (), 1.0, staged_up=t.staged))
    return Packing(1.0, tuple(out), 0), groups, collective


def _lowered(packing, modes, collective, per_group, buffers, native: bool):
    """The schedule of ``packing`` and the items each flush dealt, through the C item loops
    or the Python ones; also how often the C loops ran."""
    seen, calls = [], {name: 0 for name in NATIVE}
    flush = TreeEmitter.flush

    def recording(self, *args):
        seen.append(list(self._items))
        return flush(self, *args)

    def counted(name):
        fn = REAL_HELPER(name)
        if name not in NATIVE:
            return fn
        if not native:
            return None

        def call(*args):
            calls[name] += 1
            return fn(*args)
        return call

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ts, "compiled_helper", counted)
        mp.setattr(TreeEmitter, "flush", recording)
        s = trees.lower(packing, modes, collective, NRANKS, per_group, buffers=buffers)
    return s, seen, calls


KINDS = ["broadcast/blink", "reduce/blink", "allreduce/blink", "allgather/forest",
         "reduce_scatter/forest", "allreduce/forest"]


@needs_native
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("buffers", [1, 2])
@pytest.mark.parametrize("staged", [False, True], ids=["direct", "host"])
def test_c_items_are_the_python_items(kind, buffers, staged):
    packing, modes, collective = _packing(kind, staged)
    per_group = 14 if "forest" in kind else 22   # pieces of 2 chunks and 1 on two buffers
    if collective == "allreduce" and "forest" in kind:
        per_group = 3 * 2   # the chunks of each root: a multiple of the trees per group
    c, c_items, calls = _lowered(packing, modes, collective, per_group, buffers, True)
    py, py_items, _ = _lowered(packing, modes, collective, per_group, buffers, False)
    assert calls["tree_broadcast"] or calls["tree_reduce"]
    assert c_items == py_items and sum(map(len, c_items)) > 0
    pairs = any(item[5].count == 2 for items in c_items for item in items)
    assert pairs == (buffers == 2)   # double buffering moves pieces of two chunks
    assert c.to_json() == py.to_json()
    assert c.uses_host == staged
    verify(c)


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


@needs_native
def test_plans_are_the_same_through_the_c_item_loops(monkeypatch):
    """Whole plans (their candidates lowered through both loops): blink both ways, forest,
    with host-staged edges and double buffering among them."""
    import collectx.topology as topo
    from collectx.planner import plan
    G = topo.load("dgx1v")
    cases = (("allreduce", [0, 1, 2, 5]), ("allgather", [0, 1, 3, 4, 5, 7]),
             ("reduce_scatter", [0, 2, 3, 4]), ("broadcast", [0, 1, 2, 3, 5, 6, 7]))
    native = [plan(G, coll, 1 << 30, gpus=gpus, verify=False).schedule for coll, gpus in cases]
    assert any(s.uses_host for s in native)
    monkeypatch.setattr(ts, "compiled_helper",
                        lambda name: None if name in NATIVE else REAL_HELPER(name))
    python = [plan(G, coll, 1 << 30, gpus=gpus, verify=False).schedule for coll, gpus in cases]
    assert [s.to_json() for s in native] == [s.to_json() for s in python]


def _emitter(buffers=1):
    return TreeEmitter(ScheduleBuilder("allreduce", 3, 4), buffers=buffers)


@needs_native
def test_a_ref_fn_that_is_not_chunk_refs_keeps_the_python_loops(monkeypatch):
    called = []
    monkeypatch.setattr(ts, "compiled_helper",
                        lambda name: called.append(name) or REAL_HELPER(name))
    share = Share(0, ((0, 1), (1, 2)), (0, 1, 2, 3), staged=frozenset({(1, 2)}))
    own = lambda v, j, k, s: Ref(v, "output", j, k)   # noqa: E731
    python, native = _emitter(), _emitter()
    python.broadcast([share], src=chunk_refs("input"), dst=own)
    monkeypatch.setattr(ts, "compiled_helper", REAL_HELPER)
    native.broadcast([share], src=chunk_refs("input"), dst=chunk_refs("output"))
    assert called == ["tree_broadcast"] and python._items == native._items
    assert ts._native_or(python._broadcast_share, "tree_broadcast", own) == \
        python._broadcast_share


def test_chunk_refs_is_data_and_a_ref_fn():
    refs = chunk_refs("input", 3)
    assert isinstance(refs, ChunkRefs) and (refs.buf, refs.per_root) == ("input", 3)
    assert refs(2, 1, 2, Share(4, (), (1, 2))) == Ref(2, "input", 13, 2)
    assert chunk_refs("output")(0, 5, 1, Share(4, (), (5,))) == Ref(0, "output", 5, 1)


def _broadcast_args(em, **change):
    """tree_broadcast's arguments for one share of ``em`` (as TreeEmitter.broadcast passes
    them), with ``change`` replacing some."""
    share = Share(0, ((0, 1), (1, 2)), (0, 1))
    args = dict(items=em._items, hop=em._hop, number=0, share=share, pieces=em.pieces(share),
                keyed=[[(p, c, ("down", p, 0, 0), False) for p, c in share.edges]],
                src=chunk_refs("input"), dst=chunk_refs("output"), after={})
    args.update(change)
    return list(args.values())


def _reduce_args(em, **change):
    share = Share(0, ((0, 1), (1, 2)), (0, 1), staged_up=frozenset({(1, 2)}))
    args = dict(items=em._items, fresh=em.b.fresh, through_host=em._through_host, number=0,
                share=share, pieces=em.pieces(share),
                shapes=[ts._ReduceShape.of(share, (0, 0))], contrib=chunk_refs("input"),
                result=chunk_refs("output"), done={})
    args.update(change)
    return list(args.values())


@needs_native
def test_the_c_loops_take_and_return_what_the_python_ones_do():
    for make, name, method in ((_broadcast_args, "tree_broadcast", "_broadcast_share"),
                               (_reduce_args, "tree_reduce", "_reduce_share")):
        c, py = _emitter(), _emitter()
        c_args, py_args = make(c), make(py)
        assert REAL_HELPER(name)(*c_args) is None
        getattr(py, method)(*py_args)
        assert c._items == py._items and c_args[-1] == py_args[-1]


@needs_native
@pytest.mark.parametrize("change, error, match", [
    (dict(pieces=[(0,)]), TypeError, "pieces"),
    (dict(pieces=[("0", 1)]), TypeError, "pieces"),
    (dict(keyed=[[(0, 1, "key")]]), TypeError, "keyed"),
    (dict(keyed=[[(0, -1, "key", False)]]), ValueError, "not a rank"),
    (dict(keyed=[]), ValueError, "at least one turn"),
    (dict(keyed=[[(1, 2, "key", False)]]), KeyError, "1"),   # a parent the piece has not reached
    (dict(src=lambda v, j, k, s: None), TypeError, "ChunkRefs"),
    (dict(dst=ChunkRefs(3)), TypeError, "ChunkRefs"),
    (dict(after=[]), TypeError, "after must be a dict"),
    (dict(after={(0, 0): (None,)}), ValueError, "token, time"),
    (dict(items=()), TypeError, "items must be a list"),
    (dict(share=Share(1 << 40, (), (0,))), ValueError, "not a rank"),
    (dict(dst=ChunkRefs("output", 1 << 50)), OverflowError, "per_root"),
    (dict(pieces=[(1 << 70, 1)]), OverflowError, "int"),
])
def test_malformed_broadcast_arguments_raise(change, error, match):
    with pytest.raises(error, match=match):
        REAL_HELPER("tree_broadcast")(*_broadcast_args(_emitter(), **change))


@needs_native
@pytest.mark.parametrize("change, error, match", [
    (dict(shapes=[object()]), AttributeError, "leaves"),
    (dict(shapes=[]), ValueError, "at least one turn"),
    (dict(through_host=lambda *a: None), TypeError, "through_host returned"),
    (dict(fresh=lambda *a: 1 / 0), ZeroDivisionError, "division"),
    (dict(contrib=ChunkRefs("input", "x")), TypeError, "ChunkRefs"),
    (dict(done=None), TypeError, "done must be a dict"),
])
def test_malformed_reduce_arguments_raise(change, error, match):
    with pytest.raises(error, match=match):
        REAL_HELPER("tree_reduce")(*_reduce_args(_emitter(), **change))


@needs_native
def test_wrong_argument_counts_raise_type_error():
    for name in NATIVE:
        with pytest.raises(TypeError, match=name):
            REAL_HELPER(name)()


@needs_native
def test_errors_release_what_they_held():
    """References the C loops took (lane keys, tokens, Refs) are released on error paths as
    on success: the objects' reference counts come back."""
    key, token = ("down", object()), object()
    before = sys.getrefcount(key), sys.getrefcount(token)
    shape = ts._ReduceShape(leaves=(2,), inner=((1, (2,), 1, key, frozenset()),
                                                (0, (1, 3), 2, key, frozenset())), top=2)
    for _ in range(50):
        em = _emitter()
        args = _broadcast_args(em, keyed=[[(0, 1, key, False), (2, 0, key, False)]],
                               after={(0, 0): (token, 0.25)})
        with pytest.raises(KeyError):   # 2 is not reached before it sends
            REAL_HELPER("tree_broadcast")(*args)
        with pytest.raises(KeyError):   # 3 is no node of the tree
            REAL_HELPER("tree_reduce")(*_reduce_args(em, shapes=[shape]))
        assert len(em._items) == 2   # the items appended before the error hold the key
        em._items.clear()
        assert REAL_HELPER("tree_broadcast")(*_broadcast_args(
            em, keyed=[[(0, 1, key, False)]], after={(0, 1): (token, 0.5)})) is None
        assert em._items[-1][7] == (token,)
    del em, args, shape
    assert (sys.getrefcount(key), sys.getrefcount(token)) == before
