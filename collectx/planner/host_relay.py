"""Host relays: a share of the collective staged through host memory over PCIe, beside NVLink.

Why: a copy between two GPUs joined by NVLink always goes over NVLink, so the PCIe bandwidth
between them (DGX-1: two GPUs under one PCIe switch, or under one CPU) is only reachable by
staging through host memory: the sender writes a chunk into its pinned host buffer (PCIe up to
its CPU), the receiver reads it (PCIe down). The cut bounds count those PCIe paths, so plans
that ignore them stay well below the bound on DGX-1 allocations.

How it works
------------
Two kinds of plan use those PCIe paths, and the faster one (by simulation) wins:

1. **Trees with host edges** (:func:`_integrated`). The tree packings of
   :func:`~.forest.plan_forest` (allgather, reduce-scatter, allreduce) and
   :func:`~.blink.plan_blink` (broadcast, reduce) are offered, for every GPU pair joined by a
   direct link, a second route: staged through the sender's host memory
   (:func:`collectx.topology.view.host_routes`). The LP then mixes NVLink and PCIe freely per tree edge,
   and on sampled DGX-1V allocations its rate is the bound itself. Edges that took the host
   route are staged (:meth:`~.treesched.TreeEmitter.staged`) on lanes of their own, so a
   PCIe-paced transfer never queues with NVLink ones. Where those trees stay below
   :data:`RELAY_GATE` of the bound, the planners run again with the host route offered to
   every GPU pair, linked or not (``host="any"``), and the faster plan is kept: on an NVLink
   chain (DGX-1P GPUs 0-3-7-6) only edges staged between the chain's ends, across the
   sockets, feed them over PCIe and NVLink at once (allgather 0.87 -> 0.97 of the bound).
   The first pass keeps to linked pairs because at equal packing rates the LP may swap in
   cross-socket edges that simulate slower.
2. **A relay plan beside the direct one.** :func:`relay_view` is the machine as host staging
   sees it: GPUs, PCIe switches and CPUs, without direct GPU links, every PCIe switch split
   into an upward and a downward half so that a route between two GPUs always climbs to a CPU
   (as a staged copy does) instead of turning inside the switch. The usual planners plan the
   collective on that view; :func:`~collectx.schedule.host.stage_through_host` turns each of
   the plan's GPU-to-GPU transfers into a staged pair of copies, and
   :func:`~collectx.schedule.split.join_shares` runs the best direct plan and the relayed plan
   side by side, each on its share of every unit: the relay's share is :data:`SPLITS` of
   the one in proportion to the two plans' simulated rates, tried largest first.
   It is skipped when the trees of (1) already come within :data:`RELAY_GATE` of the bound.

Either is kept only if it beats the direct plan alone. Where the winner still lags the gate,
it is also tried with every chunk cut in two, then three and four (:func:`_finer`,
:func:`~collectx.schedule.split.pipeline`): packed trees fill and drain their pipelines in a
few chunk times, and a mix of many equal trees splits its chunks many ways (DGX-1 allreduce
plans below 0.95 of the reference: 19 / 16 -> 9 / 2 on DGX-1V / DGX-1P).

Relays are tried only where they can pay: messages of at least :data:`MIN_BYTES`, a machine
with CPUs and direct GPU links inside the allocation, a direct plan below :data:`RELAY_GATE`
of the bound, and PCIe adding at least :data:`MIN_POTENTIAL` of the allgather cut bound
(full 8-GPU DGX-1V: 9.5%; most of its allocations: 14-39%).

A relay moves a few percent of the data there, and the joined plan is sensitive to how much:
past the rate-proportional share the relay becomes the slower part and the plan falls off a
cliff (full DGX-1V allreduce at relay shares of 1.5 / 2.3 / 2.9 / 3.2 / 3.6% of each unit:
0.963 / 0.971 / 0.977 / 0.962 / 0.870 of the reference). So shares are matched within a
fraction of themselves (:data:`SHARE_TOLERANCE`), not within a fixed step, and a few are
tried.

Measured alternative, not kept: pricing every NVLink tree edge as striped over its link and
through host memory (a fixed fraction per pair) inside the blink/forest packings, then staging
that fraction of each transfer. It won on 2 of 78 sampled DGX-1 plans (by 1%) for twice the
planning time: fixed per-pair fractions overload the PCIe uplinks that switch-mates share.
Offering the host route as a separate choice per tree edge (1) lets the LP weigh those
uplinks itself.
"""

