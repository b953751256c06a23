"""The native flow loop (cx_sim_fairshare) gives the Python loop's numbers, bit for bit, and
the flat front end (collectx._fastpath.schedule_arrays) gives the graph front end's."""

import pytest

import collectx.topology as topo
from collectx._native import compiled_helper
from collectx.errors import DependencyCycle, MalformedSchedule, NativeError
from collectx.planner import registry
from collectx.planner.api import allocation
from collectx.schedule import Dep, Ref, ScheduleBuilder, simulate
from collectx.schedule import _flat
from collectx.schedule._fairshare import RouteClasses
from collectx.schedule._taskloop import TaskGraph, native_available, run_native, run_python
from collectx.schedule.simulate import forget, time_within

import _dumps as dumps

needs_native = pytest.mark.skipif(not native_available(),
                                  reason="libcollectx without cx_sim_fairshare_stoppable")

CASES = [("dgx1v", None, "allreduce", "blink"), ("dgx1v", None, "allgather", "forest"),
         ("dgx1v", [0, 1, 3, 4, 5, 6, 7], "allreduce", "forest"),
         ("dgx1v", [0, 2, 5], "broadcast", "tree"), ("dgx2", None, "allreduce", "ring"),
         ("mi250_16gcd", None, "allgather", "direct"),
         ("multi:dgx_a100:2:25", None, "allreduce", "hierarchical")]   # engine calls


def _same(a, b):
    assert a.time_us == b.time_us
    assert a.link_bytes == b.link_bytes and a.link_util == b.link_util


@needs_native
@pytest.mark.parametrize("name,gpus,coll,algo", CASES)
@pytest.mark.parametrize("nbytes", [8 << 10, 1 << 30])
def test_native_matches_python_on_planned_schedules(name, gpus, coll, algo, nbytes):
    ranks, view = allocation(topo.load(name), gpus)
    s = registry.call(algo, view, ranks, coll, nbytes)
    got = simulate(s, view, nbytes, ranks=list(ranks), native=True)
    _same(got, simulate(s, view, nbytes, ranks=list(ranks), native=False))
    assert got.time_us > 0


@needs_native
@pytest.mark.parametrize("coll,algo", [("allreduce", "blink"), ("allgather", "forest")])
def test_native_matches_python_on_a_switched_machine_with_host_staging(coll, algo):
    # Host-staged routes share PCIe and host links in groups that come and go: nearly every
    # event refills a few hundred route classes, in the native loop as in Python's.
    ranks, view = allocation(dumps.load("hgx_h100_nccl_topo.xml"), None)
    s = registry.call(algo, view, ranks, coll, 1 << 30, host=True, nchunks=32)
    assert s.algorithm.endswith("+host")
    _same(simulate(s, view, 1 << 30, ranks=list(ranks), native=True),
          simulate(s, view, 1 << 30, ranks=list(ranks), native=False))


@needs_native
def test_a_run_given_up_returns_a_lower_bound_past_the_time_to_beat():
    # A candidate that must beat a time is dropped once some link still holds more bytes
    # than it can carry by then; one that ends in time gets its full simulated time.
    ranks, view = allocation(topo.load("dgx1v"), None)
    s = registry.call("blink", view, ranks, "allreduce", 1 << 30, nchunks=64)
    full = simulate(s, view, 1 << 30, ranks=list(ranks)).time_us
    forget()
    bound = time_within(s, view, 1 << 30, 0.5 * full, ranks=list(ranks))
    assert 0.5 * full < bound < full
    assert time_within(s, view, 1 << 30, 2 * full, ranks=list(ranks)) == full


