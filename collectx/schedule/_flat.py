"""A schedule's simulator task graph as flat arrays, built without a Python loop per instruction.

:func:`.simulate.simulate` runs every planner candidate; numbering a schedule's instructions,
resolving their dependencies and working out each one's flows in Python took longer than the
native event loop took to play them. Here ``collectx._fastpath.schedule_arrays`` (C) reads the
instructions in one pass, and ``shape_groups`` (C, a hash pass; numpy's row sort where the
build lacks it) groups them by *shape*: executing node, destination node, bytes and source
nodes, which is all that decides an instruction's flows. Flows are worked out
once per shape (a pipelined schedule of thousands of instructions has tens of shapes) and
gathered per instruction into the CSR arrays of ``cx_sim_graph``.

The arrays are those :func:`._taskloop.run_native` flattens from a :class:`._taskloop.TaskGraph`
built by :func:`.simulate._task_graph`, value for value, so both give the same simulation. Only
copy/reduce schedules take this path: engine steps, a missing compiled module, or a schedule the
C pass does not recognise (a malformed one, which the Python path then names) return None.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from .ir import BUFFER_INDEX, OP_INDEX, PackedSchedule, Schedule

# (a, b) -> [(share, route class, latency)]: how a transfer from node a to node b splits
PartsFn = Callable[[object, object], list]


@dataclasses.dataclass
class FlatTasks:
    """One task per instruction: ``arrays`` as ``cx_sim_graph`` takes them (CSR, int32 and
    float64; ``part_bytes`` / ``part_class`` also serve link accounting), ``longest``: the
    instructions on the longest chain of dependent ones (-1: a cycle), and ``pairs()``:
    ``(other, rank)`` wherever an instruction of ``rank`` names a buffer of another rank,
    worked out when first asked (the planner prices only the candidate it keeps, and the
    unique over every instruction's ranks was an eighth of the front end); ``written``: per
    instruction the rank whose output buffer it writes (-1: another buffer), and the first
    chunk and chunk count it writes."""

    ntasks: int
    arrays: dict
    longest: int
    pairs: Callable[[], frozenset] = frozenset
    written: tuple = ()


def flat_tasks(s: Schedule | PackedSchedule, nodes: list, hosts: list, parts: PartsFn,
               size: Callable) -> FlatTasks | None:
    """The task graph of ``s`` as arrays, or None where only the Python path applies.

    ``nodes[r]`` / ``hosts[r]``: where rank ``r``'s device and ``host`` buffers live;
    ``size(chunk, count)``: bytes of runs of chunks, elementwise over int64 arrays.
    """
    got = _walked(s)
    if got is None:
        return None
    (rank, dst_rank, dst_buf, dst_chunk, dst_count, src_off, src_rank, src_host, pred_off,
     preds, succ_off, succs) = (np.frombuffer(b, dtype=np.int32) for b in got[:-1])
    dst_host = dst_buf == 1
    n = len(rank)
    places, dev, host = _places(nodes, hosts)
    shape_ids, shapes = _shapes(rank, dst_rank, dst_host, dst_chunk, dst_count, src_off,
                                src_rank, src_host, dev, host, size)
    flows = [_shape_flows(row, places, parts) for row in shapes]
    part_off, part_bytes, part_class, part_latency = _gather(shape_ids, flows)
    every = np.arange(n + 1, dtype=np.int32)
    return FlatTasks(n, {
        "part_off": part_off, "part_bytes": part_bytes, "part_class": part_class,
        "part_latency": part_latency, "member_off": every, "members": every[:n],
        "node_task": every[:n], "succ_off": succ_off, "succs": succs,
        "npreds": np.diff(pred_off).astype(np.int32)}, got[-1],
        functools.cache(lambda: _pairs(rank, dst_rank, np.repeat(rank, np.diff(src_off)),
                                       src_rank, len(nodes))),
        (np.where(dst_buf == 2, dst_rank, -1), dst_chunk, dst_count))


def _pairs(rank, dst_rank, src_of, src_rank, nranks: int) -> frozenset:
    """``{(other, rank)}`` over destinations and sources on another rank than the executing
    one (``src_of``: the executing rank of each source)."""
    other = np.concatenate([dst_rank, src_rank]).astype(np.int64)
    mine = np.concatenate([rank, src_of]).astype(np.int64)
    keys = np.unique(other[other != mine] * nranks + mine[other != mine])
    return frozenset((int(k) // nranks, int(k) % nranks) for k in keys)


def _walked(s: Schedule | PackedSchedule):
    """What ``collectx._fastpath.schedule_arrays`` reads of ``s``'s instructions (``word_arrays``
    of a packed one's words), or None (the module is not built, or it gives None)."""
    from .._native import compiled_helper
    if isinstance(s, PackedSchedule):
        walk = compiled_helper("word_arrays")
        return None if walk is None else walk(s.code, OP_INDEX["copy"], OP_INDEX["reduce"],
                                              BUFFER_INDEX["host"], BUFFER_INDEX["output"])
    walk = compiled_helper("schedule_arrays")
    return None if walk is None else walk(s.lanes)


def _places(nodes: list, hosts: list) -> tuple[list, np.ndarray, np.ndarray]:
    """Distinct topology nodes, and per rank the index of its device and host node."""
    index: dict = {}
    for x in list(nodes) + list(hosts):
        index.setdefault(x, len(index))
    dev = np.array([index[x] for x in nodes], dtype=np.int32)
    host = np.array([index[x] for x in hosts], dtype=np.int32)
    return list(index), dev, host


def _shapes(rank, dst_rank, dst_host, dst_chunk, dst_count, src_off, src_rank, src_host,
            dev, host, size) -> tuple[np.ndarray, np.ndarray]:
    """Per instruction its shape id, and per shape ``[me, dst node, bytes, src nodes...]``
    (node indices into the places list, ``-1`` padding the sources), the shapes in the order
    of their rows (as numpy's ``unique`` sorts them)."""
    nbytes = size(dst_chunk.astype(np.int64), dst_count.astype(np.int64)).astype(np.int64)
    me = dev[rank]
    dst = np.where(dst_host != 0, host[dst_rank], dev[dst_rank]).astype(np.int32)
    src = np.where(src_host != 0, host[src_rank], dev[src_rank]).astype(np.int32)
    from .._native import compiled_helper
    grouped = compiled_helper("shape_groups")
    if grouped is None:   # an older build: sort the rows
        return _sorted_shapes(_table(me, dst, nbytes, src_off, src), dev, host)
    ids, first = grouped(me, dst, nbytes, src_off, src)
    first = np.frombuffer(first, dtype=np.int64)
    # each group's first instruction as a row (every instruction's source count is some
    # group's, so the rows are as wide as the whole table's)
    starts, counts = src_off[first], src_off[first + 1] - src_off[first]
    off = np.concatenate(([0], np.cumsum(counts)))
    picks = np.repeat(starts - off[:-1], counts) + np.arange(off[-1])
    rows = _table(me[first], dst[first], nbytes[first], off, src[picks])
    order = np.lexsort(rows.T[::-1])   # the first column first: the rows' own order
    number = np.empty(len(order), dtype=np.int64)
    number[order] = np.arange(len(order))
    return number[np.frombuffer(ids, dtype=np.int32)], rows[order]


def _table(me, dst, nbytes, src_off, src) -> np.ndarray:
    """One row ``[me, dst, bytes, sources..., -1...]`` per instruction, as wide as the most
    sources any instruction has."""
    n, nsrc = len(me), np.diff(src_off)
    width = int(nsrc.max()) if n else 0
    table = np.full((n, 3 + width), -1, dtype=np.int64)
    table[:, 0], table[:, 1], table[:, 2] = me, dst, nbytes
    if width and len(src):
        row = np.repeat(np.arange(n), nsrc)
        col = np.arange(len(src)) - np.repeat(src_off[:-1], nsrc)
        table[row, 3 + col] = src
    return table


def _sorted_shapes(table: np.ndarray, dev, host) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_shapes` by sorting ``table``'s rows (:func:`_table`)."""
    key = _row_keys(table, int(max(dev.max(), host.max())) + 2)
    if key is None:   # too many places and sources for one int64: sort the rows themselves
        shapes, shape_ids = np.unique(table, axis=0, return_inverse=True)
        return shape_ids.reshape(-1), shapes
    _, first, shape_ids = np.unique(key, return_index=True, return_inverse=True)
    return shape_ids.reshape(-1), table[first]


def _row_keys(table: np.ndarray, base: int) -> np.ndarray | None:
    """One int64 per row, equal exactly for equal rows (mixed radix: node columns in
    ``[-1, base - 1)``, the bytes column by rank among its distinct values), or None when the
    radix does not fit 62 bits."""
    sizes, size_id = np.unique(table[:, 2], return_inverse=True)
    radix = [base, base, max(len(sizes), 1)] + [base] * (table.shape[1] - 3)
    if float(np.prod(np.array(radix, dtype=np.float64))) >= 2.0 ** 62:
        return None
    key = np.zeros(len(table), dtype=np.int64)
    for col, r in enumerate(radix):
        digit = size_id.reshape(-1) if col == 2 else table[:, col] + 1
        key = key * r + digit
    return key


def _shape_flows(row, places: list, parts: PartsFn) -> list[tuple[float, int, float]]:
    """``(bytes, route class, latency)`` of one shape's flows (:func:`instruction_flows`)."""
    me, dst, nb = int(row[0]), int(row[1]), int(row[2])
    out = []
    for a, b, _ in instruction_flows(me, dst, [int(x) for x in row[3:] if x >= 0], nb):
        out.extend((nb * share, cls, lat) for share, cls, lat in parts(places[a], places[b]))
    return out


def instruction_flows(me, dst, srcs: list, nb: int) -> list[tuple]:
    """The transfers ``(from, to, bytes)`` of an instruction executed on node ``me`` that
    writes ``dst`` from ``srcs`` (nodes): a pull per remote source, then a push to a remote
    destination, or one local flow when it touches only its own node.

    >>> instruction_flows("A", "A", ["A", "B", "C"], 8), instruction_flows("A", "A", ["A"], 8)
    ([('B', 'A', 8), ('C', 'A', 8)], [('A', 'A', 8)])
    """
    flows = [(x, me, nb) for x in srcs if x != me]
    if dst != me:
        flows.append((me, dst, nb))
    return flows or [(me, me, nb)]


def _gather(shape_ids: np.ndarray, flows: list) -> tuple[np.ndarray, ...]:
    """Per-instruction CSR of the flows of its shape."""
    per_shape = np.array([len(f) for f in flows], dtype=np.int64)
    shape_off = np.concatenate(([0], np.cumsum(per_shape)))
    flat = [p for f in flows for p in f]
    count = per_shape[shape_ids]
    part_off = np.concatenate(([0], np.cumsum(count))).astype(np.int32)
    pick = np.repeat(shape_off[shape_ids] - part_off[:-1], count) + np.arange(part_off[-1])
    cols = np.array(flat, dtype=np.float64).reshape(-1, 3)
    return (part_off, cols[pick, 0].copy(), cols[pick, 1].astype(np.int32),
            cols[pick, 2].copy())