from __future__ import annotations

import networkx as nx

from ..errors import NoFeasiblePlan, PlanError, ScheduleError
from ..schedule.host import stage_through_host
from ..schedule.ir import Schedule
from ..schedule.metrics import unit_bytes
from ..schedule.split import join_shares, pipeline, refine
from ..topology.view import DIRECT_TYPES, all_direct, pcie_levels
from ..topology.view import job_graph

MIN_BYTES = 1 << 20       # below this the extra latency of a staged hop outweighs the bandwidth
RELAY_GATE = 0.97         # a plan this close to its bound needs no relay
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce")
# Relay shares tried, as fractions of the rate-proportional share (contention moves the best
# one), until one simulates slower than the one before. Against one share at 0.9 matched
# within 0.01 of the unit, on the 247 DGX-1V / DGX-1P allocations: 24 / 27 allreduce and 3 / 8
# other plans faster, the full DGX-1V allreduce 0.949 -> 0.977 of the reference and the full
# DGX-1P 0.921 -> 0.960; 5 plans slower, by 0.003 at most.
SPLITS = (0.95, 0.85, 0.7)
MAX_SCALE = 256             # refine() factors tried when matching a share (refining is free)
SHARE_TOLERANCE = 0.02      # of the share: relay shares are a few percent of each unit
RELAY_ALGORITHMS = ("direct", "ring", "tree")   # cheap to plan; the relay share is the smaller
PIPELINE_CHUNKS = 16        # staged copies of a relay plan run in at least this many chunks
# From this many GPUs the relay plan is the ring's: on DGX-1V/1P allocations of 6 and 7 GPUs the
# ring won 70 of 72 (allreduce, allgather, broadcast; a tree won two broadcasts), and planning
# direct and tree there too cost about a fifth of the whole plan.
RING_ONLY_FROM = 6
RELAY_CHUNKS = {"ring": 16, "tree": 16}   # chunks of relay plans (their own default: 100s)
# Tree plans with host edges, and joined plans, that stay below RELAY_GATE run with each chunk
# cut in the first of these, then the next, ... while that helps (see _finer): trees fill and drain in a few chunk times, idling their
# busiest links (a mix of 24 equal trees over 2048 chunks on DGX-1P GPUs 0, 2, 4, 6: 0.955
# of its rate, cut in two 0.974). Choosing among plans at the finer count would double the
# cost of lowering and simulating every candidate; cutting the winner costs a simulation.
FINER = (2, 3, 5)
# ... for these collectives; those of FINER_BELOW_ONLY only where they lag FINER_MORE_BELOW.
# Allgather forests with host edges pick their chunks per root themselves (see
# forest._equal_units_or), and cut finer, 12 / 25 DGX-1V / DGX-1P allgathers below the gate
# gained up to 0.013 of the bound and none crossed 0.95; since their equal-tree mixes move
# staggered runs, the cut lifts DGX-1V GPUs 1, 2, 3, 4, 6, 7 from 0.948 to 0.951.
FINER_COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather")
FINER_BELOW_ONLY = ("allgather",)
FINER_MIN_CHUNK = 64 << 10    # bytes per instruction: below this per-step latency outweighs
                              # finer pipelining
