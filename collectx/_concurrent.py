"""Running independent calls on several threads at once, with results in call order.

Why: the planner judges several candidates whose work is mostly native code that releases the
GIL (HiGHS solving a rounding's integer program, the flow simulator's event loop), so a core
each shortens a plan's wall time. Results come back in the order the calls were given, and
each call computes what it would alone, so a plan does not depend on the thread count: every
rank of a job plans the same schedule.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

WORKERS = min(4, os.cpu_count() or 1)   # threads at once: up to a core each; past 4, few plans
                                        # have that many independent candidates at a time
_held = threading.local()               # the pool a thread's `shared_threads` block holds


def concurrently(calls: list) -> list:
    """``[call() for call in calls]`` (None for a call that is None: nothing to do there), on
    up to :data:`WORKERS` threads: those of the enclosing :func:`shared_threads` block, else a
    pool made for this call (none outlives the call, so a process may fork afterwards).

    >>> concurrently([lambda: 1, None, lambda: 2])
    [1, None, 2]
    """
    run = lambda call: None if call is None else call()  # noqa: E731
    if WORKERS < 2 or len(calls) < 2:
        return [run(call) for call in calls]
    pool = getattr(_held, "pool", None)
    if pool is not None:
        return list(pool.map(run, calls))
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(calls))) as pool:
        return list(pool.map(run, calls))


@contextlib.contextmanager
def shared_threads():
    """Within the block, this thread's :func:`concurrently` calls share one pool, shut down
    when the block ends. A plan makes about twenty such calls, and starting their threads
    anew each time cost 2-4 ms a call. Calls made on the pool's own threads still make
    pools of their own: one waiting on the shared pool from inside it could wait forever.

    >>> with shared_threads():
    ...     concurrently([lambda: 1, lambda: 2])
    [1, 2]
    """
    if WORKERS < 2 or getattr(_held, "pool", None) is not None:
        yield
        return
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        _held.pool = pool
        try:
            yield
        finally:
            _held.pool = None


def stop_flag() -> np.ndarray | None:
    """The stop flag of the call this thread runs for an :class:`Ahead`, else None: one int32,
    set once the call's result will not be read, which long native loops poll
    (``cx_sim_fairshare_stoppable``) to stop early. A call stopped so raises; nobody sees it.

    >>> stop_flag() is None
    True
    """
    return getattr(_held, "stop", None)


class Ahead:
    """Keyed calls, each run once, on the threads of the enclosing :func:`shared_threads`
    block, and started before they are asked for where the caller knows what it may ask
    next: a call asked for with ``follow`` starts ``follow(result)`` (an ask, or None) as soon
    as it has its result, without waiting for the others asked for with it. Results are read
    only where asked for, so what the caller computes does not depend on the thread count;
    outside a block, or with :data:`WORKERS` < 2, each call runs when asked for.

    An ask is ``(key, follow)`` or ``(key, follow, guess)``: ``guess`` is a key the call may
    lead to, started while a thread would otherwise idle, and dropped (stopped, if it runs)
    once ``follow`` leads elsewhere. ``wider(key)``, where given, names a call whose result
    serves ``key`` as well (the caller vouches for that), so a guess of ``wider(key)`` answers
    a later ask for ``key``: a ladder whose rungs each wait on the one below climbs on two
    threads.

    >>> with shared_threads():
    ...     ahead = Ahead(lambda n: n * n)
    ...     then = lambda r: (r, None) if r < 100 else None   # 4 -> 16 -> 256, started early
    ...     ahead.results([(2, then), (3, None)]), ahead.results([(4, None)])
    ([4, 9], [16])
    """

    def __init__(self, compute, wider=None):
        self._compute, self._pool = compute, getattr(_held, "pool", None)
        self._wider = wider
        self._started: dict = {}
        self._flags: dict = {}          # each submitted call's stop flag (stop_flag())
        self._asked_wide: set = set()   # every key asked for, and its wider()
        self._guesses: list = []        # keys to start while threads idle, latest last
        self._guess_of: dict = {}       # the guess made with each ask, until it has settled
        self._running = 0               # calls submitted and not yet done
        self._lock = threading.Lock()
        self._closed = False

    def results(self, asks: list) -> list:
        """The result of each ``(key, follow)`` or ``(key, follow, guess)`` of ``asks``, in
        order."""
        if self._pool is None:
            return [self._compute(key) for key, *_ in asks]
        return [future.result() for future in [self._start(*ask) for ask in asks]]

    def close(self) -> None:
        """Start nothing more, drop the calls started ahead that have not begun, and set the
        stop flag of those running (:func:`stop_flag`): their results will not be read."""
        with self._lock:
            self._closed = True
            for key, future in self._started.items():
                future.cancel()
                self._flags[key][0] = 1

    def _start(self, key, follow, guess=None):
        guessed = None
        with self._lock:
            if self._wider is not None:   # asked for: never dropped as a guess
                self._asked_wide.update((key, self._wider(key)))
            future = self._started.get(key)
            if future is None and self._wider is not None:
                future = guessed = self._started.get(self._wider(key))
            if future is None and not self._closed:
                future = self._submit(key, follow)
            if guess is not None and self._wider is not None and not self._closed:
                self._guesses.append(guess)
                self._guess_of[key] = guess
            self._guess_while_idle()
        if guessed is not None and follow is not None:   # a guess started without it
            guessed.add_done_callback(lambda done: self._follow(key, done, follow))
        return future

    def _submit(self, key, follow):
        self._running += 1
        self._flags[key] = np.zeros(1, dtype=np.int32)
        future = self._started[key] = self._pool.submit(self._run, key, follow)
        return future

    def _guess_while_idle(self) -> None:
        """Start the latest guesses not yet asked for while threads would idle (lock held)."""
        while self._guesses and self._running < WORKERS and not self._closed:
            key = self._guesses.pop()
            if key not in self._started and key not in self._asked_wide:
                self._submit(key, None)

    def _settled(self, key, after) -> None:
        """The ask for ``key`` led to ``after`` (the next ask, or None): the guess made with it
        is dropped, and stopped if running, unless ``after`` asks for it."""
        with self._lock:
            guess = self._guess_of.pop(key, None)
            if guess is None or guess in self._asked_wide or (
                    after is not None and self._wider(after[0]) == guess):
                return
            if guess in self._guesses:
                self._guesses.remove(guess)
            future = self._started.pop(guess, None)   # asked for after all: run it again
            if future is None:
                return
            if future.cancel():
                self._running -= 1   # it never ran
            else:
                self._flags[guess][0] = 1

    def _follow(self, key, done, follow) -> None:
        if self._closed or done.cancelled() or done.exception() is not None:
            return
        after = follow(done.result())
        self._settled(key, after)
        if after is not None:
            self._start(*after)

    def _run(self, key, follow):
        outer, _held.stop = stop_flag(), self._flags[key]
        try:
            result = self._compute(key)
        finally:
            _held.stop = outer
            with self._lock:
                self._running -= 1
        after = follow(result) if follow is not None and not self._closed else None
        if follow is not None:
            self._settled(key, after)
        if after is not None:
            self._start(*after)   # what was asked for first, then guesses
        else:
            with self._lock:
                self._guess_while_idle()
        return result
