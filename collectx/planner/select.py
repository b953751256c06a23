"""Pick the algorithm per message size: every candidate is planned and simulated, the fastest wins.

Candidates are the registered algorithms that serve the collective: ring and tree, then direct (few
steps: small messages), then the packed trees (:mod:`.trees`: bandwidth). A candidate is scored by
:func:`predict` (simulated transfer time plus the cost table's per-step latency); ties keep the
earlier, simpler one in registry order. Packed trees are planned only where their bound lets them
beat the best so far: no schedule is faster than its bound allows, so below a few hundred
kilobytes, where latency decides, the packing program is not run. Where they are planned they are
handed the time to beat, and round only packings that could."""

from __future__ import annotations

import dataclasses

import networkx as nx

from ..errors import NoFeasiblePlan, PlanError
from ..schedule.ir import Schedule
from ..schedule.metrics import bus_factor, unit_bytes
from . import cost, direct, registry
from ._build import simulated
from .layers import beside
from .cost_tables import FILL, MIN_CHUNK_BYTES, alpha_us

PACKED = ("blink", "forest")   # planners that take host-staged routes (and cost a packing)


def choose(topo: nx.DiGraph, ranks: tuple[str, ...], collective: str, nbytes: int, *,
           root: int = 0, inplace: bool = False, nchunks: int | None = None, host: bool = False,
           bound=None, algorithms: list[str] | None = None) -> tuple[str, Schedule, object]:
    """The fastest (name, schedule, predicted) among the candidate algorithms.

    ``host`` lets packed trees stage edges through host memory (executors with host
    buffers); ``bound`` (:class:`~.bounds.Bounds` of the allocation) prunes packed trees that
    cannot win. Raises NoFeasiblePlan when no candidate serves the request."""
    names = algorithms if algorithms is not None else registry.candidates(collective)
    rank = {name: i for i, name in enumerate(names)}   # ties go to the earlier, simpler one
    best, failures, beside_tried = None, [], not host
    # Direct after ring and tree, skipped where its busiest link alone loses to them (its
    # broadcast cuts thousands of pieces); packed trees last, handed the time to beat, and
    # before them, with host buffers, the best so far with a staged layer beside it.
    for name in sorted(names, key=lambda name: (name in PACKED, name == "direct")):
        if name in PACKED and best is not None and not beside_tried:
            beside_tried = True
            best = beside(best, topo, ranks, collective, nbytes,
                          lambda s, n: predict(s, topo, n, ranks, s.algorithm),
                          getattr(bound, "bound_busbw", None), root=root, inplace=inplace)
        if best is not None and not _may_win(bound, name, collective, nbytes, topo, ranks,
                                             best[0], root, nchunks):
            continue
        packed = {} if name not in PACKED else {
            "host": host, "beat_us": _to_beat(best, topo, ranks),
            "good_us": _good_us(_packed_busbw(bound, name, collective), collective, nbytes,
                                len(ranks))}
        try:
            s = registry.call(name, topo, ranks, collective, nbytes, root=root, inplace=inplace,
                              nchunks=nchunks, **packed)
        except (PlanError, NotImplementedError) as e:   # cannot serve this request: skip it
            failures.append(f"{name}: {e}")
            continue
        pred = predict(s, topo, nbytes, ranks, name)
        if best is None or (pred.time_us, rank[name]) < (best[0], best[4]):
            best = (pred.time_us, s.algorithm, s, pred, rank[name])
    if best is None:
        raise NoFeasiblePlan(f"no algorithm can plan {collective} on {len(ranks)} ranks: "
                             + "; ".join(failures or ["no candidate supports it"]))
    return best[1], best[2], best[3]


def _may_win(bound, name: str, collective: str, nbytes: int, topo, ranks, best_us: float,
             root: int = 0, nchunks: int | None = None) -> bool:
    """Whether candidate ``name`` could beat ``best_us``. Direct not where the busiest link of
    its routes alone takes longer (:func:`~.direct.least_us`). Packed trees not below one
    chunk per group (:data:`~.cost_tables.MIN_CHUNK_BYTES`: one chunk is a matter of fewest
    steps, which simpler candidates win), nor where their bound plus the least fill
    (:data:`~.cost_tables.FILL`) is slower: for allreduce over trees used both ways the tree
    packing's; over per-root forests, whose reduce-scatter and allgather overlap chunk by
    chunk (on DGX-1V GPUs 0, 1, 4, 6 a third above the phases' cut), the ceiling's."""
    if name == "direct" and nchunks is None:
        return cost.base_us(topo, ranks) + direct.least_us(topo, ranks, collective, nbytes,
                                                           root) < best_us
    if name not in PACKED:
        return True
    n = len(ranks)
    if unit_bytes(collective, nbytes, n) < MIN_CHUNK_BYTES:
        return False
    busbw = _packed_busbw(bound, name, collective)
    return not busbw or _faster(busbw, collective, nbytes, topo, ranks, best_us)


def _packed_busbw(bound, name: str, collective: str) -> float | None:
    """The bus bandwidth packed trees ``name`` cannot beat (:func:`_may_win` says why)."""
    busbw = getattr(bound, "bound_busbw", None)
    if collective == "allreduce" and bound is not None:
        return (bound.tree_busbw if name == "blink" else bound.ceiling_busbw) or busbw
    return busbw


def _good_us(busbw: float | None, collective: str, nbytes: int, n: int) -> float | None:
    """A transfer time as fast as pipelines get, ``busbw``'s plus the least fill (None: no
    bound): packed trees judge no more candidates once one is that fast."""
    return nbytes * bus_factor(collective, n) / (busbw * 1e3) * (1 + FILL) if busbw else None


def _to_beat(best, topo, ranks) -> float | None:
    """The transfer time packed trees must beat to win over ``best`` (None: nothing yet),
    their fill and the fixed per-call latency taken off (as :func:`_faster` judges)."""
    return None if best is None else best[0] / (1 + FILL) - cost.base_us(topo, ranks)


def _faster(busbw: float, collective: str, nbytes: int, topo, ranks, best_us: float) -> bool:
    """Whether a plan at ``busbw``, with its pipeline's fill, would beat ``best_us``."""
    fastest = cost.base_us(topo, ranks) + nbytes * bus_factor(collective, len(ranks)) / (
        busbw * 1e3)
    return fastest * (1 + FILL) < best_us


def predict(schedule: Schedule, topo: nx.DiGraph, nbytes: int, ranks: tuple[str, ...],
            algorithm: str):
    """Simulated result with the cost table's latency terms folded in.

    ``t = base + max(simulated, steps * alpha)``: the simulator models link bandwidth, contention
    and per-hop wire latency; the per-step synchronisation of real executors (flags, polling) comes
    from the cost table. Pipelined executors overlap one piece's synchronisation with other pieces'
    transfers, so the two terms overlap rather than add: the max is right at both ends
    (latency-bound small messages, bandwidth-bound large ones) and optimistic by at most 2x where
    they are equal. Bandwidths are recomputed from the total time so that all fields agree."""
    sim = simulated(schedule, topo, nbytes, ranks)
    name, t = algorithm.split("+")[0], cost.base_us(topo, ranks) + sim.time_us
    # Large messages: no chain of steps can outlast the transfers, so the max is the
    # simulated time, and the chain and route classes need not be computed.
    if sim.time_us < cost.most_steps_us(schedule, name):
        alpha = alpha_us(cost.link_class(schedule, topo, ranks), name)
        t = max(t, cost.base_us(topo, ranks) + cost.steps(schedule) * alpha)
    if t <= 0:
        return sim
    scale = sim.time_us / t
    return dataclasses.replace(sim, time_us=t, algbw_GBps=sim.algbw_GBps * scale,
                               busbw_GBps=sim.busbw_GBps * scale)
