"""Packed trees as schedules: the packing program's equal trees, chunked and lowered.

``blink`` plans broadcast, reduce and allreduce over the trees of one group (allreduce: trees
used both ways, as Blink does); ``forest`` plans allgather, reduce-scatter and allreduce over
per-root groups, as ForestColl does (allreduce: reduce-scatter then allgather, chunk by chunk).
Both take the trees of :mod:`.program`, so on every machine their rate is the best a packing of
equal trees with the hardware's routes reaches. The name says ``+host`` when some tree stages
an edge through host memory.

How a packing becomes a schedule: a group's chunks are dealt to its trees, evenly or (trees of
unequal rates) by rate, on lanes of their own (:mod:`~collectx.schedule.treesched`), and
:class:`Pipeline` picks their count with one pipeline model; once a schedule is chosen, its
chunks are dealt anew by the rate each tree reached in simulation, and where a tree's slowest
node still lags the rest, its broadcast keeps pace with it (:func:`_balanced`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable

import networkx as nx
import numpy as np

from ..errors import PlanError
from ..schedule.builder import ScheduleBuilder
from ..schedule.ir import GPU_LANES, PackedSchedule, Ref, Schedule
from ..schedule.metrics import unit_bytes
from ..schedule.simulate import chunk_ends, time_within, unpacked
from ..schedule.treesched import Share, chunk_refs, emitter
from . import program as P
from .direct import plan_direct
from .._concurrent import Ahead, shared_threads
from ._build import check_args
from .cost_tables import FILL, INSTRUCTIONS, MIN_CHUNK_BYTES, NOISE
from .treepack import Packing

BLINK = ("allreduce", "broadcast", "reduce")
SIMULATED = 2   # packings (tree counts) lowered and simulated: the pipeline model ranks them
                # but misjudges latency hiding (lockstep trees, double buffering)
FOREST = ("allgather", "reduce_scatter", "allreduce")
PACED = ("broadcast", "allgather", "allreduce")   # collectives whose trees broadcast


def plan_blink(topo: nx.DiGraph, ranks: tuple, collective: str, nbytes: int, *, root: int = 0,
               inplace: bool = False, nchunks: int | None = None, host: bool = False,
               beat_us: float | None = None, good_us: float | None = None) -> Schedule:
    """Broadcast, reduce or allreduce over equal packed trees of one group.

    ``host`` lets tree edges stage through host memory over PCIe (executors with host
    buffers); ``nchunks`` forces the chunks each tree carries. ``beat_us``: a transfer time
    (microseconds, the fixed per-call latency left out) the plan is wanted only if it beats;
    packings too slow to are not built, and PlanError says when none is fast enough. Once a
    schedule takes at most ``good_us``, no more are simulated (:func:`~.select._good_us`).

    >>> from collectx.topology import line
    >>> from collectx.schedule import verify
    >>> s = plan_blink(line(3, bw=100.0), ("GPU0", "GPU1", "GPU2"), "allreduce", 1 << 20)
    >>> verify(s).instructions > 0, s.algorithm, s.meta_dict()["rate_gbps"]
    (True, 'blink', 100.0)
    """
    return _planned("blink", topo, ranks, collective, nbytes, root, inplace, nchunks, host,
                    beat_us, good_us)


def plan_forest(topo: nx.DiGraph, ranks: tuple, collective: str, nbytes: int, *,
                root: int = 0, inplace: bool = False, nchunks: int | None = None,
                host: bool = False, beat_us: float | None = None,
                good_us: float | None = None) -> Schedule:
    """Allgather, reduce-scatter or allreduce over equal packed trees of every root
    (``host``, ``nchunks``, ``beat_us`` and ``good_us`` as for :func:`plan_blink`).

    >>> from collectx.topology import ring
    >>> from collectx.schedule import verify
    >>> ranks = ("GPU0", "GPU1", "GPU2", "GPU3")
    >>> s = plan_forest(ring(4), ranks, "allgather", 1 << 20)
    >>> verify(s).instructions > 0, s.algorithm
    (True, 'forest')
    """
    return _planned("forest", topo, ranks, collective, nbytes, root, inplace, nchunks, host,
                    beat_us, good_us)


plan_blink.collectives, plan_forest.collectives = BLINK, FOREST


def _planned(name, topo, ranks, collective, nbytes, root, inplace, nchunks, host,
             beat_us, good_us) -> Schedule:
    serves, other = (BLINK, "forest") if name == "blink" else (FOREST, "blink")
    if collective not in serves:
        raise PlanError(f"{name} plans {', '.join(serves)}, not {collective}; use {other} for "
                        f"{' and '.join(c for c in BLINK + FOREST if c not in serves)}")
    check_args(collective, n := len(ranks), root, nchunks)
    if n == 1:
        return replace(plan_direct(None, ranks, collective, nbytes, root=root, inplace=inplace),
                       algorithm=name, meta=())   # one rank: its own copy, if any
    forest = name == "forest" and collective == "allreduce"
    p, lp = P.solved(topo, ranks, collective, root=root, host=host, forest=forest)
    (pipe := Pipeline(p, unit_bytes(collective, nbytes, n) / (n if forest else 1))).fit(lp)
    beat = pipe.to_beat(beat_us)
    if beat is not None and 1 / lp.rate >= beat * (1 + FILL):   # not even without the margin
        raise PlanError(f"{name}: its fractional packing ({lp.rate:.1f} GB/s per group) "
                        f"cannot move the message within the {beat_us:.0f} us to beat")
    packings = P.equal_trees(p, lp, pipe, level_cost=pipe.level_cost(lp),
                             keep=1 if nchunks is not None else SIMULATED, beat=beat)
    if not packings:
        raise PlanError(f"{name}: no packing of equal trees beats {beat_us:.0f} us")
    if nchunks is not None:
        if forest and nchunks % n:
            raise PlanError(f"nchunks={nchunks}: a forest allreduce gives each of its {n} "
                            f"roots the same chunks; expected a multiple of {n}")
        lower = _lowering(name, _centred(p, packings[0]), p, collective, n, root, inplace)
        return lower(nchunks // n if forest else nchunks, packed=False)
    tries = lambda k, q=p, pq=pipe: _tries(name, k, q, pq, collective, n, root,  # noqa: E731
                                           inplace)
    judge = lambda lower, beat=float("inf"): lambda: (  # noqa: E731
        time_within(s := lower(), topo, nbytes, beat, ranks=list(ranks)), s, lower)
    # no schedule of these trees is faster than their LP's rate: within FILL of it is as
    # fast as they get, whatever the bound allows (a forest allreduce's ceiling, say);
    # but one that loses to the plan to beat is not good enough
    other_us = math.inf if beat_us is None else beat_us * (1 + FILL)   # the plan to beat's
    good_us = min(max(good_us or 0.0, pipe.full_us(lp.rate) * (1 + FILL)), other_us)
    ends = lambda s: chunk_ends(s, topo, nbytes, ranks=list(ranks))  # noqa: E731
    bests: dict = {}   # each packing's fastest run, by its lowering
    found = _fastest_of(packings, tries, judge, good_us, bests)
    if found[0][0] < other_us and _misjudged(found[0][0], packings[0], pipe):
        found = _rounded_again(found, packings, p, lp, pipe, tries, judge, good_us, bests)
    at_rate = lambda at: pipe.full_us(at.lower.rate)  # noqa: E731
    chosen = _balanced(found, judge, ends, good_us, other_us, (list(bests.values()), at_rate))
    if chosen[0] > good_us and (room := P.roomy(topo, ranks, collective, root=root,
                                                    host=host, forest=forest))[1] is not lp:
        roomy_bests: dict = {}   # slower than its trees: what ran ahead took the rate's links
        if roomier := _roomier(found, room, pipe.unit, tries, judge, good_us, roomy_bests):
            run = _balanced(roomier, judge, ends, good_us, min(other_us, chosen[0]),
                            (list(roomy_bests.values()), at_rate))
            chosen = run if run[0] < chosen[0] else chosen
    return unpacked(chosen[1])


def _rounded_again(found: list, packings: list, p: P.Problem, lp: Packing, pipe: "Pipeline",
                   tries, judge, good_us: float, bests: dict) -> list:
    """``found`` (:func:`_fastest`'s), or where faster, the fastest schedule of the program's
    own roundings of the counts that may beat what ran (:func:`~.program.equal_trees` without
    the dealt trees, whose model time set the first search's bar), those not judged before.
    docs/planner.md ("Where the model's best rounding stalls") has the case."""
    again = P.equal_trees(p, lp, pipe, level_cost=pipe.level_cost(lp), keep=SIMULATED,
                          beat=pipe.to_beat(found[0][0]), dealt=False)
    seen = {(len(k.trees), k.rate) for k in packings}
    again = [k for k in again if (len(k.trees), k.rate) not in seen and k is not lp]
    more = _fastest_of(again, tries, judge, good_us, bests)
    return more if more and more[0][0] < found[0][0] else found


def _roomier(found: list, room: tuple, unit: float, tries, judge, good_us: float,
             bests: dict) -> list:
    """:func:`_fastest` over the counts of ``room`` (:func:`~.program.roomy`'s problem and LP)
    that may beat ``found`` by the model, or none (docs/planner.md, "Room on the links the rate
    does not need"). ``unit``: :class:`Pipeline`'s; ``tries``: _planned's."""
    p, lp = room
    (pipe := Pipeline(p, unit)).fit(lp)
    again = P.equal_trees(p, lp, pipe, level_cost=pipe.level_cost(lp), keep=SIMULATED,
                          beat=pipe.to_beat(found[0][0]))
    return _fastest_of(again, lambda k: tries(k, p, pipe), judge, good_us, bests)


def _fastest_of(packings: list, tries, judge, good_us: float, bests: dict) -> list:
    """:func:`_fastest` over ``packings``' tries, the fastest packing first; [] for none."""
    return packings and _fastest([tries(k) for k in sorted(packings, key=lambda k: -k.rate)],
                                 judge, good_us, bests)


def _misjudged(us: float, top: Packing, pipe: "Pipeline") -> bool:
    """Whether the fastest schedule found (``us``) runs slower than the pipeline model promised
    for the packing it ranked first by more than :data:`~.cost_tables.FILL`: the model, not
    the packing, set every count's bar, and the program may round counts that beat what runs."""
    depth = max(t.depth() for t in top.trees)
    promised = pipe.time(pipe.trees(top), top.rate, depth) * pipe.unit / 1e3
    return us > promised * (1 + FILL)


def _balanced(found: list, judge, ends, good_us: float, beat_us: float,
              others: tuple = ((), None)) -> tuple:
    """The run ``(us, schedule, try)`` of ``found[0]``, or of its chunks dealt anew by the rate
    each tree reached (:func:`_redealt`), or where no deal of it is faster, ``found[1]``'s where
    that beats it; then, where still slower than its trees' rate, that schedule's or another
    packing's (``others``: their runs, and a try's time at its rate) trees keeping pace, if
    faster (:func:`_kept_pace`). docs/planner.md has the cases."""
    chosen = _dealt_anew(found[0], judge, ends, good_us, beat_us)
    if chosen[1] is found[0][1] and len(found) > 1:
        other = _dealt_anew(found[1], judge, ends, good_us, min(chosen[0], beat_us))
        if other[0] < chosen[0] and other[1] is not found[1][1]:
            chosen = other
    return _kept_pace(chosen, judge, ends, good_us, beat_us, *others)


def _kept_pace(found: tuple, judge, ends, good_us: float, beat_us: float, others=(),
               at_rate=None) -> tuple:
    """The run ``found`` (``(us, schedule, try)``), or where faster, each tree's broadcast
    keeping pace with the node that received its chunks last (:func:`_laggards`): branches that
    run ahead take that node's bandwidth (docs/planner.md, "Trees that keep pace"). Judged where
    the run is slower than ``good_us``; then ``others`` (other packings' fastest runs) where
    their rate (``at_rate(try)``) beats the best and their run lags it by more than ``FILL``."""
    us, s, at = found
    if us <= good_us or not (pace := at.lower.paced(at.per_group, at.deal, ends(s))):
        return found   # as fast as its trees get, or no branch ran ahead of a node that lagged
    best = _paced(found, replace(at, pace=pace), judge, beat_us)
    for run_us, run, tried in sorted((o for o in others if o[2].lower is not at.lower),
                                     key=lambda o: at_rate(o[2])):
        if at_rate(tried) < best[0] and run_us > at_rate(tried) * (1 + FILL) and \
                (pace := tried.lower.paced(tried.per_group, tried.deal, ends(run))):
            # on the most lanes its trees fit: a piece stays in flight on each edge while the
            # root's children wait (the chosen schedule keeps the lanes it won on)
            lanes = max(tried.buffers, tried.lower.buffers)
            best = _paced(best, replace(tried, pace=pace, buffers=lanes), judge, beat_us)
    return best


def _paced(best: tuple, paced, judge, beat_us: float) -> tuple:
    """``best`` (``(us, schedule, try)``), or the judge's run of the try ``paced`` where
    faster, given up once it cannot beat ``best`` nor ``beat_us``."""
    got = judge(paced, min(best[0], beat_us))()
    return got if got[0] < best[0] else best


def _dealt_anew(found: tuple, judge, ends, good_us: float, beat_us: float) -> tuple:
    """``(us, schedule, try)``: :func:`_balanced` of one candidate. A deal is run where the rates
    promise to gain more than :data:`~.cost_tables.NOISE` and to beat ``beat_us`` (another plan's
    time, fill and all); kept where faster, and dealt again while that gains more than NOISE."""
    us, s, at = found
    while us > good_us:
        deal, likely = at.lower.dealt(at.per_group, at.deal, ends(s))
        bar = min(us, beat_us)
        if not deal or likely >= bar * (1 - NOISE):
            break
        got = judge(replace(at, deal=deal), bar)()
        if got[0] >= bar:
            break
        gain, (us, s, at) = got[0] / us, got
        if gain > 1 - NOISE:
            break
    return us, s, at


def _fastest(tried: list, judge, good_us: float | None, bests: dict | None = None) -> list:
    """The fastest schedule of ``tried`` (per packing, thunks of its first tries and, for each, the
    ladder of more chunks that climbs from it; ``judge(thunk, beat)()`` is ``(simulated us,
    schedule)``, given up past ``beat``): the first tries judged at once, then every ladder
    climbing, a rung of each at once, while each rung gains more than ``NOISE`` on the best
    below it (:func:`_climbed`), or until some are good enough (``good_us``: as fast as
    pipelines get), and then the fewest chunks of those (instructions to ship, decode and run).

    Spare threads start a ladder's next rung once its rung is judged (:func:`_guess`,
    :class:`~collectx._concurrent.Ahead`); the rounds read what they ask for, so any thread
    count chooses alike. Returns the judge's ``(us, schedule, try)`` of the one chosen and,
    where none is good enough, of the one with the fewest chunks within NOISE of it if that
    is another. ``bests`` takes each packing's fastest run, by its lowering (``try.lower``).
    docs/planner.md has why."""
    good_us = good_us or 0.0
    with shared_threads():
        ahead = Ahead(lambda key: judge(*key)(), wider=lambda key: (key[0], math.inf))
        try:
            return _searched(ahead, tried, good_us, bests)
        finally:
            ahead.close()


def _searched(ahead: Ahead, tried: list, good_us: float, bests: dict | None) -> list:
    firsts, ups = [t for first, _ in tried for t in first], [u for _, ups in tried for u in ups]
    good_round = [math.inf]   # the first round with a good-enough schedule, as far as known

    def then(climbed, round, lone):   # the next ask that the ask of `round` leads to
        def after(result):
            if result[0] <= good_us:
                good_round[0] = min(good_round[0], round)
            ladder = climbed(result[0]) if round < good_round[0] else None
            if ladder is None or not ladder[2]:   # a twin is asked only if near the best
                return None
            return ask(ladder, round + 1, lone)
        return after

    def ask(ladder, round, lone):   # (key, what it leads to, a guess above it if `lone`)
        key = _asked(ladder)
        return key, then(_climbing(ladder, key[0]), round, lone), _guess(ladder[2], lone)

    started = lambda first, up: lambda us: (us, first, up) if up else None  # noqa: E731
    lone = len(firsts) == 1
    judged = ahead.results([((first, math.inf), then(started(first, up), 0, lone),
                             _guess([first] + up, lone)) for first, up in zip(firsts, ups)])
    seen = list(judged)   # every full run (one given up is slower than its ladder's best)
    best = min(judged, key=lambda r: r[0])
    # per ladder: its best time and try, and the rungs left (none: its best's twin next)
    climbing = [c for c in (started(first, up)(r[0]) for r, first, up in zip(judged, firsts, ups))
                if c]
    round = 0
    while climbing and best[0] > good_us:
        round += 1
        asks = [ask(c, round, len(climbing) == 1) for c in climbing]
        judged, keys = ahead.results(asks), [key for key, _, _ in asks]
        climbing = [_climbed(*c, key[0], us)
                    for c, key, (us, *_) in zip(climbing, keys, judged) if c[2]]
        best = min([best] + judged, key=lambda r: r[0])
        seen += judged
        climbing = [c for c in climbing if c and (c[2] or c[0] <= best[0] * (1 + NOISE))]
    for r in seen if bests is not None else ():
        if r[0] < bests.get(r[2].lower, (math.inf,))[0]:
            bests[r[2].lower] = r
    good = [r for r in judged + [best] if r[0] <= good_us]
    if good:
        return [min(good, key=lambda r: (r[1].nchunks, r[0]))]
    fewest = min((r for r in seen if r[0] <= best[0] * (1 + NOISE)),
                 key=lambda r: (r[1].nchunks, r[0]))
    return [best] + [fewest] * (fewest is not best)


def _asked(ladder: tuple) -> tuple:
    """``(try, beat)``: what a ladder ``(best us, its try, rungs left)`` judges next, its next
    rung or, once a rung lost, its best's twin, given up once it cannot beat the ladder's best
    by more than :data:`~.cost_tables.NOISE`."""
    least, at, rungs = ladder
    return rungs[0] if rungs else at.nudged(), least * (1 + NOISE)


def _guess(rungs: list, lone: bool) -> tuple | None:
    """On a ``lone`` ladder, the rung above ``rungs[0]``, judged in full by a thread that would
    idle while ``rungs[0]`` is: its run decides that rung's ask (docs/planner.md has why)."""
    return (rungs[1], math.inf) if lone and len(rungs) > 1 else None


def _climbing(ladder: tuple, ask) -> Callable:
    """``ladder`` once ``ask`` took ``us`` (:func:`_climbed`; None after its twin)."""
    return lambda us: _climbed(*ladder, ask, us) if ladder[2] else None


def _climbed(least: float, at, rungs: list, ask, us: float) -> tuple | None:
    """A ladder once its rung ``ask`` took ``us`` (``least``: its best, at ``at``): on up while
    rungs gain more than :data:`~.cost_tables.NOISE`; after a loss by more, its best's twin
    (:meth:`_Try.nudged`), if near the best so far; flat (noise, not a gain), done (None)."""
    if us < least * (1 - NOISE):
        return (us, ask, rungs[1:]) if rungs[1:] else None
    return (least, at, []) if us >= least * (1 + NOISE) else None


def _tries(name, packing, p, pipe, collective, n, root, inplace) -> tuple[list, list]:
    """``packing``'s schedules worth simulating, as thunks: at the pipeline model's chunk
    counts (on one lane per edge, waits paid in lockstep, :meth:`Pipeline.chunks`, hidden,
    :meth:`Pipeline.hidden_chunks`, and their geometric mean; where two lanes per edge fit,
    the hidden count double-buffered, and on one lane as well where the trees are deep,
    :meth:`Pipeline.deep` at four times it), and from each try at the hidden count a ladder
    of more chunks on as many lanes (:meth:`Pipeline.rungs`, :func:`_fastest`)."""
    packing = _centred(p, packing)
    lower = _lowering(name, packing, p, collective, n, root, inplace)
    m, hidden, k = pipe.chunks(packing), pipe.hidden_chunks(packing), pipe.trees(packing)
    first = list(dict.fromkeys([(m, 1), (round((m * hidden) ** 0.5), 1), (hidden, 1)]))
    if lower.buffers > 1:   # most_buffers, counted once per packing by its lowering
        # a second lane of its own hides each piece's wait behind the other's; one lane can
        # still win where the lanes are shared, or where the fill of many levels outweighs
        # the waits it pays
        alone = P.fits_twice(packing.trees, p.modes(), p.lanes)
        first = [(hidden, 2)] if alone and not pipe.deep(packing, 4 * hidden) else \
            [(hidden, 1), (hidden, 2)]
    rungs = pipe.rungs(packing, hidden)
    return ([_Try(lower, c, b, k) for c, b in first],
            [[_Try(lower, r, b, k) for r in rungs] if c == hidden else [] for c, b in first])


@dataclass(frozen=True)
class _Try:
    """A schedule to simulate: ``chunks`` per tree (``trees`` per group), ``buffers`` lanes;
    ``deal``: how a group's chunks are dealt to its trees where not evenly, ``pace``: the node
    each tree's broadcast keeps pace with, where any (both :func:`_balanced`)."""

    lower: Callable
    chunks: int
    buffers: int
    trees: int
    deal: tuple = ()
    pace: tuple = ()

    @property
    def per_group(self) -> int:
        return self.chunks * self.trees

    def __call__(self):
        return self.lower(self.per_group, self.buffers, deal=self.deal, pace=self.pace)

    def nudged(self) -> "_Try":
        """One chunk more per tree: pieces lined up on links at one count rarely are at the next."""
        return replace(self, chunks=self.chunks + 1)


def _centred(p: P.Problem, packing: Packing) -> Packing:
    """Trees used both ways rooted at their centres (:func:`~.program.centred`)."""
    centred = tuple(P.centred(t) for t in packing.trees) if P.BOTH in p.ways else None
    return replace(packing, trees=centred) if centred else packing


def _lowering(name, packing, p, collective, n, root, inplace):
    """``lower(per_group, buffers=1, packed=True, deal=(), pace=())`` for ``packing``, its
    ``dealt(per_group, deal, ends)`` (:func:`_redealt`) and ``paced(per_group, deal, ends)``
    (:func:`_laggards`)."""
    label, modes = name + ("+host" if packing.staged else ""), p.modes()
    low = lambda per_group, buffers=1, packed=True, deal=(), pace=(): lower(  # noqa: E731
        packing, modes, collective, n, per_group, root=root, inplace=inplace,
        algorithm=label, buffers=buffers, packed=packed, lanes=p.lanes, deal=dict(deal),
        pace=dict(pace))
    low.dealt = lambda per_group, deal, ends: _redealt(packing, modes, collective, n, per_group,
                                                       dict(deal), ends)
    low.paced = lambda per_group, deal, ends: _laggards(packing, modes, collective, per_group,
                                                        dict(deal), ends)
    low.rate, low.buffers = packing.rate, most_buffers(packing, modes, p.lanes)
    return low


def _redealt(packing, modes, collective: str, nranks: int, per_group: int, deal: dict, ends):
    """``(deal, us)``: each group's ``per_group`` chunks dealt so that its trees finish together,
    by the chunks per microsecond each delivered in a run dealt by ``deal`` (``ends[rank,
    chunk]``, :func:`~.simulate.chunk_ends`; a tree used both ways, or two groups dealt alike,
    by the later of its two); ``us``: when the slowest group would end at those rates.
    ``((), inf)`` where some tree delivered nothing (:func:`_delivered` says where it looks)."""
    rates: dict = {}
    for (_, key), i, t, got, block in _delivered(packing, modes, collective, per_group, deal, ends):
        rows = [t.root] if collective == "reduce_scatter" else slice(0, nranks)
        end = float(block[rows].max(initial=0.0)) if block is not None else 0.0
        by = rates.setdefault(key, {})
        by[i] = min(by.get(i, math.inf), len(got) / end if end > 0 else 0.0)
    if any(r == 0 for by in rates.values() for r in by.values()):
        return (), math.inf
    return (tuple((key, tuple(by[i] for i in sorted(by))) for key, by in sorted(rates.items())),
            max(per_group / sum(by.values()) for by in rates.values()))


def _delivered(packing, modes: dict, collective: str, per_group: int, deal: dict, ends):
    """Per tree of ``packing`` dealt by ``deal``: ``((group, key), its index in the group,
    tree, its chunks, ends[:, its chunks])`` (:func:`_dealt`; ``ends[rank, chunk]`` of a run,
    :func:`~.simulate.chunk_ends`), the last None where the tree carries no chunk the run
    wrote. Allgather gathers root ``r``'s chunks at ``r * per_group`` of every output."""
    for group_key, shares in _dealt(packing, modes, per_group, deal):
        for i, (t, chunks) in enumerate(shares):
            at = t.root * per_group if collective == "allgather" else 0
            block = ends[:, at + chunks[0]:at + chunks[-1] + 1] \
                if chunks and at + chunks[-1] < ends.shape[1] else None
            yield group_key, i, t, chunks, block


def _laggards(packing, modes: dict, collective: str, per_group: int, deal: dict, ends) -> tuple:
    """Per group, the node of each tree that received the tree's chunks last in a run
    dealt by ``deal`` (``ends[rank, chunk]``, :func:`~.simulate.chunk_ends`): what each
    tree's broadcast keeps pace with (``Share.pace``). Empty for collectives without a
    broadcast, and where no tree's last node received them more than
    :data:`~.cost_tables.FILL` of the run after the tree's median node: a pipeline's nodes
    finish apart by its fill, and nothing ran ahead that pacing could hold back."""
    if collective not in PACED:
        return ()
    pace: dict = {}
    lag = 0.0   # the most any tree's last node lagged its median one, in runs
    for (group, _), _, t, _, block in _delivered(packing, modes, collective, per_group, deal, ends):
        nodes = [c for _, c in t.edges]
        if block is None or not nodes:
            pace.setdefault(group, []).append(-1)
            continue
        last = block[nodes].max(axis=1)
        pace.setdefault(group, []).append(nodes[int(last.argmax())])
        lag = max(lag, float(last.max() - np.median(last)) / max(float(ends.max()), 1e-300))
    if lag <= FILL:
        return ()
    return tuple((group, tuple(nodes)) for group, nodes in sorted(pace.items()))


class Pipeline:
    """The pipeline model of a packing: each of its trees moves ``m`` chunks, and a chunk crosses
    one tree level per chunk time.

    A tree of depth ``d`` (a hop staged through host memory counts two; a tree used both ways
    climbs and descends) finishes ``(d - 1) / m`` of its run ``T`` after its first level. Every
    chunk also waits out its route's latency ``w``, one after the other on the tree's lane; the
    model brackets how much of that idles a link: ``m w`` of the run where equal trees move in
    lockstep and wait together (:meth:`chunks`), ``m w / c`` where ``c`` other transfers on the
    link move meanwhile (:meth:`hidden_chunks`, the rounding's ranking). ``m = sqrt(T (d - 1) c /
    w)`` balances fill and waits, within :data:`MIN_CHUNK_BYTES` per chunk and
    :data:`INSTRUCTIONS` per schedule. The fill is bracketed too: a group's ``k`` trees may fill
    links the others have not reached yet (links are shared fairly), and then fill as one
    pipeline of ``k m`` chunks, ``(d - 1) / (k m)`` of the run (:meth:`time`'s ``shared``)."""

    def __init__(self, p: P.Problem, unit: float):
        self.p, self.unit = p, unit
        self.passes = 2 if P.BOTH in p.ways else 1
        self.lp_wait, self.lp_crowd = 1.0, 1

    def most_trees(self) -> int:
        """Trees per group the message has chunks for: a tree without one idles."""
        return max(1, int(self.unit // MIN_CHUNK_BYTES))

    def trees(self, packing: Packing) -> int:
        """Trees per group as its chunks count them (``chunks * trees`` per group). Trees dealt
        by rate (:func:`_dealt`) count as the equal trees the fastest's share stands for: it
        carries the most chunks and waits once for each (a star with 0.9 of a group counts 1)."""
        shares = () if _cut_alike(self.p.modes()) else [
            max(r) / sum(r) for ts in _by_group(packing).values() if (r := _rates(ts))]
        return max(1, round(1 / max(shares)) if shares else
                   len(packing.trees) // len(self.p.groups))

    def depth(self, packing: Packing) -> int:
        return self.passes * max(t.depth() for t in packing.trees)

    def chunks(self, packing: Packing) -> int:
        """``m``: the chunks each tree carries on one lane per tree edge."""
        return self._chunks(self.trees(packing), packing.rate, self.depth(packing),
                            self._wait(packing))

    def hidden_chunks(self, packing: Packing) -> int:
        """``m`` where the other transfers on a tree's links hide its waits (its chunks out
        of phase with theirs: double buffering, or trees that drift apart): a link that
        carries ``c`` transfers at once loses ``m w / c``, so ``m = sqrt(T (d - 1) c / w)``."""
        return self._chunks(self.trees(packing), packing.rate, self.depth(packing),
                            self._wait(packing), _crowd(packing.trees))

    def _wait(self, packing: Packing) -> float:
        return max(self.p.way(t, i).wait_us for t in packing.trees
                   for i in range(len(t.edges)))

    def _chunks(self, k: int, rate: float, depth: int, wait: float, crowd: int = 1) -> int:
        run_us = self.full_us(rate)
        best = (run_us * max(depth - 1, 1) * crowd / max(wait, 1e-3)) ** 0.5
        return max(1, int(min(best, self.most_chunks(k))))

    def rungs(self, packing: Packing, hidden: int) -> list:
        """The chunk counts a ladder climbs from ``hidden``: twice and four times it, doubling on
        while the fill, ``(d - 1) / m`` of a run, exceeds :data:`FILL` (deep trees) and chunks
        stay at least :data:`MIN_CHUNK_BYTES`, then the most :meth:`most_chunks` allows (if
        still deep, the most of that size: fill is what such trees lose most)."""
        k, rungs = self.trees(packing), [2 * hidden, 4 * hidden]
        floor = int(self.unit / k / MIN_CHUNK_BYTES)
        while self.deep(packing, rungs[-1]) and 2 * rungs[-1] <= floor:
            rungs.append(2 * rungs[-1])
        most = floor if self.deep(packing, rungs[-1]) else int(self.most_chunks(k))
        return rungs + [most] * (most > rungs[-1])

    def deep(self, packing: Packing, chunks: int) -> bool:
        """Whether ``packing``'s pipeline fills for more than :data:`FILL` of a run at
        ``chunks`` per tree: ``(d - 1) / m`` of it."""
        return self.depth(packing) - 1 > FILL * chunks

    def most_chunks(self, k: int) -> float:
        """The most chunks each of ``k`` trees per group may carry."""
        edges = self.passes * (len(self.p.gpus) - 1) * len(self.p.groups) * k
        return min(self.unit / k / MIN_CHUNK_BYTES, INSTRUCTIONS / edges)

    def fit(self, lp: Packing) -> None:
        """Take the route latency of ``lp``'s trees, and the groups whose trees meet on a
        link, as the rounding's (its trees are not built until it has chosen): ``k`` trees
        of each of those groups cross that link at once."""
        self.lp_wait = self._wait(lp)
        meet = {(link, t.group) for t in lp.trees for path in t.paths for link, _ in path}
        self.lp_crowd = max(Counter(link for link, _ in meet).values(), default=1)
        self.lp_rate = lp.rate

    def time(self, k: int, rate: float, depth: int, lockstep: bool = False, shared=False) -> float:
        """The predicted run time, up to a constant factor, of ``k`` trees per group at ``rate``
        per group whose deepest is ``depth`` deep (the rounding's cost), their waits hidden as far
        as they can be (the ``k`` trees of every group that meets on a link cross it at once,
        :meth:`hidden_chunks`), or with ``lockstep`` not at all; ``shared``: their fill too."""
        depth *= self.passes
        crowd = 1 if lockstep else k * self.lp_crowd
        m = self._chunks(k, rate, depth, self.lp_wait, crowd)
        run_us = self.full_us(rate)
        fill = (depth - 1) / (m * (k if shared else 1))
        return (1 + fill + m * self.lp_wait / (crowd * run_us)) / rate

    def full_us(self, rate: float) -> float:
        """The transfer time (us) of a packing at ``rate`` per group whose busiest link is full
        from start to end: no fill, no waits."""
        return self.unit / (rate * 1e3)

    def to_beat(self, beat_us: float | None) -> float | None:
        """A transfer time in microseconds in :meth:`time`'s units (None stays None). A
        packing at ``rate`` takes ``unit / rate`` at least: its busiest link is full."""
        return None if beat_us is None else max(beat_us, 0.0) * 1e3 / self.unit

    def least_rate(self, k: int, time: float, depth: int = 1) -> float:
        """The rate per group ``k`` trees need to finish within ``time`` (the units of
        :meth:`time`) at best: ``depth`` levels deep, their chunks' waits hidden."""
        levels = self.passes * depth
        return (1 + (levels - 1) / self._chunks(k, self.lp_rate, levels, self.lp_wait,
                                                k * self.lp_crowd)) / time

    def level_cost(self, lp: Packing) -> float:
        """What one level of one arc's distance from the root costs the rounding, in the
        program's load units: every level a tree has adds a chunk time, ``1 / m`` of a run,
        spread over the arcs of every group's trees."""
        m = self._chunks(1, lp.rate, self.depth(lp), self.lp_wait, self.lp_crowd)
        return 1.0 / (lp.rate * m * len(self.p.groups))


def _crowd(trees) -> int:
    """The most tree edges that cross one link: the transfers a link carries at once."""
    return max(Counter(link for t in trees for path in t.paths for link, _ in path).values(),
               default=1)


def lower(packing: Packing, modes: dict, collective: str, nranks: int, per_group: int, *,
          root: int = 0, inplace: bool = False, algorithm: str = "blink", buffers: int = 1,
          packed: bool = False, lanes: int = GPU_LANES, deal: dict | None = None,
          pace: dict | None = None) -> Schedule | PackedSchedule:
    """``collective`` over ``packing``'s trees (GPU indices; ``modes[group]`` says which way
    a group's data moves), ``per_group`` chunks dealt over each group's trees (evenly, or as
    ``deal`` says: :func:`_dealt`), on ``buffers`` lanes per tree edge (at most
    :func:`most_buffers`), ``lanes`` per rank at most; ``pace[group]``: per tree of it,
    the node its broadcast keeps pace with (``Share.pace``); ``packed``: a candidate to
    simulate, as a :class:`~.ir.PackedSchedule` if it can be."""
    forest = _cut_alike(modes)
    b = ScheduleBuilder(collective, nranks, per_group * (nranks if forest else 1), root=root,
                        inplace=inplace, algorithm=algorithm)
    shares: dict = {"up": [], "down": []}
    for (g, _), dealt in _dealt(packing, modes, per_group, deal or {}):
        paces = (pace or {}).get(g, ())
        for i, (t, chunks) in enumerate(dealt):
            if not chunks:
                continue   # fewer chunks than trees: some carry none
            shares["up" if modes[g] == P.UP else "down"].append(
                Share(t.root, tuple(t.edges), chunks, frozenset(t.edges[j] for j in t.staged),
                      frozenset(t.edges[j] for j in t.staged_up),
                      paces[i] if i < len(paces) else -1))
    em = emitter(b, min(buffers, most_buffers(packing, modes, lanes)), lanes)
    _EMIT[collective](b, em, shares)
    code = em.flush()
    b.meta("trees", [[s.root, [list(e) for e in s.edges], s.chunks[0], len(s.chunks),
                      *s.host_record()] for s in shares["up"] + shares["down"]])
    b.meta("rate_gbps", packing.rate)
    s = b.build() if code is None else b.build_packed(code)
    return s if packed else unpacked(s)


def _dealt(packing: Packing, modes: dict, per_group: int, deal: dict):
    """Per group of ``packing`` ``((group, key), [(tree, its chunks)])``: ``per_group`` chunks
    (from ``root * per_group`` in a forest allreduce, whose roots own a range each) dealt to the
    group's trees evenly, by the weights ``deal[key]`` (``key``: the group's root and first
    chunk, shared by the two ways of a forest allreduce), or where trees of unequal rates have
    no weights, by their rates (not a forest allreduce's: :func:`_cut_alike`)."""
    forest = _cut_alike(modes)
    for g, ts in sorted(_by_group(packing).items()):
        first = ts[0].root * per_group if forest else 0
        key, k = (ts[0].root, first), len(ts)
        w = deal.get(key, None if forest else _rates(ts))   # a forest's two ways cut alike
        cuts = [i * per_group // k for i in range(k + 1)] if w is None else \
            [round(per_group * sum(w[:i]) / sum(w)) for i in range(k + 1)]
        yield (g, key), [(t, tuple(range(first + a, first + z)))
                         for t, a, z in zip(ts, cuts, cuts[1:])]


def _cut_alike(modes: dict) -> bool:
    """Whether groups of ``modes`` cut chunks evenly whatever their trees' rates: a forest
    allreduce's up and down groups reduce and broadcast each root's range, and cut it alike."""
    return {P.UP, P.DOWN} <= set(modes.values())


def _by_group(packing: Packing) -> dict:
    """``{group: its trees}``, in ``packing``'s order."""
    groups = dict.fromkeys(t.group for t in packing.trees)
    return {g: [t for t in packing.trees if t.group == g] for g in groups}


def _rates(trees) -> tuple | None:
    """A group's trees' own rates where they differ (the LP's trees, :func:`~.program.equal_trees`),
    to deal its chunks by; None where they are equal trees, dealt evenly."""
    rates = [t.rate for t in trees]
    return tuple(rates) if max(rates) > min(rates) * (1 + 1e-9) else None


def most_buffers(packing: Packing, modes: dict, lanes: int) -> int:
    """2 (double buffering) where every rank's lanes fit twice in ``lanes``
    (:func:`~.program.fits_twice`), or at least its pulls do (once per pass: trees used both
    ways pass twice; lanes are then shared, which can still pay: the simulator judges), else 1."""
    passes = 2 if P.BOTH in modes.values() else 1
    pulls = Counter(c for t in packing.trees for _, c in t.edges)
    fit = P.fits_twice(packing.trees, modes, lanes)
    return 2 if fit or 2 * passes * max(pulls.values(), default=0) <= lanes else 1


def _broadcast(b, em, shares):
    if not b.inplace:
        em.self_copy(b.root, Ref(b.root, "output", 0, b.nchunks),
                     Ref(b.root, "input", 0, b.nchunks))
    em.broadcast(shares["down"], src=chunk_refs("input"), dst=chunk_refs("output"))


def _reduce(b, em, shares):
    em.reduce(shares["up"], contrib=chunk_refs("input"), result=chunk_refs("output"))


def _allgather(b, em, shares):
    c = b.nchunks
    if not b.inplace:
        for r in range(b.nranks):
            em.self_copy(r, Ref(r, "output", r * c, c), Ref(r, "input", 0, c))
    em.broadcast(shares["down"], src=chunk_refs("input"), dst=chunk_refs("output", c))


def _reduce_scatter(b, em, shares):
    em.reduce(shares["up"], contrib=chunk_refs("input", b.nchunks), result=chunk_refs("output"))


def _allreduce(b, em, shares):
    here = chunk_refs("output")
    ups = shares["up"] or shares["down"]          # trees used both ways: the same shares
    done = em.reduce(ups, contrib=chunk_refs("input"), result=here)
    em.broadcast(shares["down"], src=here, dst=here, after=done)


_EMIT = {"broadcast": _broadcast, "reduce": _reduce, "allgather": _allgather,
         "reduce_scatter": _reduce_scatter, "allreduce": _allreduce}