@needs_native
def test_a_run_whose_stop_flag_is_set_stops_and_leaves_nothing_remembered(monkeypatch):
    # A planner that no longer wants a result sets the flag; the run then raises, and a later
    # run of the same schedule is simulated in full.
    import numpy as np

    from collectx.schedule import _taskloop
    ranks, view = allocation(topo.load("dgx1v"), None)
    s = registry.call("blink", view, ranks, "allreduce", 1 << 30, nchunks=64)
    forget()
    with monkeypatch.context() as m:
        m.setattr(_taskloop, "stop_flag", lambda: np.ones(1, dtype=np.int32))
        with pytest.raises(_taskloop.Stopped):
            time_within(s, view, 1 << 30, float("inf"), ranks=list(ranks))
    assert time_within(s, view, 1 << 30, float("inf"), ranks=list(ranks)) == \
        simulate(s, view, 1 << 30, ranks=list(ranks)).time_us > 0


needs_flat = pytest.mark.skipif(compiled_helper("schedule_arrays") is None
                                or not native_available(),
                                reason="collectx._fastpath without schedule_arrays")


def _graph_front_end(monkeypatch, fn):
    import importlib
    sim = importlib.import_module("collectx.schedule.simulate")
    with monkeypatch.context() as m:
        m.setattr(sim, "flat_tasks", lambda *a: None)
        sim._SEEN.clear()
        return fn()


@needs_flat
@pytest.mark.parametrize("name,gpus,coll,algo", [("dgx1p", [0, 2, 3, 4, 6, 7], "allreduce", None),
                                                 ("dgx1v", [1, 2, 3, 5, 6, 7], "broadcast", None),
                                                 ("dgx1p", None, "allgather", None),
                                                 ("mi250_16gcd", None, "reduce_scatter", None),
                                                 ("mi250_16gcd", None, "reduce_scatter",
                                                  "direct")])
def test_flat_front_end_matches_the_graph_front_end(monkeypatch, name, gpus, coll, algo):
    # Planned schedules with host buffers, scratch chunks and reduces of many sources (16-way
    # reduces: too many source columns for one int64 key, so rows are sorted as they are).
    from collectx.planner import plan
    G = topo.load(name)
    p = plan(G, coll, 1 << 30, gpus=gpus, verify=False, algo=algo)
    assert _flat.flat_tasks(p.schedule, list(p.ranks), list(p.ranks), lambda a, b: [],
                            lambda c, n: n) is not None
    for nbytes in (8 << 10, 1 << 30):
        got = simulate(p.schedule, G, nbytes, ranks=list(p.ranks))
        _same(got, _graph_front_end(monkeypatch, lambda: simulate(
            p.schedule, G, nbytes, ranks=list(p.ranks))))


@needs_flat
@pytest.mark.parametrize("name,gpus,coll", [("dgx1p", [0, 2, 3, 4, 6, 7], "allreduce"),
                                            ("dgx1v", [1, 2, 3, 5, 6, 7], "broadcast"),
                                            ("dgx2", None, "allgather")])
def test_simulated_schedules_know_the_rank_pairs_their_instructions_name(name, gpus, coll):
    # The pairs cost.link_class prices come from the flat front end once a schedule has been
    # simulated, and must be those a walk over every instruction finds.
    import importlib
    from collectx.planner import cost, plan
    sim = importlib.import_module("collectx.schedule.simulate")
    G = topo.load(name)
    p = plan(G, coll, 1 << 30, gpus=gpus, verify=False)
    simulate(p.schedule, G, 1 << 30, ranks=list(p.ranks))
    walked = {(other, rank) for rank, lanes in enumerate(p.schedule.lanes)
              for other in cost._ranks_named(lanes) if other != rank}
    assert sim.known_pairs(p.schedule) == walked and walked
    assert sim.known_pairs(ScheduleBuilder("allreduce", 2, 1).build()) is None   # not run


@needs_flat
@pytest.mark.skipif(compiled_helper("shape_groups") is None,
                    reason="collectx._fastpath without shape_groups")
