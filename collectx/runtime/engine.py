"""The call path under the Communicator: plan cache, call descriptor, one native call, statuses.

Per call: look up (or plan once) the :class:`~collectx.runtime.executor.FlatPlan` of this
(collective, dtype, size class, root); write the call descriptor into this rank's control block;
run ``cx_exec_run`` (GIL released); advance the sequence number and epoch; map a failure status
to the collectx exception. Failures that leave ranks out of step (timeout, dead peer) poison the
communicator and raise this rank's abort word so peers stop waiting promptly; mismatches and
aborted calls are detected by every rank at the same point and leave the communicator usable.
"""

from __future__ import annotations

import functools
import json
import logging
import threading

import numpy as np

from ..errors import (CollectiveMismatch, CommError, Interrupted, NativeError, PeerAborted,
                      PeerFailure, Timeout)
from ..log import TRACE, logger, tracing
from ..schedule.ir import Lane, Schedule
from ..schedule.push import push_copies, share_copies
from ._lib import native
from .arrays import DTYPE_CODES, OP_CODES
from .executor import FlatPlan
from .peer_use import DISJOINT, SAME, unit_of
from .plan_share import SharedPlans
from .small import small_schedule, use_one_step
from .window import (ABORT_CLOSED, ABORT_FATAL, ABORTED_CALL, DESC_WORDS, W_ABORT, W_DESC,
                     W_READY, Window, _alive, oversubscribed)

COLL_CODES = {"allreduce": 1, "reduce_scatter": 2, "allgather": 3, "broadcast": 4, "reduce": 5,
              "alltoall": 6, "barrier": 7}
_COLL_NAMES = {v: k for k, v in COLL_CODES.items()} | {ABORTED_CALL: "<aborted>"}
_DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
_ITEMSIZE = {c: 2 if n == "bfloat16" else np.dtype(n).itemsize for n, c in DTYPE_CODES.items()}
_OP_NAMES = {v: k for k, v in OP_CODES.items()}
_AVG = OP_CODES["avg"]
# cx_exec_status (collectx.h), the one status table of both executors' failure records.
EXEC_STATUS = {"OK": 0, "TIMEOUT": 1, "PEER_DEAD": 2, "ABORTED": 3, "MISMATCH": 4, "BADARG": 5,
               "KERNEL": 6, "CMA": 7, "INTERRUPTED": 8}
