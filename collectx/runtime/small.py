"""Small-message allreduce for the CPU runtime: every rank reduces the whole payload itself.

Why. The planner's one-host schedule (``direct``) cuts the payload into one shard per rank: each
rank reduces its shard, then copies every other shard from its owner, so each call waits on
peers twice (staged inputs ready, then peers' shards reduced). Below a few tens of KiB the
payload costs less than a wait: reading every rank's whole input once more is cheaper than the
second round of waits, and with one reduce per rank a call waits on peers only once, at the
start-of-tile barrier. Peers then read a rank's input and nobody reads its output, so the
output is written in the user's buffer in place.

>>> s = replicated_allreduce(3)
>>> s.algorithm, s.nchunks, [len(lane.instrs) for lanes in s.lanes for lane in lanes]
('replicated', 1, [1, 1, 1])
>>> from collectx.schedule import verify
>>> verify(s).depth           # proved correct (verify raises otherwise), one step deep
1
"""

from __future__ import annotations

from ..planner._build import Builder
from ..schedule.ir import Ref, Schedule

# An allreduce takes the replicated schedule when every size of its size class (the runtime caches
# plans per power of two, so all sizes of a class must decide alike) times the rank count is at
# most this: 2 ranks up to 128 KiB - 1, 4 ranks up to 64 KiB - 1, 8 ranks up to 32 KiB - 1.
REPLICATED_MAX_TOTAL = 256 << 10


def use_replicated(collective: str, nranks: int, nbytes: int) -> bool:
    """Whether an allreduce of ``nbytes`` on ``nranks`` ranks takes :func:`replicated_allreduce`.

    >>> use_replicated("allreduce", 2, 8), use_replicated("allreduce", 2, 1 << 20)
    (True, False)
    """
    largest_of_class = (1 << nbytes.bit_length()) - 1
    return (collective == "allreduce" and nranks > 1
            and largest_of_class * nranks <= REPLICATED_MAX_TOTAL)


def replicated_allreduce(nranks: int) -> Schedule:
    """Each rank reduces every rank's input (its own first) into its own output, in one step."""
    b = Builder("allreduce", nranks, 1)
    for r in range(nranks):
        srcs = [Ref((r + o) % nranks, "input", 0, 1) for o in range(nranks)]
        b.add(r, 0, "reduce", Ref(r, "output", 0, 1), srcs)
    return b.schedule("replicated", meta={"pattern": "one-step", "pull": True})
