"""Pick the algorithm (and chunking) per message size with the cost model.

Candidates are every registered algorithm that supports the collective (blink and forest too,
when present). Chunking follows the message size inside each planner (one piece per shard or
tree for small messages, where every extra step costs a latency term; deeper pipelines for large
ones, where they hide the fill time), unless ``nchunks`` is forced. Each candidate is scored by :func:`predict` (simulated transfer time plus the cost
table's per-step latency) and the fastest wins; ties keep registry order (direct, ring, tree,
...), i.e. the simpler schedule.
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from ..errors import NoFeasiblePlan, PlanError
from ..schedule.ir import Schedule
from . import cost, registry
from ._build import simulated
from .cost_tables import ONE_HOP_MIN_FRACTION, TREE_MAX_BYTES

SKIP_MARGIN = 1.001   # a candidate must be able to beat the best by more than this to be tried

def choose(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int, *,
           root: int = 0, inplace: bool = False, nchunks: int | None = None,
           algorithms: list[str] | None = None) -> tuple[str, Schedule, object]:
    """The best (name, schedule, predicted) among the candidate algorithms.

    ``predicted`` is None when no simulator is available; the analytic rule then decides.
    Candidates whose busbw upper bound (:func:`upper_busbw`) cannot beat the best predicted
    so far by more than :data:`SKIP_MARGIN` are neither planned nor simulated.
    """
    names = algorithms if algorithms is not None else registry.candidates(collective)
    best = None
    failures = []
    bound = _Bounds(topo, ranks, collective, root)
    for name in names:
        if _cannot_win(best, bound.before_plan(name)):
            continue
        try:
            s = registry.call(name, topo, ranks, collective, nbytes, root=root,
                              inplace=inplace, nchunks=nchunks)
        except (PlanError, NotImplementedError) as e:  # cannot serve this request: skip it
            failures.append(f"{name}: {e}")
            continue
        if _cannot_win(best, upper_busbw(s, len(ranks))):
            continue
        pred = predict(s, topo, nbytes, ranks, name)
        score = pred.time_us if pred is not None else None
        if best is None or (score is not None and (best[0] is None or score < best[0])):
            best = (score, name, s, pred)
    if best is None:
        raise NoFeasiblePlan(f"no algorithm can plan {collective} on {len(ranks)} ranks: "
                             + "; ".join(failures or ["no candidate supports it"]))
    if best[0] is None:  # no simulator: fall back to the analytic rule
        name = choose_analytic(topo, ranks, collective, nbytes)
        return name, registry.call(name, topo, ranks, collective, nbytes, root=root,
                                   inplace=inplace, nchunks=nchunks), None
    return best[1], best[2], best[3]


def _cannot_win(best, bound: float | None) -> bool:
    """Whether a candidate bounded by ``bound`` GB/s busbw cannot beat ``best``."""
    if bound is None or best is None or best[3] is None or not hasattr(best[3], "busbw_GBps"):
        return False
    return bound <= best[3].busbw_GBps * SKIP_MARGIN


def upper_busbw(schedule: Schedule, nranks: int) -> float | None:
    """Busbw (GB/s) no simulation of a packed-tree schedule can beat, from its packing rate.

    Blink's allreduce trees carry every byte up and down at the packing rate ``T``: busbw <=
    2(N-1)/N T; its broadcast / reduce trees carry the payload at ``T``. None when the
    schedule records no single packing rate.

    >>> from collectx.topology import line
    >>> from collectx.planner.blink import plan_blink
    >>> round(upper_busbw(plan_blink(line(3, bw=100.0), ("GPU0", "GPU1", "GPU2"), "allreduce",
    ...                              1 << 20, nchunks=4), 3), 2)
    133.33
    """
    rate = schedule.meta_dict().get("rate_gbps") if schedule.algorithm == "blink" else None
    if not isinstance(rate, (int, float)) or nranks < 2:
        return None
    return rate * (2 * (nranks - 1) / nranks if schedule.collective == "allreduce" else 1.0)


class _Bounds:
    """Bounds that hold before a candidate is planned, computed once and only when needed.

    Allgather, reduce-scatter, broadcast and reduce have bounds no schedule beats
    (:func:`~.bounds.bounds`). For allreduce the reduce-scatter + allgather cut bound (the
    harmonic mean of the two phases' cut bounds: every cut carries both phases' traffic)
    limits the algorithms built that way; trees can beat it, so they are not bounded here.
    """

    RS_AG = ("direct", "ring", "forest")

    def __init__(self, topo, ranks, collective, root):
        self.topo, self.ranks, self.collective, self.root = topo, ranks, collective, root
        self._value: float | None = None

    def before_plan(self, name: str) -> float | None:
        if self.topo is None or len(self.ranks) < 2:
            return None
        if self.collective == "allreduce" and name not in self.RS_AG:
            return None
        if self.collective not in ("allreduce", "allgather", "reduce_scatter", "broadcast",
                                   "reduce"):
            return None
        if self._value is None:
            self._value = self._compute()
        return self._value

    def _compute(self) -> float:
        from .bounds import bounds
        gpus = list(self.ranks)
        if self.collective != "allreduce":
            return bounds(self.topo, self.collective, gpus=gpus, root=self.root).bound_busbw
        ag = bounds(self.topo, "allgather", gpus=gpus).bound_busbw
        rs = bounds(self.topo, "reduce_scatter", gpus=gpus).bound_busbw
        return 2.0 / (1.0 / ag + 1.0 / rs)


def predict(schedule: Schedule, topo: nx.DiGraph, nbytes: int, ranks: tuple[str, ...],
            algorithm: str):
    """Simulated result with the cost table's latency terms folded in (None without simulator).

    ``t = base + max(simulated, steps * alpha)``: the simulator models link bandwidth,
    contention and per-hop wire latency; the per-step synchronisation of real executors (flags,
    polling) comes from the cost table. Pipelined executors overlap one piece's
    synchronisation with other pieces' transfers, so the two terms overlap rather than add:
    the max is right at both ends (latency-bound small messages, bandwidth-bound large ones)
    and optimistic by at most 2x where they are equal. Bandwidths are recomputed from the
    total time so that all fields agree.
    """
    sim = simulated(schedule, topo, nbytes, ranks)
    if sim is None:
        return None
    if sim.time_us >= cost.most_steps_us(schedule, algorithm):
        # Large messages: no chain of steps can outlast the transfers, so the max is the
        # simulated time, and the chain and route classes need not be computed.
        t = cost.base_us(topo, ranks) + sim.time_us
    else:
        base, alpha = cost.latency_terms(schedule, topo, ranks, algorithm)
        t = base + max(sim.time_us, cost.steps(schedule) * alpha)
    if not dataclasses.is_dataclass(sim) or t <= 0:
        return sim
    scale = sim.time_us / t
    return dataclasses.replace(sim, time_us=t, algbw_GBps=sim.algbw_GBps * scale,
                               busbw_GBps=sim.busbw_GBps * scale)


def choose_analytic(topo: nx.DiGraph | None, ranks: tuple[str, ...], collective: str,
                    nbytes: int) -> str:
    """The cheap rule used without a simulator (the runtime's per-size-class planning).

    One-hop fabrics: direct (fewest steps and every link busy). Elsewhere: the double binary
    tree for small messages (log-depth), rings for large ones, each only if it supports the
    collective; direct serves everything else.
    """
    if topo is None or len(ranks) <= 2 or is_one_hop(topo, ranks):
        return "direct"
    if nbytes <= TREE_MAX_BYTES and registry.supports("tree", collective) \
            and "tree" in registry.ALGORITHMS:
        return "tree"
    if "ring" in registry.ALGORITHMS and registry.supports("ring", collective):
        return "ring"
    return "direct"


def is_one_hop(topo: nx.DiGraph, ranks: tuple[str, ...]) -> bool:
    """Whether every rank reaches every other without relaying through a rank, at comparable
    bandwidth (NVSwitch, full xGMI mesh, one host's shared memory).

    >>> from collectx.topology import switch, ring
    >>> is_one_hop(switch(4), ("GPU0", "GPU1", "GPU2", "GPU3"))
    True
    >>> is_one_hop(ring(4), ("GPU0", "GPU1", "GPU2", "GPU3"))
    False
    """
    avoid = frozenset(ranks)
    bws = [cost.widest_path(topo, a, b, avoid)[0] for a in ranks for b in ranks if a != b]
    return not bws or min(bws) >= ONE_HOP_MIN_FRACTION * max(bws)
