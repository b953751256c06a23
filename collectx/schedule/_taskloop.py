"""Run a schedule's task graph through the fair-share flow loop, natively or in Python.

:func:`.simulate.simulate` turns a schedule into a :class:`TaskGraph`: tasks (one instruction,
or one engine call), the flows each queues when it starts, and the happens-before edges between
instruction nodes. :func:`run` plays it: a task starts when any of its member nodes has no
unfinished predecessor, and finishes with its last flow. libcollectx's ``cx_sim_fairshare``
does this in native code when the library is there (planning simulates every candidate, and
the Python loop was most of the planning time); :func:`run_python` is the same loop over
:class:`._fairshare.FlowLoop` and gives the same numbers. Copy/reduce schedules reach the
native loop as flat arrays without a :class:`TaskGraph` (:mod:`._flat`, :func:`run_arrays`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .._concurrent import stop_flag
from ..errors import NativeError
from ._fairshare import FlowLoop, RouteClasses


@dataclasses.dataclass
class TaskGraph:
    """What a simulation runs: per task its flows and member nodes, per node its successors.

    ``parts[t]`` lists ``(bytes, route class, latency_us)``; ``npreds[v]`` counts the
    predecessors node ``v`` waits for (a node listed twice as a predecessor counts twice).
    """

    parts: list[list[tuple[float, int, float]]]
    members: list[tuple[int, ...]]
    node_task: list[int]
    succs: list[list[int]]
    npreds: list[int]


def run(tg: TaskGraph, capacity: list[float], classes: RouteClasses, *,
        native: bool | None = None, finish_us: np.ndarray | None = None
        ) -> tuple[float, list[int]]:
    """``(time of the last completion, tasks in start order)``; ``finish_us`` (float64, one
    per task), where given, receives when each task finished.

    ``native=None`` uses libcollectx when it provides the simulator, else Python; True
    requires the library (NativeUnavailable without it), False forces Python.
    """
    if native is None:
        native = native_available()
    run_loop = run_native if native else run_python
    return run_loop(tg, capacity, classes, finish_us)


def run_python(tg: TaskGraph, capacity: list[float], classes: RouteClasses,
               finish_us: np.ndarray | None = None) -> tuple[float, list[int]]:
    """The event loop in Python (:class:`._fairshare.FlowLoop`)."""
    waiting = list(tg.npreds)
    flows_left = [0] * len(tg.parts)
    flow_task: list[int] = []
    started = [False] * len(tg.parts)
    order: list[int] = []

    def start(t: int) -> None:
        if started[t]:
            return
        started[t] = True
        order.append(t)
        flows_left[t] = len(tg.parts[t])
        for nb, cls, lat in tg.parts[t]:
            flow_task.append(t)
            loop.add_class(nb, cls, lat)
        if not tg.parts[t]:
            finish(t)

    def finish(t: int) -> None:
        if finish_us is not None:
            finish_us[t] = loop.now
        for v in tg.members[t]:
            for w in tg.succs[v]:
                waiting[w] -= 1
                if waiting[w] == 0:
                    start(tg.node_task[w])

    def on_flow_done(f: int, now: float) -> None:
        t = flow_task[f]
        flows_left[t] -= 1
        if flows_left[t] == 0:
            finish(t)

    loop = FlowLoop(capacity, on_flow_done, classes)
    for v, n in enumerate(waiting):
        if n == 0:
            start(tg.node_task[v])
    return loop.run(), order


def native_available() -> bool:
    """Whether libcollectx loads and has ``cx_sim_fairshare_timed`` (an older build may
    not)."""
    try:
        _library()
    except Exception:  # no library, no cffi, or one that fails to load: use Python
        return False
    return True


@functools.lru_cache(maxsize=1)
def _library():
    """``(ffi, lib)`` declaring only the simulator section of collectx.h.

    The full header takes cffi about 0.2 s to parse, a visible share of a process's first
    plan; the section alone takes a few milliseconds. The library is the one
    :func:`collectx._native.load` would open.
    """
    import cffi

    from .. import _native
    from ..config import get_config
    path = next((p for p in _native.candidate_paths(get_config().native_lib) if p.is_file()),
                None)
    if path is None:
        raise FileNotFoundError("libcollectx not found")
    text = _native._find_header(path).read_text()
    start = text.index("/* ---- flow simulator")
    end = text.index("/* ---- end flow simulator")
    ffi = cffi.FFI()
    ffi.cdef(text[start:end])
    lib = ffi.dlopen(str(path))
    lib.cx_sim_fairshare_timed  # noqa: B018  (raises AttributeError when the build lacks it)
    return ffi, lib


def run_native(tg: TaskGraph, capacity: list[float], classes: RouteClasses,
               finish_us: np.ndarray | None = None) -> tuple[float, list[int]]:
    """The event loop in libcollectx (``cx_sim_fairshare``)."""
    return run_arrays(_flatten(tg), len(tg.parts), len(tg.node_task), capacity, classes,
                      finish_us=finish_us)


class Stopped(Exception):
    """A run stopped by its stop flag (:func:`collectx._concurrent.stop_flag`): its result is
    no longer wanted, and nothing of it is."""


def run_arrays(tasks: dict, ntasks: int, nnodes: int, capacity: list[float],
               classes: RouteClasses, give_up_us: float | None = None,
               finish_us: np.ndarray | None = None) -> tuple[float, list[int] | None]:
    """:func:`run_native` on a task graph already in ``cx_sim_graph``'s arrays (``part_*``,
    ``member*``, ``node_task``, ``succ*``, ``npreds``; see :mod:`._flat`). ``give_up_us``: the
    loop may stop once the run is sure to end later (``cx_sim_fairshare_stoppable``); the time
    is then a lower bound above it, and the order None. ``finish_us`` (float64, one per task),
    where given, receives when each task finished. Raises :class:`Stopped` where the
    calling thread's stop flag was set meanwhile (a planner no longer wants the result)."""
    ffi, lib = _library()
    arrays = dict(tasks, **_class_arrays(capacity, classes))
    g = ffi.new("cx_sim_graph*")
    # The class count comes from the snapshot, not from ``classes``: planners simulate on
    # threads, and another may number a new route after the snapshot was taken.
    g.nres, g.nclasses = len(capacity), len(arrays["class_off"]) - 1
    g.ntasks, g.nnodes = ntasks, nnodes
    for name, a in arrays.items():
        setattr(g, name, ffi.cast("double*" if a.dtype == np.float64 else "int*",
                                  ffi.from_buffer(a)))
    time_us = ffi.new("double*")
    nstarted = ffi.new("int*")
    order = np.zeros(max(ntasks, 1), dtype=np.int32)
    given_up = ffi.new("int*")
    stop = stop_flag()
    if finish_us is not None and (finish_us.dtype != np.float64 or len(finish_us) < ntasks):
        raise ValueError(f"finish_us: {finish_us.dtype} x {len(finish_us)}; expected float64 "
                         f"with one entry per task ({ntasks})")
    rc = lib.cx_sim_fairshare_timed(
        g, np.inf if give_up_us is None else give_up_us,
        ffi.NULL if stop is None else ffi.cast("int*", ffi.from_buffer(stop)), time_us,
        ffi.cast("int*", ffi.from_buffer(order)), nstarted, given_up,
        ffi.NULL if finish_us is None else ffi.cast("double*", ffi.from_buffer(finish_us)))
    if rc != 0:
        raise NativeError(f"cx_sim_fairshare_timed returned {rc} for a {ntasks}-task "
                          "graph; expected 0 (the task graph is malformed: report this as a bug)")
    if given_up[0] == 2:
        raise Stopped(f"a {ntasks}-task simulation stopped at {time_us[0]:.1f} us")
    return time_us[0], None if given_up[0] else order[:nstarted[0]].tolist()


