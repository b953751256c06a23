"""Max-min fair sharing of links between flows (progressive filling), and the event loop over it.

Progressive filling: raise the rate of every unfrozen flow together until some link is full;
freeze the flows crossing a full link; repeat. The result is the max-min fair allocation, and no
link ever carries more than its capacity, which is what keeps the simulator from predicting
anything faster than the topology allows.
"""

from __future__ import annotations

import heapq
from typing import Callable

_EPS = 1e-12


def fair_rates(active: list[int], routes: list[tuple[int, ...]],
               capacity: list[float]) -> dict[int, float]:
    """Max-min fair rate of each active flow; ``routes[f]`` lists the resources flow ``f`` uses.

    >>> fair_rates([0, 1, 2], [(0,), (0, 1), (1,)], [10.0, 4.0])
    {1: 2.0, 2: 2.0, 0: 8.0}
    """
    users: dict[int, int] = {}
    for f in active:
        for link in routes[f]:
            users[link] = users.get(link, 0) + 1
    left = {link: capacity[link] for link in users}
    unfrozen = set(active)
    rates: dict[int, float] = {}
    level = 0.0
    while unfrozen:
        inc = min(left[link] / n for link, n in users.items() if n)
        level += inc
        full = set()
        for link, n in users.items():
            if n:
                left[link] -= inc * n
                if left[link] <= _EPS * capacity[link]:
                    full.add(link)
        for f in sorted(unfrozen):
            if not full.isdisjoint(routes[f]):
                rates[f] = level
                unfrozen.discard(f)
                for link in routes[f]:
                    users[link] -= 1
    return rates


class FlowLoop:
    """Event-driven flows: each starts after its latency, then shares links fairly until done.

    ``on_done(flow, now)`` is called as each flow completes; it may call :meth:`add` to start
    more flows (that is how instructions trigger their successors). Times are in microseconds,
    sizes in bytes, capacities in bytes per microsecond.
    """

    def __init__(self, capacity: list[float], on_done: Callable[[int, float], None]):
        self.capacity = capacity
        self.on_done = on_done
        self.routes: list[tuple[int, ...]] = []
        self.left: list[float] = []
        self._pending: list[tuple[float, int]] = []
        self._active: list[int] = []
        self.now = 0.0

    def add(self, nbytes: float, route: tuple[int, ...], latency_us: float) -> int:
        """Queue a flow of ``nbytes`` over ``route`` that starts ``latency_us`` from now."""
        f = len(self.routes)
        self.routes.append(route)
        self.left.append(float(nbytes))
        heapq.heappush(self._pending, (self.now + latency_us, f))
        return f

    def run(self) -> float:
        """Advance until no flow is left; returns the time of the last completion."""
        while self._pending or self._active:
            self._start_due()
            if not self._active:
                if self._pending:
                    self.now = self._pending[0][0]
                continue
            rates = fair_rates(self._active, self.routes, self.capacity)
            step = min(self.left[f] / rates[f] for f in self._active)
            if self._pending:
                step = min(step, self._pending[0][0] - self.now)
            self._advance(rates, max(step, 0.0))
        return self.now

    def _start_due(self) -> None:
        # Zero-byte flows finish as soon as their latency has passed; finishing may queue more.
        while self._pending and self._pending[0][0] <= self.now * (1 + _EPS) + _EPS:
            _, f = heapq.heappop(self._pending)
            if self.left[f] <= 0.0:
                self.on_done(f, self.now)
            else:
                self._active.append(f)

    def _advance(self, rates: dict[int, float], step: float) -> None:
        self.now += step
        still, done = [], []
        for f in self._active:
            moved = rates[f] * step
            if self.left[f] - moved <= _EPS * max(1.0, self.left[f]) * 1e3:
                self.left[f] = 0.0
                done.append(f)
            else:
                self.left[f] -= moved
                still.append(f)
        self._active = still
        for f in done:
            self.on_done(f, self.now)