FINER_MAX_INSTRUCTIONS = 72_000   # a cut schedule's simulation costs ~2.5 us per instruction
# Cuts past the first (tried only below FINER_MORE_BELOW) may reach this many: the planner
# spends more on plans that miss the goal. Odd cuts keep staggered runs out of step (a cut in
# four puts a run's head start of half a run back on a piece boundary): DGX-1V GPUs 1-7
# allreduce, 22,658 instructions, cut in 3 / 4 / 5: 0.945 / 0.947 / 0.950 of the reference.
FINER_MAX_LAGGING = 120_000
# Cuts past the first are tried only below this of the bound: cutting 7-GPU DGX-1 allreduce
# plans in three (69,000 instructions) lifted DGX-1V ones from 0.945-0.947 to 0.950-0.952,
# but simulating it cost 0.15-0.3 s, which plans at 0.95-0.97 need not pay.
FINER_MORE_BELOW = 0.95
VERTEX_ALLREDUCE_UP_TO = 3  # allreduce tries the LP's vertex packing up to this many GPUs
# Tree planners that take host routes, per collective. For allreduce, reduce-scatter +
# allgather forests reach the cut bound, reduce/broadcast trees the tree bound; on DGX-1
# allocations either may be the larger, and the one that sets the reference is planned
# (``trees_lead``; planning both cost 0.15 s on 7 GPUs), both where the two bounds tie
# (DGX-1P GPUs 0, 2, 4, 6 and its mirror images: forest 0.913 of the reference, blink 0.949).
INTEGRATED = {"allgather": ("forest",), "reduce_scatter": ("forest",),
              "allreduce": ("forest", "blink"), "broadcast": ("blink",), "reduce": ("blink",)}


def relay_view(view: nx.DiGraph, ranks) -> nx.DiGraph | None:
    """The allocation as host staging sees it (see the module doc), or None where host relays
    add nothing: no CPU, no direct GPU link between two of ``ranks``, or GPUs that cannot reach
    each other through host memory.

    >>> from collectx.topology import load, subset
    >>> V = relay_view(subset(load("dgx1v"), [0, 1]), ("GPU0", "GPU1"))
    >>> nx.shortest_path(V, "GPU0", "GPU1")
    ['GPU0', 'PLX0~up', 'CPU0', 'PLX0~dn', 'GPU1']
    """
    kinds = dict(view.nodes(data="kind"))
    if "cpu" not in kinds.values() or not _direct_pair(view, ranks):
        return None
    up = pcie_levels(view, kinds)
    V = nx.DiGraph(**view.graph)
    V.add_nodes_from((g, view.nodes[g]) for g in ranks)
    for u, v, d in view.edges(data=True):
        if d.get("type") in DIRECT_TYPES and kinds.get(u) == kinds.get(v) == "gpu":
            continue
        a, b = _halves(u, v, kinds, up)
        if a is not None:
            V.add_edge(a, b, **d)
    for n in list(V.nodes):
        base = str(n).split("~")[0]
        V.nodes[n].update({k: x for k, x in view.nodes.get(base, {}).items()}
                          if base in view else {})
    if any(g not in V for g in ranks) or not _connected(V, ranks):
        return None
    return V


def _host_modes(collective: str, n: int) -> list:
    """The tree plans with host edges to try, in order, while the best so far stays below
    :data:`RELAY_GATE` of the bound: ``(host routes offered, least loaded packing)``.

    The LP's optima differ in how they simulate (:func:`~.treepack._lean`). On DGX-1
    allocations where the first plan stays below the gate, each later one improved 10-60% of
    the plans it was tried on, except host routes for any pair with the LP's vertex for
    allreduce (15 of ~300). Allreduce tries the vertex only up to 3 GPUs: since the least
    loaded packings also try mixes of equal trees (:func:`~.blink._equal_units_or`), the
    vertex's plan won 2 of the 436 DGX-1 allocations of 3-7 GPUs, both of 3, and cost 4- and
    5-GPU plans about a tenth of their planning time.
    """
    modes = [(True, True), ("any", True)]
    if collective != "allreduce" or n <= VERTEX_ALLREDUCE_UP_TO:
        modes.append((True, False))
    if collective != "allreduce" and n <= 6:
        modes.append(("any", False))
    return modes


