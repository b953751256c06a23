"""How one CUDA call is cut: whether ranks use each other's buffers in place, tiles, channels.

* **Direct calls.** Ranks of one process address each other's device memory (one GPU, or peer
  access between GPUs), so a call needs no staging: every rank publishes where its user's input
  and output are, and the kernel reads and writes them in place on every rank (NCCL's P2P
  transport uses direct pointers the same way within a process). Only the scratch slot lives in
  the window, so a tile holds as many elements as the scratch allows -- the whole message when the
  schedule has no scratch, one launch per call.
* **Channels.** Each lane runs on several blocks, each over its own share of every tile with
  lane flags of its own (``native/cuda/interp.inc``, ``channel_of``), as NCCL's channels split a
  buffer. A block moves far less than an SM's share of HBM, so a lane needs many of them; but every
  block of every rank must be resident at once (they wait on each other), so the blocks of all
  ranks on a GPU stay within one per SM. Every rank computes the same count from the same inputs.

>>> from collectx.planner import make_schedule
>>> from collectx.runtime.executor import FlatPlan
>>> fp = FlatPlan(make_schedule(None, "allreduce", 2, 1 << 26), 0)
>>> tile_count(fp, 4 << 20, 4, 1 << 24, direct=True), tile_count(fp, 4 << 20, 4, 1 << 24)
(16777216, 524288)
>>> channels(1 << 26, lane_stride=1, blocks=66), channels(1 << 10, lane_stride=1, blocks=66)
(66, 1)
"""

from __future__ import annotations

from ...schedule.ir import Dep, Instr, Ref, Schedule
from ...schedule.push import drop_empty_lanes, push_copies, read_own_copies
from ..engine import PUSHED

CHANNEL_BYTES = 128 << 10   # the least a channel moves: below it, a block's waits cost more
                            # than the bytes it would take over from the others
MAX_FLAGS = 504             # lane flags in a window's control block (cx_cuda_exec.h)


def tile_count(flat, set_bytes: int, itemsize: int, count: int, direct: bool = False) -> int:
    """Elements per unit of one tile: a staged call's slots fit a staging set; a direct call
    stages nothing, so its scratch alone must fit, and with no scratch one tile is the call."""
    if not direct:
        return flat.tile_count(set_bytes, itemsize)
    scratch = flat.units[2]
    if scratch == 0:
        return max(64, count)
    return max(64, (set_bytes // (scratch * itemsize)) // 64 * 64)


def tiles(count: int, tile: int) -> int:
    """Tiles (epochs) a call of ``count`` elements per unit takes, ``tile`` per tile; a call of
    none takes one (cx_cuda_exec_ntiles, which the launch itself follows).

    >>> tiles(10, 4), tiles(0, 4)
    (3, 1)
    """
    return 1 if count == 0 else -(-count // tile)


def lane_stride(schedule: Schedule) -> int:
    """Lane flags per channel: the most lanes any rank has (the same on every rank)."""
    return max([len(lanes) for lanes in schedule.lanes] + [1])


def channels(nbytes: int, lane_stride: int, blocks: int, override: int | None = None) -> int:
    """Blocks per lane for a call moving ``nbytes`` per rank: one per CHANNEL_BYTES (or
    ``override``, COLLECTX_CUDA_CHANNELS), at most ``blocks`` (this rank's share of the GPU's
    SMs) over all its lanes and what the control block has flags for. The SM cap holds for the
    override too: blocks that wait on each other must all be resident at once, and 64 channels of
    3 thread ranks' broadcast on one H200 (far more blocks than SMs) waited until the timeout.

    >>> channels(1 << 30, lane_stride=3, blocks=44, override=64)
    14
    """
    most = max(1, MAX_FLAGS // max(1, lane_stride))
    wanted = max(1, nbytes // CHANNEL_BYTES) if override is None else override
    return max(1, min(wanted, blocks // max(1, lane_stride), most))


def blocks_per_rank(peers: list[dict]) -> int:
    """One block per SM, shared by the ranks on a GPU: the fewest any rank gets (``peers``: the
    window's rendezvous records, with each rank's GPU bus id and SM count)."""
    sharing: dict = {}
    for p in peers:
        sharing[p.get("bus")] = sharing.get(p.get("bus"), 0) + 1
    return max(1, min(int(p.get("sms", 1)) // sharing[p.get("bus")] for p in peers))


def in_process(peers: list[dict]) -> bool:
    """Whether every rank runs in one process (so each can use the others' pointers)."""
    return len({p["pid"] for p in peers}) == 1


def reads_precede_writes(schedule: Schedule, rank: int) -> bool:
    """Whether ``rank`` may run ``schedule`` in place with its input and output the same memory
    (``allreduce(x)``) in a direct call, where peers read the input where it lies: every write
    of an output chunk must come after every read of that chunk of the input -- later in the
    reader's lane (or the reading instruction itself, which reads each element before writing
    it), or waiting for it. A copy of the input chunk onto itself writes nothing new.

    >>> from collectx.planner import make_schedule
    >>> from collectx.schedule.push import push_copies
    >>> s = make_schedule(None, "allreduce", 4, 1 << 20)
    >>> reads_precede_writes(s, 0), reads_precede_writes(push_copies(s), 0)
    (True, True)
    """
    readers: dict[int, list[Dep]] = {}
    writers: list[tuple[Dep, Instr]] = []
    for d, ins in schedule.instructions():
        for ref in ins.srcs:
            if ref.rank == rank and ref.buf == "input":
                for j in range(ref.chunk, ref.chunk + ref.count):
                    readers.setdefault(j, []).append(d)
        dst = ins.dst
        onto_itself = ins.op == "copy" and ins.srcs == (Ref(rank, "input", dst.chunk, dst.count),)
        if dst.rank == rank and dst.buf == "output" and not onto_itself:
            writers.append((d, ins))
    return all(_after(w, ins, r) for w, ins in writers
               for j in range(ins.dst.chunk, ins.dst.chunk + ins.dst.count)
               for r in readers.get(j, ()))


def _after(w: Dep, ins: Instr, reader: Dep) -> bool:
    if (w.rank, w.lane) == (reader.rank, reader.lane) and w.index >= reader.index:
        return True
    return any((d.rank, d.lane) == (reader.rank, reader.lane) and d.index >= reader.index
               for d in ins.deps)


def for_direct_calls(schedule: Schedule) -> Schedule:
    """``schedule`` as ranks that write each other's outputs run it: a rank that reduced a
    chunk, or an allgather's owner of an input, writes it into every peer's output itself in the
    same pass (one read, every write), and the lanes this empties are dropped.

    >>> from collectx.planner import make_schedule
    >>> s = for_direct_calls(make_schedule(None, "allgather", 4, 1 << 20))
    >>> [len(lanes) for lanes in s.lanes], [ins.dst.rank for ins in s.lanes[1][0].instrs]
    ([1, 1, 1, 1], [1, 0, 2, 3])
    """
    if schedule.collective == "allgather":
        schedule = read_own_copies(schedule)
    elif schedule.collective not in PUSHED:
        return schedule
    return drop_empty_lanes(push_copies(schedule))
