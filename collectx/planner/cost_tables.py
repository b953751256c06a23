"""The cost model's constants: per-step latency (alpha) by link class and algorithm.

Where they come from. NCCL's tuning model (src/graph/tuning.cc, ``hwLatencies`` for the Simple
protocol, which is what a copy/reduce-per-instruction executor resembles) charges per step:
NVLink ring 3.4 us, tree 4.0 us; PCIe ring 5.7 us, tree 4.0 us; network 14 us; plus a base
latency of 8.4 us per collective launch. xGMI is taken equal to NVLink (point-to-point links of
the same class); CPU shared memory (``shm``) and socket links (``smp``) cost a flag handoff
through the cache hierarchy, about 1 us per dependent step with spinning waiters. ``direct``
and the packed-tree algorithms (``blink``, ``forest``) read peers with one-sided copies, so a
step costs what a ring step costs on the same link. These are planning estimates, not
measurements: they only have to rank candidates the way real machines do.
"""

from __future__ import annotations

# Per dependent step, microseconds: LAT_US[link class][algorithm]; "default" covers
# algorithms that are not listed.
LAT_US: dict[str, dict[str, float]] = {
    "nvlink": {"default": 3.4, "ring": 3.4, "tree": 4.0},
    "xgmi": {"default": 3.4, "ring": 3.4, "tree": 4.0},
    "pcie": {"default": 5.7, "ring": 5.7, "tree": 4.0},
    "smp": {"default": 5.7, "ring": 5.7, "tree": 4.0},
    "net": {"default": 14.0, "ring": 14.0, "tree": 14.0},
    "shm": {"default": 1.0, "ring": 1.0, "tree": 1.0},
}

# Once per collective (kernel launch / executor entry), microseconds. Same for every algorithm,
# so it never changes a choice, but it keeps predicted small-message times honest.
BASE_US: dict[str, float] = {"gpu": 8.4, "cpu": 2.0}

# Order of link classes from best to worst; a path's class is its worst link (NCCL's rule).
LINK_ORDER = ("shm", "nvlink", "xgmi", "smp", "pcie", "net")

# Pipelined chunks are no smaller than this: below it a chunk's fixed costs (a flag handoff,
# the route's latency: microseconds) outweigh what finer pipelining saves (a 64 KiB chunk
# takes ~3 us on a 25 GB/s NVLink).
MIN_CHUNK_BYTES = 64 << 10
# Instructions per schedule at most: lowering and simulating cost ~10 us each, and a plan of
# 8 GPUs must be made in about a second.
INSTRUCTIONS = 60_000


def alpha_us(link: str, algorithm: str) -> float:
    """Per-step latency of ``algorithm`` over a ``link`` class.

    >>> alpha_us("nvlink", "ring"), alpha_us("pcie", "blink")
    (3.4, 5.7)
    """
    row = LAT_US.get(link, LAT_US["pcie"])
    return row.get(algorithm, row["default"])