def _direct_pair(view: nx.DiGraph, ranks) -> bool:
    keep = set(ranks)
    return any(d.get("type") in DIRECT_TYPES for u, v, d in view.edges(data=True)
               if u in keep and v in keep)


def _halves(u, v, kinds: dict, up: dict):
    """The relay-view edge for ``u -> v``: switches become ``~up`` / ``~dn`` halves; links of
    NICs and the network carry no host staging and are dropped (None, None)."""
    ku, kv = kinds.get(u), kinds.get(v)
    if ku not in ("gpu", "cpu", "pci_switch") or kv not in ("gpu", "cpu", "pci_switch"):
        return None, None
    if ku == "pci_switch" and kv == "pci_switch":
        going_up = up.get(v, float("inf")) < up.get(u, float("inf"))
        half = "~up" if going_up else "~dn"
        return f"{u}{half}", f"{v}{half}"
    if ku == "pci_switch":
        return f"{u}~up" if kv == "cpu" else f"{u}~dn", v
    if kv == "pci_switch":
        return u, f"{v}~up" if ku == "gpu" else f"{v}~dn"
    return u, v


def _connected(V: nx.DiGraph, ranks) -> bool:
    reach = nx.descendants(V, ranks[0]) | {ranks[0]}
    back = nx.ancestors(V, ranks[0]) | {ranks[0]}
    return all(g in reach and g in back for g in ranks)


def with_host_relays(view: nx.DiGraph, ranks, collective: str, nbytes: int, chosen: tuple,
                     bound_busbw: float | None, *, root: int = 0, inplace: bool = False,
                     trees_lead: bool | None = False):
    """``chosen`` (name, schedule, predicted) or, where faster, it joined with a host relay.

    Pure: plans, stages and simulates candidates; returns the fastest as (name, schedule,
    predicted). A joined plan is named ``<direct plan>+relay``, a tree plan with host edges
    ``forest+host`` or ``blink+host``. ``trees_lead``: the
    allreduce reference is the tree bound (not reduce-scatter + allgather's cut bound); None:
    the two tie.
    """
    name, schedule, predicted = chosen
    if not _worth_trying(collective, nbytes, predicted, bound_busbw, len(ranks)):
        return chosen
    V = relay_view(view, ranks)
    if V is None or _pcie_potential(view, ranks) < MIN_POTENTIAL:
        return chosen
    best = chosen
    for host, lean in _host_modes(collective, len(ranks)):
        if not _worth_trying(collective, nbytes, best[2], bound_busbw, len(ranks)):
            break
        if host == "any" and all_direct(view, ranks):   # no pair lacks a direct link
            continue
        best = _integrated(view, ranks, collective, nbytes, root, inplace, best, trees_lead,
                           host=host, lean=lean)
    if best is not chosen:
        best = _finer(best, view, nbytes, ranks, bound_busbw)
    if not _worth_trying(collective, nbytes, best[2], bound_busbw, len(ranks)):
        return best   # near the bound already: no join can pay for its planning
    relayed = _relay_plan(V, view, ranks, collective, nbytes, root, inplace)
    if relayed is None:
        return best
    staged, relay_pred = relayed
    last, unjoined = None, best
    for joined in _joins(schedule, staged, predicted, relay_pred):
        pred = _predict(joined, view, nbytes, ranks, name)
        if pred is None or (last is not None and pred.time_us >= last):
            break   # shares only shrink from here: one slower than the larger one ends the search
        last = pred.time_us
        if pred.time_us < best[2].time_us:
            best = (f"{name}+relay", joined, pred)
    if best is not unjoined:
        best = _finer(best, view, nbytes, ranks, bound_busbw)
    return best