def test_shapes_grouped_in_c_are_numbered_as_sorted_rows(monkeypatch):
    # Hashing instructions into shapes gives the ids and rows that sorting them gave, on a
    # hand-made set (equal shapes far apart, sources of different counts) and a planned one.
    import numpy as np

    import collectx._native as native
    i32 = lambda xs: np.asarray(xs, dtype=np.int32)  # noqa: E731
    hand = (i32([0, 1, 0, 0, 1]), i32([2, 2, 2, 2, 0]), np.asarray([8, 8, 8, 16, 8]),
            i32([0, 1, 3, 4, 5, 5]), i32([1, 0, 2, 1, 2]))
    ids, first = compiled_helper("shape_groups")(*hand)
    assert np.frombuffer(ids, dtype=np.int32).tolist() == [0, 1, 0, 2, 3]
    assert np.frombuffer(first, dtype=np.int64).tolist() == [0, 1, 3, 4]
    with pytest.raises(ValueError, match="src_off"):
        compiled_helper("shape_groups")(*hand[:3], i32([0, 1]), hand[4])
    ranks, view = allocation(topo.load("dgx1v"), None)
    s = registry.call("blink", view, ranks, "allreduce", 1 << 24)
    seen, shapes = [], _flat._shapes
    monkeypatch.setattr(_flat, "_shapes", lambda *a: seen.append(a) or shapes(*a))
    forget()
    simulate(s, view, 1 << 24, ranks=list(ranks))
    grouped = shapes(*seen[0])
    monkeypatch.setattr(native, "compiled_helper",
                        lambda name, f=native.compiled_helper: None if name == "shape_groups"
                        else f(name))
    ids, rows = shapes(*seen[0])
    assert np.array_equal(grouped[0], ids) and np.array_equal(grouped[1], rows)
    assert len(rows) < len(ids)


@needs_flat
def test_flat_walk_numbers_nodes_and_edges_as_build_graph():
    import numpy as np
    from collectx import _native
    from collectx.schedule._graph import build_graph
    b = ScheduleBuilder("allgather", 2, nchunks=2)
    a0 = b.copy(0, 1, Ref(0, "output", 0), Ref(0, "input", 0))
    a1 = b.copy(1, 0, Ref(1, "host", 0), Ref(1, "input", 0))
    b.copy(0, 1, Ref(0, "output", 2), Ref(1, "host", 0), deps=[a1, a0])   # a0: lane order too
    b.reduce(1, 2, Ref(1, "output", 2, 2), [Ref(1, "input", 0), Ref(0, "output", 0)],
             deps=[a0])
    s = b.build()
    *raw, longest = _native._compiled_module().schedule_arrays(s.lanes)
    arrays = [np.frombuffer(x, dtype=np.int32).tolist() for x in raw]
    rank, dst_rank, dst_buf, dst_chunk, dst_count, src_off, src_rank, src_host, \
        pred_off, preds, succ_off, succs = arrays
    g = build_graph(s)
    assert [preds[pred_off[v]:pred_off[v + 1]] for v in range(len(g))] == \
        [list(p) for p in g.preds]
    assert rank == [d.rank for d in g.ids] == [0, 0, 1, 1]
    assert dst_buf == [2, 2, 1, 2] and dst_count == [1, 1, 1, 2] and dst_chunk == [0, 2, 0, 2]
    assert src_rank == [0, 1, 1, 1, 0] and src_host == [0, 1, 0, 0, 0]
    assert src_off == [0, 1, 2, 3, 5]
    assert succs == [1, 3, 1] and succ_off == [0, 2, 2, 3, 3]
    assert longest == 2


@needs_flat
@pytest.mark.parametrize("name,gpus,coll", [("dgx1p", None, "allreduce"),
                                            ("dgx1v", [0, 1, 2, 4, 6], "allreduce"),
                                            ("dgx1v", [0, 2, 5], "broadcast")])
def test_critical_path_of_a_simulated_candidate_is_the_graph_walk(name, gpus, coll):
    from collectx.planner import cost, plan
    from collectx.schedule._graph import build_graph, depths, topo_order
    from collectx.schedule.simulate import known_steps
    G = topo.load(name)
    p = plan(G, coll, 1 << 30, gpus=gpus, verify=False)
    simulate(p.schedule, G, 1 << 20, ranks=list(p.ranks))
    g = build_graph(p.schedule)
    assert known_steps(p.schedule) == cost.steps(p.schedule) == max(depths(g, topo_order(g)))