# Per-unit message size from which peers use user buffers across processes (cma_in/cma_out)
# rather than staged copies in the window (see cma_min_bytes). A remote source of a reduce goes
# through a bounce buffer, piece by piece, and numpy arrays below 4 MiB sit on 4 KiB pages that
# each read pins one by one: an allreduce that only read across processes, its results pulled
# rather than pushed, ran 0.87-0.92x the staged path at 2 MiB on 2 ranks and 0.82-0.87x at 2-3
# MiB on 4 (1.52-1.56x and 1.20-1.21x at 4 MiB). Pushing the results is what pays below that.
# Allreduce, reduce_scatter and reduce push their results (collectx/schedule/push.py): the rank
# that reduced a chunk writes it into its peers' outputs (a reduce: into the root's) straight
# from its cache, where they had read it from a core that had just written it. The thresholds
# are where allreduce and reduce stop losing to the staged path when every rank rewrites its
# input before each call (compare_cpu --touch, as a training step writes its gradients); below
# them the system calls and page pins cost more than they save, although on a buffer reused
# unchanged (nccl-tests' way) they win from 128 KiB. Against the staged path, two runs each,
# 2 ranks, rewritten / reused:
#   allreduce  128 KiB 0.66-0.74x / 1.55-1.61x, 256 KiB 1.01-1.07x / 1.82-1.86x, 1 MiB
#              1.06-1.08x / 1.95-2.03x, 4 MiB 1.72-1.95x / 2.24-2.30x;
#   reduce     128 KiB 0.74-0.77x / 1.59x, 256 KiB 1.01-1.14x / 1.64-1.82x, 1 MiB 1.07-1.15x /
#              2.07-2.08x, 4 MiB 1.69-2.42x / 2.05-2.41x, 16 MiB 2.12-2.19x / 2.31-2.33x (each
#              rank reduces its shard straight into the root's output);
#   reduce_scatter out of place (its direct schedule has nothing to push) 0.70-0.74x at 256
#              KiB-1 MiB, 0.85-0.93x at 2 MiB, 0.98-1.03x at 4 MiB / 1.18-1.43x at 256 KiB-2
#              MiB; in place (the output a slice of the input) 0.94-1.01x at 256 KiB, 1.13-1.17x
#              at 1 MiB, 2.46-2.64x at 4 MiB / 1.86-2.89x. Ranks choose their layouts
#              independently and the choice must be the same on all: one threshold serves
#              both, and a rewritten out-of-place reduce_scatter loses below 4 MiB.
# With 4 ranks on 2 CPUs, from 1 MiB: allreduce 0.96-1.02x / 1.13-1.36x at 1 MiB, 1.15-1.18x /
# 1.33-1.39x at 2 MiB; a reduce loses a little at 1 MiB (0.91-0.95x / 1.42-1.67x) and breaks
# even at 2 MiB (1.04x / 1.26-1.29x), so it waits for 2 MiB there.
CMA_PUSH_MIN_BYTES = 256 << 10
CMA_PUSH_MIN_BYTES_OVERSUBSCRIBED = 1 << 20
CMA_REDUCE_MIN_BYTES_OVERSUBSCRIBED = 2 << 20
PUSHED = frozenset(("allreduce", "reduce_scatter", "reduce"))
# For collectives that only copy (allgather, broadcast, alltoall) a read across processes lands
# straight in the reader's output: one copy instead of the owner's staging copy and the reader's
# copy out. On 2 ranks it won from 16 KiB (allgather 4.3 -> 3.3 us at 16 KiB, 42.6 -> 16.5 us at
# 256 KiB; broadcast 24.3 -> 16.0 us at 256 KiB) and lost at 4 KiB (1.8 -> 2.1 us). When ranks
# outnumber CPUs the wait at the end of such a call (no caller may reuse a buffer a peer still
# reads) costs context switches: 4 ranks on 2 CPUs lost up to 64 KiB (allgather 16 KiB 16-25 ->
# 36-41 us), broke even at 256 KiB and won at 1 MiB (880-930 -> 810-850 us). Powers of two, so
# all sizes of a size class (plans are cached per class) decide alike.
CMA_COPY_MIN_BYTES = 16 << 10
CMA_COPY_MIN_BYTES_OVERSUBSCRIBED = 256 << 10
_COPY_ONLY = frozenset(("allgather", "broadcast", "alltoall"))
# A broadcast's root moves nothing while its peers pull: with a core per rank and the buffers
# used across processes, it takes a share of the copies (push.share_copies). 2 ranks, against
# pulling everything, two runs, the buffer reused unread / read by the receiver after each call /
# rewritten by the receiver before each call: 1 MiB 2.8-2.9x / 0.99-1.02x / 0.82-0.89x, 2 MiB
# 3.5-3.6x / 1.08-1.11x / 1.03-1.07x, 4 MiB 2.16-2.20x / 1.43-1.54x / 1.12-1.23x, 16 MiB
# 1.09-2.00x / 1.43-1.48x / 1.40-1.44x, 64 MiB 2.32-2.48x / 1.24-1.36x / 1.37-1.57x.
SHARED_BROADCAST_MIN_BYTES = 2 << 20
_NO_DATA = 1 << 62


def trace_call(engine, coll: str, count: int, dtype: int, op: int, root: int) -> None:
    """The TRACE line of one call of ``engine`` (a CPU or CUDA engine), before it runs."""
    logger.log(TRACE, "rank %d/%d: %s count=%d dtype=%s op=%s root=%d seq=%d", engine.rank,
               engine.size, coll, count, _DTYPE_NAMES.get(dtype, dtype), _OP_NAMES.get(op, op),
               root, engine._seq)


class _RankZeroAborted(Exception):
    """Rank 0 rejected the call whose plan this rank waits for: it will not publish it."""


class RankZeroElsewhere(Exception):
    """Rank 0 runs another call in this one's place: it will not publish this one's plan
    (raised by both engines' watches, caught by their calls)."""


def barrier_schedule(nranks: int) -> Schedule:
    """No transfers: a call of it is only its descriptor check and the ready barrier (both
    executors' barrier, and the descriptor a rank without a plan posts).

    >>> barrier_schedule(2).lanes
    ((Lane(instrs=()),), (Lane(instrs=()),))
    """
    return Schedule("allreduce", nranks, 1, tuple((Lane(()),) for _ in range(nranks)),
                    algorithm="none")


