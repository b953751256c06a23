"""The cost model's constants: per-step latency (alpha) by link class and algorithm.

Where they come from. NCCL's tuning model (src/graph/tuning.cc, ``hwLatencies`` for the Simple
protocol, which is what a copy/reduce-per-instruction executor resembles) charges per step:
NVLink ring 3.4 us, tree 4.0 us; PCIe ring 5.7 us, tree 4.0 us; network 14 us; plus a base
latency of 8.4 us per collective launch. xGMI is taken equal to NVLink (point-to-point links of
the same class); CPU shared memory (``shm``) and socket links (``smp``) cost a flag handoff
through the cache hierarchy, about 1 us per dependent step with spinning waiters. ``direct``
and the packed-tree algorithms (``blink``, ``forest``) read peers with one-sided copies, so a
step costs what a ring step costs on the same link. These are planning estimates, not
measurements: they only have to rank candidates the way real machines do."""

from __future__ import annotations

import math

# Per dependent step, microseconds: LAT_US[link class][algorithm]; "default" covers
# algorithms that are not listed.
LAT_US: dict[str, dict[str, float]] = {
    **{t: {"default": 3.4, "ring": 3.4, "tree": 4.0} for t in ("nvlink", "xgmi", "c2c")},
    "pcie": {"default": 5.7, "ring": 5.7, "tree": 4.0},
    "smp": {"default": 5.7, "ring": 5.7, "tree": 4.0},
    "net": {"default": 14.0, "ring": 14.0, "tree": 14.0},
    "shm": {"default": 1.0, "ring": 1.0, "tree": 1.0},
}

# Once per collective (kernel launch / executor entry), microseconds. Same for every algorithm,
# so it never changes a choice, but it keeps predicted small-message times honest.
BASE_US: dict[str, float] = {"gpu": 8.4, "cpu": 2.0}

# Order of link classes from best to worst; a path's class is its worst link (NCCL's rule).
LINK_ORDER = ("shm", "nvlink", "xgmi", "c2c", "smp", "pcie", "net")

# Pipelined chunks are no smaller than this: below it a chunk's fixed costs (a flag handoff,
# the route's latency: microseconds) outweigh what finer pipelining saves (a 64 KiB chunk
# takes ~3 us on a 25 GB/s NVLink).
MIN_CHUNK_BYTES = 64 << 10
# Instructions per schedule at most: lowering and simulating cost ~10 us each, and a plan of
# 8 GPUs must be made in about a second.
INSTRUCTIONS = 60_000
# Packed trees lose at least their pipeline fill to the bound: two levels or more, at the most
# chunks a schedule holds, about a fiftieth of the run. A plan this close to the bound wins.
FILL = 0.02
# Simulated times of one packing at nearby chunk counts wobble by a few tenths of a percent
# (pieces lining up on links, then not): a difference this small is noise, not a faster plan.
NOISE = 0.005
# Pieces a pipeline cuts one stream into, at most: ``p`` pieces fill a pipeline in ``1/p`` of
# its run, so past a few hundred the fill is below the simulator's own noise and more pieces
# only add steps.
MAX_PIECES = 512


def pipeline_pieces(share: float, hops: int, bw_gbps: float = 0.0, wait_us: float = 0.0) -> int:
    """Pieces that carry ``share`` bytes down a pipeline of ``hops`` hops fastest.

    The pieces take ``(p + hops - 1)`` piece times to drain, and each waits out the route
    latency ``L`` once per hop, ``p L`` in all: with ``T`` the share's time at the pipeline's
    bandwidth, ``T (hops - 1) / p + p L`` is least at ``p = sqrt((hops - 1) T / L)`` (one hop
    has nothing to overlap: one piece). Pieces stay at least :data:`MIN_CHUNK_BYTES` and at
    most :data:`MAX_PIECES`; without a bandwidth or latency (no topology to read them from)
    they are as many as those allow.

    >>> pipeline_pieces(1 << 30, 7), pipeline_pieces(1 << 30, 7, bw_gbps=25.0, wait_us=5.0)
    (512, 227)
    >>> pipeline_pieces(100 << 10, 7, 25.0, 5.0), pipeline_pieces(1 << 30, 1, 25.0, 5.0)
    (1, 1)
    """
    most = max(1, min(MAX_PIECES, int(share // MIN_CHUNK_BYTES)))
    if bw_gbps <= 0 or wait_us <= 0:
        return most
    best = math.sqrt(max(hops - 1, 0) * share / (bw_gbps * 1e3) / wait_us)
    return max(1, min(most, int(round(best))))


def route_terms(topo, ranks, pairs) -> tuple[float, float]:
    """``(bandwidth GB/s, latency us)`` of the narrowest and slowest of the rank ``pairs``
    ``(a, b)`` as the simulator routes them (a striped pair sums its routes), or ``(0, 0)``."""
    if topo is None or not ranks or not pairs:
        return 0.0, 0.0
    from ..topology.routes import routes_for
    table = routes_for(topo)
    named = [(ranks[a], ranks[b]) for a, b in pairs]
    return min(table.bandwidth(*p) for p in named), max(table.wait_us(*p) for p in named)


def alpha_us(link: str, algorithm: str) -> float:
    """Per-step latency of ``algorithm`` over a ``link`` class.

    >>> alpha_us("nvlink", "ring"), alpha_us("pcie", "blink")
    (3.4, 5.7)
    """
    row = LAT_US.get(link, LAT_US["pcie"])
    return row.get(algorithm, row["default"])