# PCIe must add this much to the cut bound to pay for planning relays. Only the full DGX-1V
# (9.5%) sits below 0.1 among the DGX-1 allocations, and relays lift it: allgather 0.928 ->
# 0.962 of the bound, allreduce 0.949 -> 0.977, broadcast 0.919 -> 0.939, planned in 0.5-0.6 s.
MIN_POTENTIAL = 0.05


def _pcie_potential(view, ranks) -> float:
    """How much PCIe/host paths add to the allgather cut: 1 - (cut rate with direct GPU links
    only) / (cut rate with every link). Cut rates of the raw graphs (parametric max-flow, a few
    ms): the PCIe share they see is at most what host relays can use, so the test only ever
    tries relays too often, never too rarely."""
    from .bounds import cut_rate
    keep = set(ranks)
    direct = nx.DiGraph()
    direct.add_nodes_from((g, view.nodes[g]) for g in ranks)
    direct.add_edges_from((u, v, d) for u, v, d in view.edges(data=True)
                          if u in keep and v in keep and d.get("type") in DIRECT_TYPES)
    if not nx.is_strongly_connected(direct):
        return 1.0
    full = cut_rate(job_graph(view, ranks), list(ranks))[0]
    return 1.0 - cut_rate(job_graph(direct, ranks), list(ranks))[0] / full if full > 0 else 0.0


def _worth_trying(collective, nbytes, predicted, bound_busbw, n, gate=RELAY_GATE) -> bool:
    if collective not in COLLECTIVES or nbytes < MIN_BYTES or n < 2:
        return False
    if predicted is None or not bound_busbw:
        return False
    return predicted.busbw_GBps < gate * bound_busbw


def _integrated(view, ranks, collective, nbytes, root, inplace, best, trees_lead=False,
                host: bool | str = True, lean: bool = True):
    """``best``, or the tree plan whose trees may send any edge through host memory where
    that simulates faster: the planners of :data:`INTEGRATED` with ``host``
    (:func:`~.forest.plan_forest`, :func:`~.blink.plan_blink`): True offers the host route
    to directly linked GPU pairs, ``"any"`` to every pair; ``lean`` as in
    :func:`~.forest.plan_forest`."""
    from . import registry
    names = INTEGRATED.get(collective, ())
    if collective == "allreduce":
        names = ("forest", "blink") if trees_lead is None else \
            ("blink",) if trees_lead else ("forest",)
    for name in names:
        if name not in registry.ALGORITHMS:
            continue
        try:
            s = registry.ALGORITHMS[name](view, tuple(ranks), collective, nbytes, root=root,
                                          inplace=inplace, host=host, lean=lean)
        except (PlanError, NoFeasiblePlan):
            continue
        pred = _predict(s, view, nbytes, ranks, name)
        if pred is not None and pred.time_us < best[2].time_us:
            best = (f"{name}+host", s, pred)
    return best


def _finer(best, view, nbytes, ranks, bound_busbw):
    """``best`` (of :data:`FINER_COLLECTIVES`) with each chunk cut into the first of
    :data:`FINER`, then the next, ... (:func:`~collectx.schedule.split.pipeline`) while each
    simulates faster and the plan still lags :data:`RELAY_GATE` of ``bound_busbw`` (past the
    first cut, :data:`FINER_MORE_BELOW`), as long as instructions still move
    :data:`FINER_MIN_CHUNK` or more (a chunk each, or the chunks of the schedule's ``stagger``
    meta) and the cut schedule has :data:`FINER_MAX_INSTRUCTIONS` or fewer instructions (past
    the first cut, :data:`FINER_MAX_LAGGING`)."""
    name, schedule, _ = best
    unit = unit_bytes(schedule.collective, nbytes, schedule.nranks)
    moved = unit * schedule.meta_dict().get("stagger", 1) / schedule.nchunks   # per instruction
    for i, k in enumerate(FINER if schedule.collective in FINER_COLLECTIVES else ()):
        most = FINER_MAX_LAGGING if i else FINER_MAX_INSTRUCTIONS
        if moved / k < FINER_MIN_CHUNK or schedule.n_instructions * k > most or \
                not _worth_trying(schedule.collective, nbytes, best[2], bound_busbw,
                                  len(ranks), _finer_gate(schedule.collective, i)):
            break
        try:
            finer = pipeline(schedule, k)
        except ScheduleError:
            break   # a written run overlaps another in part: not a plan this cuts
        pred = _predict(finer, view, nbytes, ranks, name)
        if pred is None or pred.time_us >= best[2].time_us:
            break
        best = (name, finer, pred)
    return best


