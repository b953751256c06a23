"""Max-min fair sharing of links between flows (progressive filling), and the event loop over it.

Progressive filling: raise the rate of every unfrozen flow together until some link is full;
freeze the flows crossing a full link; repeat. The result is the max-min fair allocation, and no
link ever carries more than its capacity, which is what keeps the simulator from predicting
anything faster than the topology allows.

Flows with the same route always get the same rate, so the filling runs over *route classes*
weighted by how many active flows each has: a schedule with many lanes between the same pair of
GPUs costs no more than one with a single lane.

``native/src/sim_fairshare.cpp`` is this loop in native code, operation for operation (see
:mod:`._taskloop`); a change here needs the same change there, and
``tests/test_simulate_native.py`` checks that the two agree bit for bit.
"""

from __future__ import annotations

import heapq
import threading
from typing import Callable

_EPS = 1e-12


def progressive_fill(links: dict[int, tuple[int, ...]], weight: dict[int, int],
                     capacity: list[float]) -> dict[int, float]:
    """Max-min fair rate per route class.

    ``links[c]`` are the resources class ``c`` crosses and ``weight[c]`` its number of active
    flows (each gets the returned rate). Cost: O(levels x busy resources + sum of route
    lengths): each level scans only the resources that still have unfrozen users, and a frozen
    class is visited once through the resources it crosses.
    """
    users: dict[int, int] = {}              # unfrozen flows per resource (no zeros)
    crossing: dict[int, list[int]] = {}     # classes per resource
    for c, w in weight.items():
        for link in links[c]:
            users[link] = users.get(link, 0) + w
            crossing.setdefault(link, []).append(c)
    rate: dict[int, float] = {}
    for c, w in weight.items():
        # A class alone on every resource it crosses (e.g. one link between two GPUs) gets
        # its bottleneck's capacity; only classes sharing resources need the filling.
        route = links[c]
        if route and all(len(crossing[link]) == 1 for link in route):
            rate[c] = min(capacity[link] for link in route) / w
            for link in route:
                del users[link]
    left = {link: capacity[link] for link in users}
    level = 0.0
    while users:
        inc = min(left[link] / n for link, n in users.items())
        level += inc
        full = []
        for link, n in users.items():
            left[link] -= inc * n
            if left[link] <= _EPS * capacity[link] + 1e-9 * inc * n:
                full.append(link)
        for link in full:
            for c in crossing[link]:
                if c in rate:
                    continue
                rate[c] = level
                for other in links[c]:
                    users[other] -= weight[c]
        users = {link: n for link, n in users.items() if n > 0}
    return rate


def fair_rates(active: list[int], routes: list[tuple[int, ...]],
               capacity: list[float]) -> dict[int, float]:
    """Max-min fair rate of each active flow; ``routes[f]`` lists the resources flow ``f`` uses.

    >>> fair_rates([0, 1, 2], [(0,), (0, 1), (1,)], [10.0, 4.0])
    {0: 8.0, 1: 2.0, 2: 2.0}
    """
    classes: dict[tuple[int, ...], int] = {}
    weight: dict[int, int] = {}
    for f in active:
        c = classes.setdefault(routes[f], len(classes))
        weight[c] = weight.get(c, 0) + 1
    rate = progressive_fill({c: r for r, c in classes.items()}, weight, capacity)
    return {f: rate[classes[routes[f]]] for f in active}


_MEMO_LIMIT = 200_000


class RouteClasses:
    """Route class ids and memoized fair shares, shareable by every run on one topology.

    Planner benchmarks simulate many schedules on the same machine; the same mixes of transfers
    recur across them, so keeping this table with the topology's routes saves most fills.
    """

    def __init__(self):
        self.ids: dict[tuple[int, ...], int] = {}
        self.links: dict[int, tuple[int, ...]] = {}
        self.memo: dict[tuple, dict[int, float]] = {}
        self._numbering = threading.Lock()   # planners simulate candidates on threads

    def class_of(self, route: tuple[int, ...]) -> int:
        """The id of ``route``'s class, numbering it on first sight (one id per route, also
        when several threads see it first at once)."""
        c = self.ids.get(route)
        if c is None:
            with self._numbering:
                c = self.ids.get(route)
                if c is None:
                    c = len(self.links)
                    self.links[c] = route   # before its id: whoever finds the id finds this
                    self.ids[route] = c
        return c