def _csr(rows) -> tuple[np.ndarray, list]:
    off = np.zeros(len(rows) + 1, dtype=np.int32)
    off[1:] = np.cumsum([len(r) for r in rows])
    return off, [x for r in rows for x in r]


def _class_arrays(capacity: list[float], classes: RouteClasses) -> dict:
    """The route table as arrays, a snapshot of the classes numbered so far."""
    class_off, class_res = _csr([classes.links[c] for c in range(len(classes.links))])
    return {"capacity": np.asarray(capacity, dtype=np.float64).reshape(-1),
            "class_off": class_off, "class_res": np.asarray(class_res, dtype=np.int32)}


def _flatten(tg: TaskGraph) -> dict:
    """The task arrays of cx_sim_graph (kept alive by the caller while the call runs)."""
    i32 = lambda xs: np.asarray(xs, dtype=np.int32).reshape(-1)  # noqa: E731
    f64 = lambda xs: np.asarray(xs, dtype=np.float64).reshape(-1)  # noqa: E731
    part_off, parts = _csr(tg.parts)
    member_off, members = _csr(tg.members)
    succ_off, succs = _csr(tg.succs)
    return {"part_off": part_off, "part_bytes": f64([p[0] for p in parts]),
            "part_class": i32([p[1] for p in parts]),
            "part_latency": f64([p[2] for p in parts]), "member_off": member_off,
            "members": i32(members), "node_task": i32(tg.node_task), "succ_off": succ_off,
            "succs": i32(succs), "npreds": i32(tg.npreds)}