def _finer_gate(collective: str, cut: int) -> float:
    """The fraction of the bound below which :func:`_finer` tries its ``cut``-th cut."""
    return RELAY_GATE if cut == 0 and collective not in FINER_BELOW_ONLY else FINER_MORE_BELOW


def _relay_plan(V, view, ranks, collective, nbytes, root, inplace):
    """The fastest of :data:`RELAY_ALGORITHMS` planned on the relay view ``V``, staged, and
    simulated on the machine itself (staging adds a hop per transfer, which the view's
    simulation of the unstaged plan does not see): (staged schedule, prediction) or None."""
    from . import registry
    best = None
    for name in RELAY_ALGORITHMS if len(ranks) < RING_ONLY_FROM else ("ring",):
        if name not in registry.ALGORITHMS or not registry.supports(name, collective):
            continue
        try:   # few chunks: the staging pipelines each transfer chunk by chunk anyway
            s = registry.call(name, V, tuple(ranks), collective, nbytes, root=root,
                              inplace=inplace, nchunks=RELAY_CHUNKS.get(name))
        except (PlanError, NoFeasiblePlan, NotImplementedError):
            continue
        staged = stage_through_host(refine(s, -(-PIPELINE_CHUNKS // s.nchunks)))
        pred = _predict(staged, view, nbytes, ranks, name)
        if pred is not None and (best is None or pred.time_us < best[1].time_us):
            best = (staged, pred)
    return best


def _joins(direct: Schedule, staged: Schedule, direct_pred, relay_pred):
    """Joined schedules whose relay share is near the rate-proportional one (see SPLITS)."""
    ra, rr = direct_pred.algbw_GBps, relay_pred.algbw_GBps
    seen = set()
    for k in SPLITS:
        want = min(0.9, k * rr / (ra + rr))
        ka, kr = _scales(direct.nchunks, staged.nchunks, want)
        if (ka, kr) not in seen:
            seen.add((ka, kr))
            yield join_shares(refine(direct, ka), refine(staged, kr))


def _scales(na: int, nr: int, share: float) -> tuple[int, int]:
    """Refine factors ``(ka, kr)`` whose relay share ``kr*nr / (ka*na + kr*nr)`` is within
    :data:`SHARE_TOLERANCE` of ``share`` (relative) with the smallest ``ka`` (else the
    nearest found).

    >>> _scales(8, 8, 0.25), _scales(2, 64, 0.4), _scales(48, 16, 0.03)
    ((3, 1), (47, 1), (11, 1))
    """
    best = None
    for ka in range(1, MAX_SCALE + 1):
        kr = max(1, round(ka * na * share / ((1 - share) * nr)))
        err = abs(kr * nr / (ka * na + kr * nr) - share)
        if best is None or err < best[0]:
            best = (err, (ka, kr))
        if err <= SHARE_TOLERANCE * share:
            break
    return best[1]


def _predict(s: Schedule, view, nbytes, ranks, name):
    from .select import predict
    return predict(s, view, nbytes, tuple(ranks), name.split("+")[0])