def posted_call(ready: int, desc, seq: int, epoch: int) -> tuple[str, int, int] | None:
    """``(collective, bytes, root)`` of the call a rank posted as call ``seq``, read from its
    ready word and the six compared words of that call's descriptor slot; None while its
    descriptor is incomplete (ready has not reached ``epoch``, the call's first) or names
    another call, or an aborted one.

    >>> posted_call(5, [3, COLL_CODES["allgather"], DTYPE_CODES["float32"], 0, 10, 0], 3, 5)
    ('allgather', 40, 0)
    >>> posted_call(4, [3, COLL_CODES["allgather"], DTYPE_CODES["float32"], 0, 10, 0], 3, 5)
    """
    if int(ready) < epoch:
        return None
    posted, coll, dtype, _, count, root = (int(v) for v in desc[:6])
    if posted != seq or coll not in _COLL_NAMES or coll == ABORTED_CALL:
        return None
    return _COLL_NAMES[coll], count * _ITEMSIZE.get(dtype, 0), root


class Engine:
    """Runs collectives for one rank of a communicator over its :class:`Window`.

    ``store`` and ``key_prefix`` are the communicator's: rank 0 publishes the planner's
    schedules there for the other ranks (:mod:`.plan_share`); without a store every rank plans.
    """

    def __init__(self, window: Window, config, topology, timeout: float, *, store=None,
                 key_prefix: str = ""):
        self.win, self.rank, self.size = window, window.rank, window.size
        self.config, self.timeout = config, timeout
        self._topology = topology
        self._ctl = window.ctl[self.rank]
        self._plans: dict[tuple, tuple[FlatPlan, int]] = {}
        self._shared = SharedPlans("cpu", self.rank, self.size, store, key_prefix, timeout,
                                   config.cache_dir, config.algo)
        self._poisoned: str | None = None
        module = _fast_module()  # its Lock can be taken by the compiled fast calls directly
        self._lock = module.Lock() if module is not None else threading.Lock()
        ffi, self._lib = native()
        # [seq, epoch] in native memory: the compiled fast calls advance them too
        self._state = ffi.new("unsigned long long[2]", [0, 1])
        self._calls: dict[tuple, tuple] = {}
        self._fast_calls: dict[tuple, object] = {}
        self._abort_struct = None
        self._wnative = window.native
        self._res = ffi.new("cx_exec_result*")
        self._ffi = ffi
        self._null = ffi.NULL
        self._crowded = oversubscribed(window.machine_ranks)

    @property
    def _seq(self) -> int:
        return self._state[0]

    @_seq.setter
    def _seq(self, value: int) -> None:
        self._state[0] = value

    @property
    def _epoch(self) -> int:
        return self._state[1]

    @_epoch.setter
    def _epoch(self, value: int) -> None:
        self._state[1] = value

    # -- planning -------------------------------------------------------------------------------
    def _flat(self, coll: str, dtype: int, itemsize: int, count: int, root: int):
        nbytes = count * itemsize
        key = (coll, dtype, nbytes.bit_length(), root)
        hit = self._plans.get(key)
        if hit is None:
            schedule = self._schedule(coll, nbytes, root)
            fp = FlatPlan(schedule, self.rank)
            # With nothing staged, a tile only bounds the scratch slots: cache-sized tiles, which
            # keep staged copies in the caches, would only add barriers (and cost more than that:
            # 16 MiB 2-rank allreduce 2.3 ms with 2 MiB tiles, 1.4 ms in one tile). The choice
            # must be the same on every rank, so it is made on the schedule, not on this call.
            whole = self._cma(coll, nbytes) and fp.peer_use.everywhere()
            tile_bytes = None if whole else self.config.tile_bytes
            hit = self._plans[key] = (fp, fp.tile_count(self.win.set_bytes, itemsize, tile_bytes))
            if self.rank == 0 and logger.isEnabledFor(logging.INFO):
                self._log_plan(coll, nbytes, root, schedule, hit[1])
        return hit

    def _log_plan(self, coll: str, nbytes: int, root: int, schedule: Schedule,
                  tile_count: int) -> None:
        low = 1 << (nbytes.bit_length() - 1) if nbytes else 0
        route = ("peers' buffers across processes" if self._cma(coll, nbytes)
                 else "staged in the window")
        planned = self._shared.known(coll, nbytes, root)
        origin = "built without the planner" if planned is None else planned.describe()
        logger.info("rank 0/%d: %s of %d-%d bytes per rank: %s schedule (%s), %d chunks, "
                    "%d lanes, tiles of up to %d elements, %s; %s", self.size, coll, low,
                    max(2 * low - 1, 0), schedule.algorithm,
                    schedule.meta_dict().get("pattern", "-"), schedule.nchunks,
                    max(len(lanes) for lanes in schedule.lanes), tile_count, route, origin)

    def _cma(self, coll: str, nbytes: int) -> bool:
        """Whether ``coll`` with ``nbytes`` per unit lets peers read user buffers across
        processes."""
        return self.win.cma and nbytes >= cma_min_bytes(coll, self._crowded)

    def _schedule(self, coll: str, nbytes: int, root: int) -> Schedule:
        if coll == "barrier":
            return barrier_schedule(self.size)
        if self.config.algo is None and use_one_step(coll, self.size, nbytes, self._crowded):
            s = small_schedule(coll, self.size, root)  # one wait per call (runtime/small.py)
        else:
            s = self._planned(coll, nbytes, root).schedule
            # Rewritten here, after the sharing: only the planner's output is shared and cached
            if coll in PUSHED and self._cma(coll, nbytes):
                s = push_copies(s)  # peers' outputs are written across processes, from cache
            elif (coll == "broadcast" and not self._crowded and self._cma(coll, nbytes)
                  and nbytes >= SHARED_BROADCAST_MIN_BYTES):
                s = share_copies(s)
        if self.config.plan_dump_file and self.rank == 0:
            with open(self.config.plan_dump_file, "a") as f:
                f.write(json.dumps({"nbytes": nbytes, "schedule": s.to_dict()}) + "\n")
        return s

    def _planned(self, coll: str, nbytes: int, root: int):
        """The planner's schedule: made on rank 0 (or read from the disk cache), read from
        the store by the other ranks, once per communicator and size class."""
        def plan(topo):
            from ..planner import make_schedule
            return make_schedule(topo, coll, self.size, nbytes, algo=self.config.algo,
                                 root=root)
        return self._shared.get(coll, nbytes, root, self.topology, plan,
                                lambda: self._watch_rank_zero(coll, nbytes, root))

    def _watch_rank_zero(self, coll: str, nbytes: int, root: int) -> None:
        """Raises while this rank waits for a plan that rank 0 will not publish: it rejected
        this call (_RankZeroAborted), makes another one (RankZeroElsewhere), failed or closed
        the communicator, or died."""
        word = int(self.win.ctl[0][W_ABORT])
        if word == self._seq + 1:
            raise _RankZeroAborted()
        if word & (ABORT_FATAL | ABORT_CLOSED):
            raise self._failure(coll, self._seq, EXEC_STATUS["ABORTED"], 0, -1, -1)
        if not _alive(self.win.pids[0]):
            raise self._failure(coll, self._seq, EXEC_STATUS["PEER_DEAD"], 0, -1, -1)
        theirs = self._rank_zero_call()
        if theirs is not None and theirs != (coll, nbytes, root):
            raise RankZeroElsewhere()

    def _rank_zero_call(self) -> tuple[str, int, int] | None:
        """(collective, bytes, root) of the call rank 0 makes in this one's place, once its
        descriptor is complete (:func:`posted_call`). Rank 0 publishes a call's plan before it
        posts the descriptor."""
        ctl = self.win.ctl[0]
        base = W_DESC + DESC_WORDS * (self._seq & 1)
        return posted_call(ctl[W_READY], ctl[base:base + 6], self._seq, self._epoch)

    def topology(self):
        if self._topology is None:
            from .. import topology as T
            self._topology = (T.load(self.config.topo_file) if self.config.topo_file
                              else T.host(self.size))
        return self._topology

    # -- running --------------------------------------------------------------------------------
    def run(self, coll: str, src, dst, count: int, dtype: int, itemsize: int, op: int = 0,
            root: int = 0, in_overlaps_out: int = 0, in_heap: int = -1,
            out_heap: int = -1) -> None:
        """One collective; ``src``/``dst`` are numpy arrays or None (nothing to stage / copy out).

        ``in_overlaps_out``: how ``src`` and ``dst`` share memory, coded as in
        :mod:`.peer_use` (0 disjoint, 1 the same memory; see :meth:`FlatPlan.direct_masks`).

        ``in_heap``/``out_heap``: byte offsets of ``src``/``dst`` in this rank's window heap
        (arrays from Communicator.empty), which the executor then uses in place (an input that
        shares memory with the output only as :func:`input_heap` allows); -1 otherwise.
        """
        if tracing():
            trace_call(self, coll, count, dtype, op, root)
        with self._lock:
            if self._poisoned:
                self._check_usable()
            key = (coll, dtype, count, op, root, in_overlaps_out)
            prepared = self._calls.get(key)
            if prepared is None:
                try:
                    prepared = self._prepare(coll, dtype, itemsize, count, op, root,
                                             in_overlaps_out)
                except _RankZeroAborted:
                    # Join rank 0's aborted call, as a peer that had the plan would have, so
                    # the ranks stay in step and the communicator usable.
                    seq = self._seq
                    self._abort_locked()
                    raise self._failure(coll, seq, EXEC_STATUS["ABORTED"], 0, -1, -1) from None
                except RankZeroElsewhere:
                    # Post this call's descriptor against rank 0's: every rank then finds
                    # the mismatch, as if this rank had had a plan.
                    seq = self._seq
                    res = self._mismatch_locked(coll, dtype, count, op, root)
                    raise self._failure(coll, seq, res.status or EXEC_STATUS["MISMATCH"], res.rank,
                                        res.lane, res.index) from None
            fp, c, _ = prepared
            keep_in = c.user_in = self._null if src is None else self._ffi.from_buffer(src)
            keep_out = c.user_out = (keep_in if dst is src else
                                     self._null if dst is None else self._ffi.from_buffer(dst))
            seq = c.seq = self._seq
            c.epoch = self._epoch
            c.in_heap = input_heap(in_overlaps_out, in_heap, out_heap, c.cma_in)
            c.out_heap = out_heap
            res = self._res
            self._lib.cx_exec_run(fp.native, self._wnative, c, res)
            del keep_in, keep_out          # the user's buffers were pinned until here
            self._seq += 1
            self._epoch += res.epochs_used
            if res.status:
                raise self._failure(coll, seq, res.status, res.rank, res.lane, res.index)

    def _prepare(self, coll, dtype, itemsize, count, op, root, in_overlaps_out):
        """The plan and a pre-filled call struct for one call signature (cached)."""
        fp, tile = self._flat(coll, dtype, itemsize, count, root)
        c = self._ffi.new("cx_exec_call*")
        c.dtype, c.op, c.count, c.tile_count = dtype, op, count, tile
        c.coll, c.root = COLL_CODES[coll], root
        c.in_private = int(fp.in_private and not in_overlaps_out)
        c.out_private = int(fp.out_private)
        masks = fp.direct_masks(int(in_overlaps_out))
        if self._cma(coll, count * itemsize):
            c.cma_in, c.cma_out = fp.cma_buffers(int(in_overlaps_out))
        keep = []  # the mask arrays live as long as the cached call struct
        if masks is not None:
            keep = [self._ffi.new("unsigned char[]", m or b"\0") for m in masks]
            c.in_direct, c.out_direct = keep
        through = fp.through_mask(int(in_overlaps_out))
        if through is not None and not (c.cma_in or c.cma_out):
            keep.append(self._ffi.new("unsigned char[]", through))
            c.out_through = keep[-1]
        c.scale = 1.0 / self.size if op == _AVG else 1.0
        c.deadline_ns, c.timeout_ns = 0, int(self.timeout * 1e9)
        if len(self._calls) > 512:  # many distinct sizes: start over rather than grow forever
            self._calls.clear()
        prepared = self._calls[(coll, dtype, count, op, root, in_overlaps_out)] = (fp, c, keep)
        return prepared

    def fast_call(self, coll: str, arr, dtype: int, op_name: str | None, op: int,
                  alias: int = DISJOINT, layout: str = "disjoint", root: int = 0):
        """The compiled fast call (collectx._fastpath.FastCall) of ``coll`` with an input like
        ``arr`` (same dtype object, element count), ``op`` and ``root``, for one layout of the
        user's buffers, or None without the compiled module.

        ``alias`` is how the checked path coded the call's input and output (:mod:`.peer_use`),
        ``layout`` the FastCall's name for it: "same", "disjoint", "in_at" / "out_at" (the
        unit-offset codes), "in_only" (no output: a reduce's non-roots), "out_only" (no input:
        a broadcast's receivers). ``op_name`` is None for allgather, alltoall and broadcast.
        Call it once the checked path has run the same call: it reuses the prepared call struct.
        Cached per signature; none when the engine is poisoned or TRACE logs every call."""
        key = (coll, arr.dtype, arr.size, op_name, alias, layout, root)
        fast = self._fast_calls.get(key)
        if fast is not None or self._poisoned or tracing():  # TRACE logs every call in Python
            return fast
        module = _fast_module()
        if module is None or (coll in ("reduce_scatter", "alltoall") and arr.size % self.size):
            return None
        count, out_count = self._fast_counts(coll, arr.size)
        prepared = self._calls.get((coll, dtype, count, op, root, alias))
        if prepared is None:
            return None
        fp, c, _ = prepared
        unit = unit_of(alias)
        addr = lambda p: int(self._ffi.cast("uintptr_t", p))  # noqa: E731
        heap = self.win.heap_address    # the FastCall uses arrays in the heap in place
        fast = module.FastCall(addr(self._lib.cx_exec_run), addr(fp.native), addr(self._wnative),
                               addr(c), addr(self._res), addr(self._state), heap,
                               heap + self.win.heap_bytes, arr.dtype, arr.size,
                               out_count if layout in _WITH_OUT else None, op_name, self._lock,
                               functools.partial(self._fast_failed, coll),
                               (prepared, self.win), layout, 0 if unit is None else unit[1], root)
        if len(self._fast_calls) > 64:  # many signatures: start over rather than grow forever
            self._drop_fast_calls()
        self._fast_calls[key] = fast
        return fast

    def _fast_counts(self, coll: str, in_count: int) -> tuple[int, int]:
        """(the call struct's count, the output's element count) of ``coll`` with ``in_count``
        input elements: count is per rank's block, as Communicator passes it to :meth:`run`."""
        if coll == "allgather":
            return in_count, in_count * self.size
        if coll == "reduce_scatter":
            return in_count // self.size, in_count // self.size
        if coll == "alltoall":
            return in_count // self.size, in_count
        return in_count, in_count

    def _fast_failed(self, coll: str, seq: int):
        """Raises the exception of the failed fast call ``seq`` (its status is in the result)."""
        res = self._res
        raise self._failure(coll, seq, res.status, res.rank, res.lane, res.index)

    def _drop_fast_calls(self) -> None:
        for fast in self._fast_calls.values():
            fast.disable()
        self._fast_calls.clear()

    def p2p(self, send: bool, peer: int, arr) -> None:
        """Send ``arr`` to ``peer`` or receive into it (blocking; see executor_p2p.cpp)."""
        with self._lock:
            self._check_usable()
            fn = self._lib.cx_exec_send if send else self._lib.cx_exec_recv
            deadline = self._lib.cx_exec_now_ns() + int(self.timeout * 1e9)
            fn(self.win.native, peer, self._ffi.from_buffer(arr), arr.nbytes, deadline, self._res)
            res = self._res
            if res.status == EXEC_STATUS["MISMATCH"]:
                raise CollectiveMismatch(f"rank {self.rank}: recv of {arr.nbytes} bytes from rank "
                                         f"{peer}, which sent {res.epochs_used} bytes; expected "
                                         f"matching sizes on both sides")
            if res.status:
                raise self._failure("send" if send else "recv", -1, res.status, res.rank,
                                    -1, -1)

    def _buffer(self, arr):
        return self._null if arr is None else self._ffi.from_buffer(arr)

    def abort_call(self, reason: str) -> None:
        """This rank rejects its part of the next call: peers raise PeerAborted, not hang.

        The aborted call runs as a barrier whose descriptor says "aborted": it consumes one
        epoch on every rank, so the communicator stays in step, and it returns only once every
        peer has entered the call. Returning sooner would let this rank's next call overwrite
        the descriptor slot of the call before, which a slower peer may not have checked yet.
        """
        with self._lock:
            self._abort_locked()

    def _abort_locked(self) -> None:
        if self._poisoned:
            return
        seq = self._seq
        fp, _ = self._flat("barrier", 1, 1, 0, 0)
        c = self._aborted_call()
        c.seq, c.epoch = seq, self._epoch
        self._ctl[W_ABORT] = seq + 1   # peers waiting anywhere in this call give up at once
        res = self._res
        self._lib.cx_exec_run(fp.native, self._wnative, c, res)
        self._seq += 1
        self._epoch += max(1, res.epochs_used)
        # Peers' descriptors differ from ours by design; a dead or stuck peer (or a fatal
        # abort) still poisons the communicator, but the caller raises its own error.
        if res.status not in (EXEC_STATUS["OK"], EXEC_STATUS["MISMATCH"]):
            self._failure("<aborted>", seq, res.status, res.rank, res.lane, res.index)

    def _mismatch_locked(self, coll: str, dtype: int, count: int, op: int, root: int):
        """Runs nothing but the descriptor check of this call (the barrier's plan behind it):
        its peers' differ, so it ends there on every rank."""
        fp, _ = self._flat("barrier", 1, 1, 0, 0)
        c = self._ffi.new("cx_exec_call*")
        c.coll, c.dtype, c.op, c.count, c.root = COLL_CODES[coll], dtype, op, count, root
        c.tile_count = max(1, count)
        c.in_private = c.out_private = 1
        c.scale, c.in_heap, c.out_heap = 1.0, -1, -1
        c.timeout_ns = int(self.timeout * 1e9)
        c.seq, c.epoch = self._seq, self._epoch
        res = self._res
        self._lib.cx_exec_run(fp.native, self._wnative, c, res)
        self._seq += 1
        self._epoch += max(1, res.epochs_used)
        return res

    def _aborted_call(self):
        c = self._abort_struct
        if c is None:
            c = self._abort_struct = self._ffi.new("cx_exec_call*")
            c.dtype, c.count, c.tile_count, c.coll = 1, 0, 64, ABORTED_CALL
            c.in_private = c.out_private = 1
            c.scale, c.in_heap, c.out_heap = 1.0, -1, -1
            c.timeout_ns = int(self.timeout * 1e9)
        return c

    def poison(self, why: str, dead: int | None = None) -> None:
        """Mark the communicator unusable here and tell every peer (fatal abort word).

        The word carries the rank found dead, if any, so that a peer which sees the abort word
        before it notices the death itself still names the dead rank.
        """
        if self._poisoned is None:
            self._poisoned = why
        self._drop_fast_calls()
        if len(self._ctl):
            culprit = (dead + 1) << 16 if dead is not None else 0
            self._ctl[W_ABORT] = ABORT_FATAL | culprit | self.rank

    def detach(self) -> None:
        """Drop every view of the window (so it can be unmapped); later calls raise. Peers
        still waiting on this rank then raise PeerAborted: it makes no more calls."""
        with self._lock:
            if len(self._ctl) and not int(self._ctl[W_ABORT]) & ABORT_FATAL:
                self._ctl[W_ABORT] = ABORT_CLOSED | self.rank
            self._poisoned = self._poisoned or "closed"
            self._drop_fast_calls()
            self._ctl = self._ctl[:0].copy()
            self.win = self._wnative = None

    def _check_usable(self) -> None:
        if self._poisoned:
            raise unusable(self.rank, self._poisoned)

    def _failure(self, coll, seq, status, peer, lane, index) -> Exception:
        me = f"rank {self.rank}, {coll} #{seq}"
        if status == EXEC_STATUS["MISMATCH"]:
            return CollectiveMismatch(f"{me}: ranks called different collectives: "
                                      f"{self._describe_all(seq)}; expected every rank to make "
                                      f"the same call (collective, dtype, op, count, root) in the "
                                      f"same order")
        if status == EXEC_STATUS["ABORTED"]:
            word = int(self.win.ctl[peer][W_ABORT])
            fatal = bool(word & ABORT_FATAL)
            dead = ((word >> 16) & 0xFFFF) - 1 if fatal else -1
            if dead >= 0:  # the peer gave up because a rank died: report the death
                status, peer = EXEC_STATUS["PEER_DEAD"], dead
            elif fatal:
                self.poison(f"rank {peer} failed")
            elif word & ABORT_CLOSED:
                self.poison(f"rank {peer} closed the communicator")
                return PeerAborted(f"{me}: rank {peer} closed the communicator and makes no more "
                                   f"calls; expected every rank to make the same calls in the "
                                   f"same order; check which rank makes this call and the others "
                                   f"do not", rank=peer)
        if status == EXEC_STATUS["ABORTED"]:
            return PeerAborted(f"{me}: rank {peer} aborted "
                               f"{'the communicator after a failure' if fatal else 'this call'}"
                               f" (see the error raised on rank {peer}); expected it to run the "
                               f"collective; fix the error there", rank=peer)
        if status == EXEC_STATUS["PEER_DEAD"]:
            self.poison(f"rank {peer} died", dead=peer)
            return PeerFailure(f"{me}: rank {peer} (pid {self.win.pids[peer]}) died during the "
                               f"collective; expected it alive; check its log for the crash",
                               rank=peer)
        if status == EXEC_STATUS["CMA"]:
            self.poison(f"reading rank {peer} across processes failed")
            return CommError(f"{me}: reading rank {peer}'s buffer across processes "
                             f"(process_vm_readv) failed; expected it to be readable as the "
                             f"probe at setup found it; set COLLECTX_CMA=0 to stage through "
                             f"shared memory instead")
        if status == EXEC_STATUS["INTERRUPTED"]:
            self.poison(f"interrupted by a signal in {coll} #{seq}")
            where = f" (lane {lane}, instruction {index})" if lane >= 0 else ""
            return Interrupted(f"{me}: a signal (Ctrl-C or SIGTERM) came while the call had "
                               f"waited{where} a second or more for a peer; the communicator is "
                               f"aborted and its peers raise PeerAborted; expected every rank to "
                               f"reach the call; create a new communicator to go on")
        if status == EXEC_STATUS["TIMEOUT"]:
            self.poison(f"timeout in {coll} #{seq}")
            return Timeout(f"{me}: no progress within {self.timeout:g} s (waiting in lane "
                           f"{lane}, instruction {index}); expected every rank to call {coll}; "
                           f"a rank may be missing or stuck, or raise COLLECTX_TIMEOUT")
        self.poison(f"native status {status}")
        return NativeError(f"{me}: the executor rejected the plan or call (status {status}); "
                           f"expected a valid schedule; report this with COLLECTX_PLAN_DUMP_FILE",
                           code=status)

    def _describe_all(self, seq: int) -> str:
        base = W_DESC + DESC_WORDS * (seq & 1)
        parts = []
        for r in range(self.size):
            d = [int(v) for v in self.win.ctl[r][base:base + 6]]
            parts.append(f"rank {r}: {_COLL_NAMES.get(d[1], d[1])}(dtype="
                         f"{_DTYPE_NAMES.get(d[2], d[2])}, op={_OP_NAMES.get(d[3], d[3])}, "
                         f"count={d[4]}, root={d[5]})")
        return "; ".join(parts)