class FlowLoop:
    """Event-driven flows: each starts after its latency, then shares links fairly until done.

    ``on_done(flow, now)`` is called as each flow completes; it may call :meth:`add` to start
    more flows (that is how instructions trigger their successors). Times are in microseconds,
    sizes in bytes, capacities in bytes per microsecond.

    Every flow of a route class runs at the class's rate, so the loop keeps one *served*
    counter per class (bytes each of its flows has moved since the class became active) and a
    heap of the counter values at which its flows finish. An event then costs O(classes), not
    O(flows): with many lanes between the same GPUs that is the difference between seconds and
    tens of seconds on a large forest schedule.
    """

    def __init__(self, capacity: list[float], on_done: Callable[[int, float], None],
                 classes: "RouteClasses | None" = None):
        self.capacity = list(capacity)
        self.on_done = on_done
        shared = classes or RouteClasses()
        self._classes, self._links, self._memo = shared, shared.links, shared.memo
        if len(self._memo) > _MEMO_LIMIT:
            self._memo.clear()
        self._count: dict[int, int] = {}      # active flows per route class (no zeros)
        self._served: dict[int, float] = {}   # bytes moved per flow of each active class
        self._ends: dict[int, list] = {}      # per active class: heap of (served at end, flow)
        self.size: list[float] = []           # bytes per flow
        self.cls: list[int] = []              # route class per flow
        self._pending: list[tuple[float, int]] = []
        self.now = 0.0

    def add(self, nbytes: float, route: tuple[int, ...], latency_us: float) -> int:
        """Queue a flow of ``nbytes`` over ``route`` that starts ``latency_us`` from now."""
        f = len(self.size)
        self.size.append(float(nbytes))
        self.cls.append(self._classes.class_of(route))
        heapq.heappush(self._pending, (self.now + latency_us, f))
        return f

    def add_class(self, nbytes: float, cls: int, latency_us: float) -> int:
        """:meth:`add` for a route already numbered in the shared :class:`RouteClasses`."""
        f = len(self.size)
        self.size.append(float(nbytes))
        self.cls.append(cls)
        heapq.heappush(self._pending, (self.now + latency_us, f))
        return f

    def _rates(self) -> dict[int, float]:
        # Schedules repeat the same mix of transfers step after step: memoize on the mix.
        key = tuple(sorted(self._count.items()))
        rate = self._memo.get(key)
        if rate is None:
            rate = self._memo[key] = progressive_fill(self._links, self._count, self.capacity)
        return rate

    def run(self) -> float:
        """Advance until no flow is left; returns the time of the last completion."""
        while self._pending or self._ends:
            self._start_due()
            if not self._ends:
                if self._pending:
                    self.now = self._pending[0][0]
                continue
            rate = self._rates()
            served = self._served
            step = min((ends[0][0] - served[c]) / rate[c] for c, ends in self._ends.items())
            if self._pending:
                step = min(step, self._pending[0][0] - self.now)
            self._advance(rate, max(step, 0.0))
        return self.now

    def _start_due(self) -> None:
        # Zero-byte flows finish as soon as their latency has passed; finishing may queue more.
        while self._pending and self._pending[0][0] <= self.now * (1 + _EPS) + _EPS:
            _, f = heapq.heappop(self._pending)
            if self.size[f] <= 0.0:
                self.on_done(f, self.now)
                continue
            c = self.cls[f]
            ends = self._ends.get(c)
            if ends is None:
                ends = self._ends[c] = []
                self._served[c] = 0.0
            heapq.heappush(ends, (self._served[c] + self.size[f], f))
            self._count[c] = self._count.get(c, 0) + 1

    def _advance(self, rate: dict[int, float], step: float) -> None:
        self.now += step
        done = []
        size = self.size
        for c, ends in list(self._ends.items()):
            s = self._served[c] + rate[c] * step
            self._served[c] = s
            while ends and ends[0][0] - s <= 1e-9 * max(size[ends[0][1]], 1.0):
                done.append(heapq.heappop(ends)[1])
            if not ends:
                del self._ends[c], self._served[c], self._count[c]
            else:
                self._count[c] = len(ends)
        for f in done:
            self.on_done(f, self.now)
