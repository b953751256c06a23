"""Engine steps: how verify and simulate read ``op == "engine"`` instructions.

An engine step hands a chunk range to an inter-node engine (MPI, torch.distributed, NCCL) that
runs ``engine_op`` over ``group`` (schedule ranks, in group order). Every member of the group
issues a matching step: the k-th engine step with the same ``(engine_op, group)`` on each member
(counted in lane, index order) forms one engine call. Each step has one source ``src`` and a
destination ``dst``; with ``G = len(group)`` and member position ``i``:

=============== ============ ============ ================================================
engine_op       src chunks   dst chunks   dst of member i
=============== ============ ============ ================================================
allreduce       k            k            sum over members of their src
allgather       k            G*k          block p = src of member p
reduce_scatter  G*k          k            sum over members of block i of their src
broadcast       k            k            src of member 0 (the group's root)
=============== ============ ============ ================================================

Ordering: a call completes for nobody until every member has issued it, so each member waits
for the predecessors of all members (:meth:`EngineGroups.joined_graph`). A member's own source
is read, and its own destination written, by its own step.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from ..errors import MalformedSchedule
from ._graph import Graph
from .ir import Schedule

ENGINE_OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")


@dataclasses.dataclass
class EngineGroups:
    """The engine calls of a schedule: each is a tuple of nodes, one per member, in group order."""

    calls: list[tuple[int, ...]]
    call_of: dict[int, int]
    _joined: Graph | None = None

    def joined_graph(self, g: Graph) -> Graph:
        """``g`` where each engine member also waits for every other member's predecessors."""
        if not self.calls:
            return g
        if self._joined is None:
            preds = list(g.preds)
            for call in self.calls:
                union = tuple(dict.fromkeys(p for v in call for p in g.preds[v]))
                for v in call:
                    preds[v] = union
            self._joined = dataclasses.replace(g, preds=tuple(preds))
        return self._joined

    def group_of(self, v: int) -> tuple[int, ...]:
        return self.calls[self.call_of[v]]


def engine_groups(s: Schedule, g: Graph) -> EngineGroups:
    """Match the engine steps of ``s`` into calls, checking ops, groups and spans.

    Raises
    ------
    MalformedSchedule
        Unknown ``engine_op``, a group that omits the issuing rank or repeats a rank, members
        issuing different numbers of calls, or spans that do not fit the table above.
    """
    per_key: dict[tuple, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for v, (d, ins) in enumerate(zip(g.ids, g.instrs)):
        if ins.op == "engine":
            _check_step(s, g, v)
            per_key[(ins.engine_op, ins.group)][d.rank].append(v)
    calls: list[tuple[int, ...]] = []
    for (op, group), by_rank in per_key.items():
        counts = {r: len(by_rank.get(r, ())) for r in group}
        if len(set(counts.values())) != 1:
            raise MalformedSchedule(f"engine {op} over group {group}: members issue {counts} "
                                    "steps; expected the same number on every member")
        for k in range(counts[group[0]]):
            call = tuple(by_rank[r][k] for r in group)
            _check_spans(g, op, call)
            calls.append(call)
    return EngineGroups(calls, {v: i for i, call in enumerate(calls) for v in call})


def _check_step(s: Schedule, g: Graph, v: int) -> None:
    ins, rank = g.instrs[v], g.ids[v].rank
    if ins.engine_op not in ENGINE_OPS:
        raise MalformedSchedule(f"{g.name(v)}: engine_op {ins.engine_op!r}; expected one of "
                                f"{ENGINE_OPS}")
    group = ins.group
    if rank not in group or len(set(group)) != len(group):
        raise MalformedSchedule(f"{g.name(v)}: group {group} must list distinct ranks including "
                                f"the issuing rank {rank}")
    if any(not 0 <= r < s.nranks for r in group):
        raise MalformedSchedule(f"{g.name(v)}: group {group} names a rank outside "
                                f"0..{s.nranks - 1}")
    if len(ins.srcs) != 1:
        raise MalformedSchedule(f"{g.name(v)}: engine step has {len(ins.srcs)} sources; "
                                "expected exactly 1")


def span_ratio(op: str, gsize: int) -> tuple[int, int]:
    """(src chunks, dst chunks) per ``k`` chunks of one member's share."""
    return {"allgather": (1, gsize), "reduce_scatter": (gsize, 1)}.get(op, (1, 1))


def _check_spans(g: Graph, op: str, call: tuple[int, ...]) -> None:
    si, di = span_ratio(op, len(call))
    k = g.instrs[call[0]].dst.count // di
    for v in call:
        ins = g.instrs[v]
        if ins.srcs[0].count != si * k or ins.dst.count != di * k or k < 1:
            raise MalformedSchedule(
                f"{g.name(v)}: engine {op} over {len(call)} ranks moves src {ins.srcs[0].count} "
                f"-> dst {ins.dst.count} chunks; expected {si * k} -> {di * k} as its peers")


def apply_engine_group(g: Graph, call: tuple[int, ...], mem) -> None:
    """Symbolically run one engine call on ``mem`` (a :class:`._symbolic.Memory`)."""
    from ._symbolic import combine

    op = g.instrs[call[0]].engine_op
    srcs = [[mem.read(v, i) for i in mem.locs(g.instrs[v].srcs[0])] for v in call]
    for pos, v in enumerate(call):
        k = g.instrs[v].dst.count // span_ratio(op, len(call))[1]
        if op == "allreduce":
            out = [combine([col[c] for col in srcs]) for c in range(k)]
        elif op == "reduce_scatter":
            out = [combine([col[pos * k + c] for col in srcs]) for c in range(k)]
        elif op == "allgather":
            out = [srcs[p][c] for p in range(len(call)) for c in range(k)]
        else:  # broadcast
            out = list(srcs[0])
        for i, contents in zip(mem.locs(g.instrs[v].dst), out):
            mem.write(v, i, contents)