def unusable(rank: int, why: str, kind: str = "communicator",
             init: str = "collectx.init()") -> CommError:
    """The error for a call on a communicator that was closed (``why`` "closed") or failed.

    >>> print(unusable(1, "closed"))
    rank 1: communicator used after close(); expected an open one; create a new one with ...
    """
    if why == "closed":
        return CommError(f"rank {rank}: {kind} used after close(); expected an open one; "
                         f"create a new one with {init}")
    return CommError(f"rank {rank}: {kind} unusable after an earlier failure ({why}); expected "
                     f"a healthy communicator; create a new one with {init}")


def input_heap(alias: int, in_heap: int, out_heap: int, cma_in: int) -> int:
    """The input's heap offset as the executor takes it, -1 to stage it (the FastCall in
    native/python/cx_fastpath.c codes it the same way): the input is used in place when it is
    disjoint from the output, or when it is the output itself and peers may read it in place
    as they would across processes (``cma_in``: every read of an input chunk comes before every
    write over it); other overlaps are staged.

    >>> input_heap(DISJOINT, 64, 0, 0), input_heap(SAME, 0, 0, 1), input_heap(SAME, 0, 0, 0)
    (64, 0, -1)
    """
    if alias == DISJOINT:
        return in_heap
    return out_heap if alias == SAME and cma_in else -1