@needs_flat
def test_flat_walk_leaves_engine_steps_and_bad_deps_to_the_graph_path():
    from collectx import _native
    walk = _native._compiled_module().schedule_arrays
    b = ScheduleBuilder("allreduce", 2, nchunks=1)
    for r in range(2):
        b.engine(r, 0, Ref(r, "output", 0), [Ref(r, "input", 0)], "allreduce", (0, 1))
    assert walk(b.build().lanes) is None
    b = ScheduleBuilder("broadcast", 2, nchunks=1)
    b.copy(1, 0, Ref(1, "output", 0), Ref(0, "input", 0), deps=[Dep(0, 3, 0)])
    s = b.build()
    assert walk(s.lanes) is None
    with pytest.raises(MalformedSchedule, match="rank 0 lane 3 instr 0"):
        simulate(s, topo.ring(2, bw=10.0), 64)
    assert walk(((object(),),)) is None and walk("lanes") is None


@needs_flat
def test_flat_front_end_names_an_instruction_of_a_cycle():
    b = ScheduleBuilder("broadcast", 2, nchunks=2)
    b.copy(0, 0, Ref(0, "output", 0), Ref(0, "input", 0), deps=[Dep(1, 0, 0)])
    b.copy(1, 0, Ref(1, "output", 0), Ref(0, "output", 0), deps=[Dep(0, 0, 0)])
    s = b.build()
    assert _flat.flat_tasks(s, ["GPU0", "GPU1"], ["GPU0", "GPU1"], lambda a, b: [],
                            lambda c, n: n).longest == -1
    with pytest.raises(DependencyCycle, match="2 instructions never became ready"):
        simulate(s, topo.ring(2, bw=10.0), 64)
    with pytest.raises(DependencyCycle):
        from collectx.planner.cost import steps
        steps(s)


@needs_native
def test_native_matches_python_with_zero_byte_flows():
    # 3 elements over 4 chunks: chunk 3 is empty, so some flows carry nothing.
    b = ScheduleBuilder("allgather", 3, nchunks=4, algorithm="ring")
    for r in range(3):
        for c in range(4):
            b.copy(r, c, Ref((r + 1) % 3, "output", 4 * r + c), Ref(r, "input", c))
            b.copy(r, c, Ref(r, "output", 4 * r + c), Ref(r, "input", c))
    s = b.build()
    G = topo.ring(3, bw=10.0)
    _same(simulate(s, G, 36, dtype_size=4, native=True),
          simulate(s, G, 36, dtype_size=4, native=False))


def _toy_graph():
    classes = RouteClasses()
    a, b = classes.class_of((0,)), classes.class_of((0, 1))
    # task 0 moves 100 B over resource 0 while task 1 shares it; task 2 waits for task 0.
    return TaskGraph(parts=[[(100.0, a, 1.0)], [(50.0, b, 0.0)], [(10.0, b, 0.5)]],
                     members=[(0,), (1,), (2,)], node_task=[0, 1, 2],
                     succs=[[2], [], []], npreds=[0, 0, 1]), classes


@needs_native
def test_native_and_python_agree_on_a_hand_computed_graph():
    tg, classes = _toy_graph()
    cap = [10.0, 4.0]
    # t in [0, 1): class b alone at 4 B/us (link 1 is its bottleneck); then b keeps 4 and a
    # gets link 0's other 6 B/us. b ends at 1 + 46/4 = 12.5, with 69 B of a moved; a then has
    # link 0 alone and ends 31/10 later, at 15.6; task 2 starts 0.5 later, alone at 4 B/us.
    want = 1 + 46 / 4 + 31 / 10 + 0.5 + 10 / 4
    for run in (run_native, run_python):
        t, order = run(tg, cap, classes)
        assert t == pytest.approx(want, rel=1e-12)
        assert order == [0, 1, 2]


