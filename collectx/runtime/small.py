"""Small-message schedules for the CPU runtime: one step, so a call waits on its peers once.

Why. The planner's one-host schedules (``direct``) cut the payload into one shard per rank and
move it in two rounds: an allreduce reduces its shard, then copies every other shard from its
owner; a broadcast scatters the root's shards, then the ranks copy them from each other; a
reduce reduce-scatters, then the root gathers. Each round is a wait on peers. Below a few tens
of KiB the payload costs less than a wait, and with more ranks than CPUs a wait is a context
switch: reading the whole payload from its owners once is cheaper than the second round.

* allreduce (``replicated``): every rank reduces every rank's whole input (its own first) into
  its own output. Peers read a rank's input and nobody reads its output, so the output is
  written in the user's buffer in place.
* broadcast (``one_step``): every rank copies the root's whole input.
* reduce (``one_step``): the root reduces every rank's whole input at once.

>>> s = replicated_allreduce(3)
>>> s.algorithm, s.nchunks, [len(lane.instrs) for lanes in s.lanes for lane in lanes]
('replicated', 1, [1, 1, 1])
>>> from collectx.schedule import verify
>>> verify(s).depth           # proved correct (verify raises otherwise), one step deep
1
>>> [verify(small_schedule(c, 4, root=2)).depth for c in ("broadcast", "reduce")]
[1, 1]
"""

from __future__ import annotations

from ..planner._build import Builder
from ..schedule.ir import Ref, Schedule

# A collective takes its one-step schedule when every size of its size class (the runtime caches
# plans per power of two, so all sizes of a class must decide alike) times the rank count is at
# most this: 2 ranks up to 128 KiB - 1, 4 ranks up to 64 KiB - 1, 8 ranks up to 32 KiB - 1.
REPLICATED_MAX_TOTAL = 256 << 10
_ONE_STEP = ("allreduce", "broadcast", "reduce")


def use_replicated(collective: str, nranks: int, nbytes: int) -> bool:
    """Whether ``collective`` of ``nbytes`` on ``nranks`` ranks takes :func:`small_schedule`.

    >>> use_replicated("allreduce", 2, 8), use_replicated("allreduce", 2, 1 << 20)
    (True, False)
    >>> use_replicated("broadcast", 4, 8), use_replicated("allgather", 4, 8)
    (True, False)
    """
    largest_of_class = (1 << nbytes.bit_length()) - 1
    return (collective in _ONE_STEP and nranks > 1
            and largest_of_class * nranks <= REPLICATED_MAX_TOTAL)


def small_schedule(collective: str, nranks: int, root: int = 0) -> Schedule:
    """The one-step schedule of ``collective`` (one of those :func:`use_replicated` takes)."""
    if collective == "allreduce":
        return replicated_allreduce(nranks)
    b = Builder(collective, nranks, 1, root=root)
    if collective == "broadcast":
        for r in range(nranks):
            b.add(r, 0, "copy", Ref(r, "output", 0, 1), [Ref(root, "input", 0, 1)])
    elif collective == "reduce":
        srcs = [Ref((root + o) % nranks, "input", 0, 1) for o in range(nranks)]
        b.add(root, 0, "reduce", Ref(root, "output", 0, 1), srcs)
    else:
        raise ValueError(f"small_schedule({collective!r}): expected one of {', '.join(_ONE_STEP)}")
    return b.schedule("one_step", meta={"pattern": "one-step", "pull": True})


def replicated_allreduce(nranks: int) -> Schedule:
    """Each rank reduces every rank's input (its own first) into its own output, in one step."""
    b = Builder("allreduce", nranks, 1)
    for r in range(nranks):
        srcs = [Ref((r + o) % nranks, "input", 0, 1) for o in range(nranks)]
        b.add(r, 0, "reduce", Ref(r, "output", 0, 1), srcs)
    return b.schedule("replicated", meta={"pattern": "one-step", "pull": True})