def cma_min_bytes(coll: str, crowded: bool) -> int:
    """Bytes per unit from which ``coll`` lets peers read user buffers across processes;
    ``crowded``: the ranks on this machine outnumber its CPUs.

    >>> cma_min_bytes("allreduce", False) >> 10, cma_min_bytes("broadcast", False) >> 10
    (256, 16)
    >>> cma_min_bytes("allgather", True) >> 10, cma_min_bytes("reduce_scatter", True) >> 10
    (256, 1024)
    >>> cma_min_bytes("reduce", False) >> 10, cma_min_bytes("reduce", True) >> 10
    (256, 2048)
    """
    if coll in _COPY_ONLY:
        return CMA_COPY_MIN_BYTES_OVERSUBSCRIBED if crowded else CMA_COPY_MIN_BYTES
    if coll == "reduce" and crowded:
        return CMA_REDUCE_MIN_BYTES_OVERSUBSCRIBED
    if coll in PUSHED:
        return CMA_PUSH_MIN_BYTES_OVERSUBSCRIBED if crowded else CMA_PUSH_MIN_BYTES
    return _NO_DATA    # barrier


def _fast_module():
    """collectx._fastpath when it is built and has the FastCall this engine builds, else None
    (checked path only)."""
    global _FAST_MODULE
    if _FAST_MODULE is False:
        try:
            from .. import _native
            module = _native._compiled_module()
        except Exception:  # no library or no compiled module: the checked path serves
            module = None
        _FAST_MODULE = module if getattr(module, "FASTCALL_API", None) == _FASTCALL_API else None
    return _FAST_MODULE


_FAST_MODULE = False  # not looked up yet
_FASTCALL_API = 3     # FastCall(..., layout, unit, root) called as fc(x, out, op[, root])
_WITH_OUT = ("disjoint", "in_at", "out_at")  # the FastCall layouts that take an out array
