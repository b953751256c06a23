"""Several rounds of the same sweep folded into one table: per-cell medians.

A shared machine's speed drifts over minutes (other tenants, memory bandwidth, frequency), so a
peer measured a minute after collectx may have seen a different machine. ``collectx-perf
--repeat N`` therefore runs collectx and each peer round-robin N times, and every cell of the
table is the median over the rounds of that backend (:func:`median_rows`): a slow spell moves one
round of one backend, not the comparison.
"""

from __future__ import annotations

import statistics


def median_cell(cells: list[dict | None]) -> dict | None:
    """One variant's cell from its rounds: median time (bandwidths follow), worst wrong count.

    >>> c = lambda t, bw, w=0: {"time_us": t, "algbw": bw, "busbw": 2 * bw, "wrong": w}
    >>> median_cell([c(1.0, 8.0), c(4.0, 2.0, 3), c(2.0, 4.0)])
    {'time_us': 2.0, 'algbw': 4.0, 'busbw': 8.0, 'wrong': 3}
    >>> median_cell([None, None]) is None
    True
    """
    present = [c for c in cells if c is not None]
    if not present:
        return None
    time_us = statistics.median(c["time_us"] for c in present)
    # Bandwidths scale with 1/time for a fixed size, so they come from the median time.
    first = present[0]
    scale = first["time_us"] / time_us if time_us > 0 else 0.0
    wrongs = [c["wrong"] for c in present if c.get("wrong") is not None]
    return {"time_us": time_us, "algbw": first["algbw"] * scale, "busbw": first["busbw"] * scale,
            "wrong": max(wrongs) if wrongs else None}


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Rows of one backend over several rounds, merged cell by cell (rows keyed by collective
    and size; a row missing from some rounds is merged over the rounds that have it)."""
    if len(rounds) == 1:
        return rounds[0]
    order, by_key = [], {}
    for rows in rounds:
        for row in rows:
            key = (row["collective"], row["size"])
            if key not in by_key:
                order.append(key)
                by_key[key] = []
            by_key[key].append(row)
    merged = []
    for key in order:
        rows = by_key[key]
        merged.append(dict(rows[0], oop=median_cell([r.get("oop") for r in rows]),
                           ip=median_cell([r.get("ip") for r in rows]), rounds=len(rows)))
    return merged
