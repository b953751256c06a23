"""Packed trees staged through host memory beside a plan over peer routes.

Where GPUs copy to each other over their fabric (NVLink, xGMI) and stage through host memory
over PCIe, the two kinds of route load different links (:func:`~collectx.topology.view.
staging_apart`), and a plan over each runs at its own rate beside the other: the peer plan
chosen first (ring, tree or one-hop) moves most of every unit, packed trees over the staged
routes alone (:data:`~.program.STAGED_ONLY`) the rest, in proportion to the rates the two reach
(:func:`~collectx.schedule.layers.side_by_side`). The packing program over both kinds at once
counts equal trees that mix them: a staged share of a tenth takes ten trees or more, and every
count is an integer program and a ladder of simulations."""

from __future__ import annotations

from ..errors import PlanError, ScheduleError
from ..schedule.layers import side_by_side
from ..schedule.metrics import unit_bytes
from ..topology.view import job_graph, staging_apart
from . import program as P
from .bounds import peer_bounds
from .cost_tables import FILL, MIN_CHUNK_BYTES
from .trees import BLINK, plan_blink, plan_forest


def beside(best: tuple, topo, ranks: tuple, collective: str, nbytes: int, predict,
           bound_busbw: float | None, *, root: int = 0, inplace: bool = False) -> tuple:
    """``best`` (:func:`~.select.choose`'s ``(us, name, schedule, predicted, rank)`` of a plan
    over peer routes), or that plan with packed trees staged through host memory beside it
    where the two together are faster. Not where the routes cross, nor where even at the
    staged layer's bound the two would not come within the fill a pipeline loses
    (:data:`~.cost_tables.FILL`) of ``bound_busbw``: the packing program over both kinds of
    route would run anyway, and it wins there. ``predict(schedule, nbytes)`` simulates."""
    predicted, n = best[3], len(ranks)
    # cheap refusals first: the staged LP below is solved only where the layer may run
    if n < 2 or not predicted.busbw_GBps > 0 or unit_bytes(collective, nbytes, n) < \
            MIN_CHUNK_BYTES or not staging_apart(job_graph(topo, ranks), ranks):
        return best
    try:
        staged = peer_bounds(topo, collective, ranks, root, host=P.STAGED_ONLY).bound_busbw
    except PlanError:   # some GPU has no route staged through host memory
        return best
    if not staged or (bound_busbw and (predicted.busbw_GBps + staged) * (1 + FILL)
                      < bound_busbw):
        return best
    share = staged / (staged + predicted.busbw_GBps)   # of the bytes, by the layers' bounds
    part = int(nbytes * share) // (64 * n) * 64 * n
    if unit_bytes(collective, part, n) < MIN_CHUNK_BYTES:   # as packed trees: below
        return best                                 # a chunk per group, fewest steps win
    plan = plan_blink if collective in BLINK else plan_forest
    try:
        trees = plan(topo, ranks, collective, part, root=root, inplace=inplace,
                     host=P.STAGED_ONLY)
        rate = part / predict(trees, part).time_us   # then by the rates the two reach
        layered = side_by_side(best[2], trees, 1 - rate / (rate + nbytes / predicted.time_us))
    except (PlanError, ScheduleError):
        return best
    pred = predict(layered, nbytes)
    return (pred.time_us, layered.algorithm, layered, pred, best[4]) if \
        pred.time_us < best[0] else best
