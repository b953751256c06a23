"""Running independent calls on several threads at once, with results in call order.

Why: the planner judges several candidates whose work is mostly native code that releases the
GIL (HiGHS solving a rounding's integer program, the flow simulator's event loop), so a core
each shortens a plan's wall time. Results come back in the order the calls were given, and
each call computes what it would alone, so a plan does not depend on the thread count: every
rank of a job plans the same schedule.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

WORKERS = min(4, os.cpu_count() or 1)   # threads at once: up to a core each; past 4, few plans
                                        # have that many independent candidates at a time


def concurrently(calls: list) -> list:
    """``[call() for call in calls]``, on up to :data:`WORKERS` threads (a pool made per use:
    none outlives the call, so a process may fork afterwards).

    >>> concurrently([lambda: 1, lambda: 2])
    [1, 2]
    """
    if WORKERS < 2 or len(calls) < 2:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(calls))) as pool:
        return list(pool.map(lambda call: call(), calls))
