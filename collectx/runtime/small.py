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

from ..errors import PlanError
from ..schedule.builder import LaneBuilder
from ..schedule.ir import Ref, Schedule

# A collective takes its one-step schedule when every size of its size class (the runtime caches
# plans per power of two, so all sizes of a class must decide alike) times the rank count is at
# most this: 2 ranks up to 128 KiB - 1, 4 ranks up to 64 KiB - 1, 8 ranks up to 32 KiB - 1.
REPLICATED_MAX_TOTAL = 256 << 10
# With more ranks than CPUs every step is a round of context switches, and in a broadcast or
# reduce the ranks with little to do race into the next call and take the CPU from those with
# work: 4 ranks on 2 cores, one step against two, broadcast 64 KiB 26-32 us against 46-49,
# 256 KiB 78-84 against 107-110; reduce 64 KiB 25-27 against 76-79, 256 KiB 72-86 against
# 110-117, 1 MiB 345-407 against 421-439. (The replicated allreduce does not gain there: every
# rank reduces everything, 36-39 us against 27-29 at 64 KiB.) Not oversubscribed, a reduce in
# one step loses from 1 MiB (2 ranks: 152 us against 124-127), so this applies to crowded
# machines only: 4 ranks up to 1 MiB - 1.
ROOTED_MAX_TOTAL_CROWDED = 4 << 20
_ONE_STEP = ("allreduce", "broadcast", "reduce")


def use_one_step(collective: str, nranks: int, nbytes: int, crowded: bool = False) -> bool:
    """Whether ``collective`` of ``nbytes`` on ``nranks`` ranks takes :func:`small_schedule`;
    ``crowded``: the ranks on this machine outnumber its CPUs.

    >>> use_one_step("allreduce", 2, 8), use_one_step("allreduce", 2, 1 << 20)
    (True, False)
    >>> use_one_step("broadcast", 4, 8), use_one_step("allgather", 4, 8)
    (True, False)
    >>> use_one_step("reduce", 4, 1 << 19), use_one_step("reduce", 4, 1 << 19, crowded=True)
    (False, True)
    """
    largest_of_class = (1 << nbytes.bit_length()) - 1
    limit = REPLICATED_MAX_TOTAL
    if crowded and collective in ("broadcast", "reduce"):
        limit = ROOTED_MAX_TOTAL_CROWDED
    return collective in _ONE_STEP and nranks > 1 and largest_of_class * nranks <= limit


def small_schedule(collective: str, nranks: int, root: int = 0) -> Schedule:
    """The one-step schedule of ``collective`` (one of those :func:`use_one_step` takes)."""
    if collective == "allreduce":
        return replicated_allreduce(nranks)
    b = LaneBuilder(collective, nranks, 1, root=root)
    if collective == "broadcast":
        for r in range(nranks):
            b.add(r, 0, "copy", Ref(r, "output", 0, 1), [Ref(root, "input", 0, 1)])
    elif collective == "reduce":
        srcs = [Ref((root + o) % nranks, "input", 0, 1) for o in range(nranks)]
        b.add(root, 0, "reduce", Ref(root, "output", 0, 1), srcs)
    else:
        raise PlanError(f"small_schedule({collective!r}): expected one of {', '.join(_ONE_STEP)}")
    return b.schedule("one_step", meta={"pattern": "one-step", "pull": True})


def replicated_allreduce(nranks: int) -> Schedule:
    """Each rank reduces every rank's input (its own first) into its own output, in one step."""
    b = LaneBuilder("allreduce", nranks, 1)
    for r in range(nranks):
        srcs = [Ref((r + o) % nranks, "input", 0, 1) for o in range(nranks)]
        b.add(r, 0, "reduce", Ref(r, "output", 0, 1), srcs)
    return b.schedule("replicated", meta={"pattern": "one-step", "pull": True})
