"""The happens-before graph of a schedule, shared by verify, simulate and the MSCCL export.

Instructions are numbered densely, rank by rank, lane by lane, in ``Schedule.instructions()``
order. An instruction's predecessors are the previous instruction of its lane plus its explicit
``deps``. Nothing here checks chunk refs; :mod:`.verify` does.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np

from ..errors import DependencyCycle, MalformedSchedule
from .ir import Dep, Instr, Ref, Schedule


def fmt_ref(ref: Ref) -> str:
    """``1:output[4]`` or ``1:output[4:6]`` for a two-chunk run."""
    span = f"{ref.chunk}" if ref.count == 1 else f"{ref.chunk}:{ref.chunk + ref.count}"
    return f"{ref.rank}:{ref.buf}[{span}]"


def describe(d: Dep, ins: Instr) -> str:
    """``rank r lane l instr i (op dst <- srcs)``: how every schedule error names an instruction."""
    srcs = ", ".join(fmt_ref(x) for x in ins.srcs)
    return f"rank {d.rank} lane {d.lane} instr {d.index} ({ins.op} {fmt_ref(ins.dst)} <- {srcs})"


@dataclasses.dataclass(frozen=True)
class Graph:
    """Dense numbering of a schedule's instructions and their predecessor lists."""

    ids: tuple[Dep, ...]                 # node -> its Dep
    instrs: tuple[Instr, ...]            # node -> its instruction
    lane_of: tuple[int, ...]             # node -> global lane number
    preds: tuple[tuple[int, ...], ...]   # node -> lane predecessor + explicit deps
    lane_base: dict[tuple[int, int], int]  # (rank, lane) -> node of its first instruction
    nlanes: int

    def node(self, d: Dep) -> int:
        return self.lane_base[(d.rank, d.lane)] + d.index

    def name(self, v: int) -> str:
        return describe(self.ids[v], self.instrs[v])

    def __len__(self) -> int:
        return len(self.ids)


def build_graph(s: Schedule) -> Graph:
    """Number the instructions of ``s`` and resolve every dependency to a node.

    Raises
    ------
    MalformedSchedule
        A dependency names a rank, lane or instruction index that does not exist.
    """
    lane_base: dict[tuple[int, int], int] = {}
    lane_len: dict[tuple[int, int], int] = {}
    ids, instrs, lane_of, preds = [], [], [], []
    for r, lanes in enumerate(s.lanes):
        for li, lane in enumerate(lanes):
            lane_base[(r, li)] = len(ids)
            lane_len[(r, li)] = len(lane.instrs)
            ids.extend(Dep(r, li, i) for i in range(len(lane.instrs)))
            instrs.extend(lane.instrs)
            lane_of.extend([len(lane_base) - 1] * len(lane.instrs))
    for v, (d, ins) in enumerate(zip(ids, instrs)):
        if not ins.deps:   # most instructions: only the lane order
            preds.append((v - 1,) if d.index else ())
            continue
        p = [v - 1] if d.index else []
        for dep in ins.deps:
            lane = (dep.rank, dep.lane)
            if not 0 <= dep.index < lane_len.get(lane, 0):
                _resolve(s, lane_base, d, ins, dep)   # raises, naming the bad dependency
            p.append(lane_base[lane] + dep.index)
        preds.append(tuple(dict.fromkeys(p)) if len(p) > 1 else tuple(p))
    return Graph(tuple(ids), tuple(instrs), tuple(lane_of), tuple(preds), lane_base,
                 len(lane_base))


def _resolve(s: Schedule, lane_base: dict, d: Dep, ins: Instr, dep: Dep) -> int:
    ok = (0 <= dep.rank < s.nranks and 0 <= dep.lane < len(s.lanes[dep.rank])
          and 0 <= dep.index < len(s.lanes[dep.rank][dep.lane]))
    if not ok:
        raise MalformedSchedule(
            f"{describe(d, ins)} depends on rank {dep.rank} lane {dep.lane} instr {dep.index}, "
            "which does not exist; expected a Dep returned when that instruction was added")
    return lane_base[(dep.rank, dep.lane)] + dep.index


def topo_order(g: Graph) -> list[int]:
    """A deterministic topological order (Kahn's algorithm, FIFO in node order).

    Raises
    ------
    DependencyCycle
        Naming the instructions of one cycle.
    """
    n = len(g)
    indeg = [len(p) for p in g.preds]
    succs: list[list[int]] = [[] for _ in range(n)]
    for v, ps in enumerate(g.preds):
        for p in ps:
            succs[p].append(v)
    ready = deque(v for v in range(n) if indeg[v] == 0)
    order = []
    while ready:
        u = ready.popleft()
        order.append(u)
        for v in succs[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) < n:
        cycle = _find_cycle(g, [v for v in range(n) if indeg[v] > 0])
        names = " -> waits on -> ".join(g.name(v) for v in cycle)
        raise DependencyCycle(f"dependency cycle (lane order + deps): {names}; expected every "
                              "wait to point to an instruction that can finish first")
    return order


def _find_cycle(g: Graph, stuck: list[int]) -> list[int]:
    # Every stuck node has a stuck predecessor, so walking predecessors must revisit a node.
    stuck_set = set(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    v = stuck[0]
    while v not in seen:
        seen[v] = len(path)
        path.append(v)
        v = next(p for p in g.preds[v] if p in stuck_set)
    return path[seen[v]:]


def vector_clocks(g: Graph, order: list[int]) -> np.ndarray:
    """``vc[v, lane]`` = last index of ``lane`` that happens-before-or-is ``v`` (-1: none).

    Lanes are totally ordered, so one integer per lane captures exactly the set of a node's
    ancestors: ``u`` happens before ``v`` iff ``vc[v, lane_of[u]] >= index(u)``. Memory is
    nodes x lanes int16 while every lane is shorter than 32767 instructions, else int32
    (16 ranks x 64 lanes x 200k instructions: 420 MB).
    """
    longest = max((d.index for d in g.ids), default=0)
    kind = np.int16 if longest < np.iinfo(np.int16).max else np.int32
    vc = np.full((len(g), max(g.nlanes, 1)), -1, dtype=kind)
    for v in order:
        ps = g.preds[v]
        if len(ps) == 1:
            vc[v] = vc[ps[0]]
        elif ps:
            vc[v] = vc[list(ps)].max(axis=0)
        vc[v, g.lane_of[v]] = g.ids[v].index
    return vc


def depths(g: Graph, order: list[int]) -> list[int]:
    """Length of the longest happens-before chain ending at each node (1 for a root)."""
    depth = [0] * len(g)
    for v in order:
        depth[v] = 1 + max((depth[p] for p in g.preds[v]), default=0)
    return depth