@needs_native
def test_native_rejects_an_out_of_range_class():
    tg, classes = _toy_graph()
    tg.parts[0] = [(100.0, 7, 1.0)]
    with pytest.raises(NativeError, match="cx_sim_fairshare"):
        run_native(tg, [10.0, 4.0], classes)


@needs_native
def test_native_run_ignores_routes_numbered_while_it_starts(monkeypatch):
    # Planners simulate candidates on threads that share one route table: a route another
    # thread numbers after this run took its snapshot of the table must not change the run.
    from collectx.schedule import _taskloop
    tg, classes = _toy_graph()
    snapshot = _taskloop._class_arrays

    def numbered_meanwhile(capacity, table):
        arrays = snapshot(capacity, table)
        for k in range(64):
            table.class_of((1,) * (k + 2))
        return arrays

    want = run_python(tg, [10.0, 4.0], classes)
    monkeypatch.setattr(_taskloop, "_class_arrays", numbered_meanwhile)
    assert run_native(tg, [10.0, 4.0], classes) == want


@needs_native
def test_native_reports_tasks_left_in_a_cycle():
    tg, classes = _toy_graph()
    tg.npreds[1] = 1
    tg.succs[2] = [1]        # task 1 waits for task 2, which never finishes before it
    tg.npreds[2] = 2
    tg.succs[1] = [2]
    t, order = run_native(tg, [10.0, 4.0], classes)
    assert order == [0] and t == pytest.approx(1 + 100 / 10)
    assert run_python(tg, [10.0, 4.0], classes) == (t, order)


def test_route_classes_are_one_table_when_threads_ask_first_at_once(monkeypatch):
    # Two threads simulating on fresh routes both find no table; each must be handed the
    # table that is kept, or the class ids one numbers mean nothing to the other's run.
    from collectx.schedule import _routes
    from collectx.topology.routes import Routes
    routes = Routes(topo.ring(3, bw=10.0), None)
    handed, asked = [], []

    def meanwhile_another_thread_asks():
        if not asked:
            asked.append(True)
            handed.append(_routes.route_classes(routes))
        return RouteClasses()

    monkeypatch.setattr(_routes, "RouteClasses", meanwhile_another_thread_asks)
    mine = _routes.route_classes(routes)
    assert mine is handed[0] is _routes.route_classes(routes)


def test_route_table_is_shared_by_equal_graphs_only():
    from collectx.schedule._routes import routes_for
    a, b = topo.load("dgx1v"), topo.load("dgx1v")
    assert routes_for(a) is routes_for(b)
    b.edges["GPU0", "GPU1"]["bw_gbps"] = 1.0
    assert routes_for(b) is not routes_for(a)
    assert routes_for(b).capacity != routes_for(a).capacity


def test_route_table_does_not_see_later_edits_of_its_first_graph():
    from collectx.schedule._routes import routes_for
    G = topo.ring(4, bw=10.0)
    table = routes_for(G)
    G.edges["GPU0", "GPU1"]["bw_gbps"] = 99.0           # G now has other content
    fresh = topo.ring(4, bw=10.0)
    assert routes_for(fresh) is table
    assert table.route("GPU0", "GPU1") == routes_for(topo.ring(4, bw=10.0)).route("GPU0", "GPU1")
    assert table.topo.edges["GPU0", "GPU1"]["bw_gbps"] == 10.0


@pytest.mark.parametrize("name", ["dgx1v", "dgx2", "pcie_gen4_8gpu", "multi:dgx_a100:2:25"])
def test_route_table_takes_the_widest_paths(name):
    # The table prepares each region's links once; its routes must be widest_path's.
    from collectx.schedule._routes import Routes
    from collectx.topology.paths import widest_path
    G = topo.load(name)
    table = Routes(G, None)
    ids = topo.gpus(G)
    for a in ids[:3]:
        for b in ids:
            if a != b and not G.has_edge(a, b):
                hops = widest_path(table._region(a, b), a, b).hops
                want = tuple(table._index[e] for e in zip(hops, hops[1:]))
                assert table.route(a, b)[0] == want
