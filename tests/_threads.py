"""Ranks as threads of the test process."""

from __future__ import annotations

import threading


def on_threads(nranks: int, fn) -> tuple[list, list]:
    """``fn(rank)`` on ``nranks`` threads at once: (results, exceptions), both by rank, with
    None where a rank raised or returned."""
    results, errors = [None] * nranks, [None] * nranks

    def run(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors[rank] = e
    threads = [threading.Thread(target=run, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors
