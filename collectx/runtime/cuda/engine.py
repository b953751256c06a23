"""The CUDA call path: plan cache (FlatPlan, uploaded once), one ``cx_cuda_exec_launch`` per call,
and asynchronous failure reports.

A call is queued on the caller's stream and returns at once, so the kernel's verdict arrives
later: each call has a slot in a ring of pinned status records, which the stream fills after the
last tile, and an event. :meth:`CudaEngine.poll` reads the records of finished calls and raises
the first failure; the communicator polls before every call, and ``Work.wait`` /
``synchronize`` poll too. Any failure leaves the communicator unusable: the ranks may have
consumed different numbers of epochs, which a queued (not host-driven) executor cannot repair.

The schedule comes from the same planner and is flattened by the same
:class:`~collectx.runtime.executor.FlatPlan` as on the CPU: the device gets that exact encoding.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading

from ...errors import (ArgumentError, CollectiveMismatch, NativeError, PeerAborted, PeerFailure,
                       Timeout)
from ...log import logger, tracing
from ...schedule.ir import GPU_LANES, Schedule
from ..engine import (COLL_CODES, EXEC_STATUS, RankZeroElsewhere, barrier_schedule, posted_call,
                      trace_call, unusable)
from ..executor import FlatPlan
from ..plan_share import Planned, SharedPlans
from ..window import _alive
from . import _rt
from .geometry import (blocks_per_rank, channels, for_direct_calls, in_process, lane_stride,
                       reads_precede_writes, tile_count, tiles)
from .planning import cuda_schedule
from .watchdog import Watchdog

RING = 256             # status records in flight before the oldest call is waited for
STATUS_BYTES = 16      # cx_cuda_exec_status
DESC_OFFSET = 256      # byte offset of desc[2][8] in cx_cuda_ctl
_NAMES = {v: k for k, v in COLL_CODES.items()}


class GpuPlan:
    """A :class:`FlatPlan` uploaded to the device (``cx_cuda_plan_upload``), freed on close, with
    what each call of it needs: the schedule's lane stride (flags per channel) and whether a
    direct call may run it with the input and output at the same address."""

    def __init__(self, flat: FlatPlan, direct: bool = False):
        ffi, lib = _rt.lib()
        out = ffi.new("cx_cuda_plan**")
        _rt.check(lib.cx_cuda_plan_upload(flat.native, out), "cx_cuda_plan_upload")
        self.flat, self.native = flat, out[0]
        self.stride = lane_stride(flat.schedule)
        self.in_place = direct and reads_precede_writes(flat.schedule, flat.rank)

    def free(self) -> None:
        if self.native is not None:
            _rt.lib()[1].cx_cuda_plan_free(self.native)
            self.native = None


def pack_plan(flat: FlatPlan) -> list[int]:
    """The int32 image that :class:`GpuPlan` uploads (``cx_cuda_plan_pack``, host only)."""
    ffi, lib = _rt.lib()
    needed = ffi.new("long long*")
    _rt.check(lib.cx_cuda_plan_pack(flat.native, ffi.NULL, 0, needed), "cx_cuda_plan_pack")
    words = ffi.new("int[]", max(1, needed[0]))
    _rt.check(lib.cx_cuda_plan_pack(flat.native, words, needed[0], needed), "cx_cuda_plan_pack")
    return list(words)[:needed[0]]


class CudaEngine:
    """Queues collectives for one rank over a :class:`~.window.CudaWindow`.

    ``store`` and ``key_prefix`` are the communicator's: rank 0 publishes the planner's
    schedules there for the other ranks (:mod:`..plan_share`); without a store every rank plans.
    """

    def __init__(self, window, config, topology, timeout: float, *, store=None,
                 key_prefix: str = ""):
        self.win, self.rank, self.size = window, window.rank, window.size
        self.config, self.timeout = config, timeout
        self._topology = topology
        self._plans: dict[tuple, GpuPlan] = {}
        # Ranks of one process use each other's buffers in place (geometry.py).
        self.direct = in_process(window.peers)
        self._blocks = blocks_per_rank(window.peers)
        self._shared = SharedPlans("cuda", self.rank, self.size, store, key_prefix, timeout,
                                   config.cache_dir, config.algo)
        self._seq, self._epoch = 0, 1
        self._poisoned: str | None = None
        self._lock = threading.Lock()
        self._ffi, self._lib = _rt.lib()
        self._status = _rt.host_alloc((RING + 1) * STATUS_BYTES)   # + captured calls' record
        # The records as cffi pointers, made once: a cast costs about a microsecond per call.
        self._records = [self._ffi.cast("cx_cuda_exec_status*", self._status + i * STATUS_BYTES)
                         for i in range(RING + 1)]
        capture = self._records[RING]
        capture.status = capture.rank = capture.lane = capture.index = 0
        self._pending: collections.deque = collections.deque()  # (seq, coll, slot, event)
        self._events: list = [None] * RING   # one per status slot, reused
        self._event_ptrs: list = [None] * RING
        self._args = self._ffi.new("cx_cuda_exec_args*")
        self._filled = None   # the plan whose fixed fields _args holds
        self._watchdog = Watchdog(window, lambda: bool(self._pending))

    # -- planning -------------------------------------------------------------------------------
    def _plan(self, coll: str, dtype: int, itemsize: int, count: int, root: int,
              stream: int | None = None) -> GpuPlan:
        nbytes = count * itemsize
        key = (coll, dtype, nbytes.bit_length(), root)
        hit = self._plans.get(key)
        if hit is None:
            if stream is not None and self._state(0, stream) == 2:
                raise ArgumentError(
                    f"rank {self.rank}: the first {coll} of {nbytes} bytes per rank was called "
                    f"while its stream captures a CUDA graph; planning it copies the plan to the "
                    f"GPU, which a capture forbids; expected each collective and size class to "
                    f"run once before the capture (a warm-up, as NCCL's users do)")
            _rt.set_device(self.win.device)  # the current device is per thread (torch workers)
            planned = None
            if coll == "barrier":
                schedule = self._schedule(coll, nbytes, root)
            else:
                planned = self._shared.get(coll, nbytes, root, self.topology,
                                           lambda topo: self._schedule(coll, nbytes, root),
                                           lambda: self._watch_rank_zero(coll, nbytes, root))
                schedule = planned.schedule
                if self.direct:   # rewritten after the sharing, as on the CPU
                    schedule = for_direct_calls(schedule)
                self._dump(nbytes, schedule)
            flat = FlatPlan(schedule, self.rank, GPU_LANES, "CUDA")
            hit = self._plans[key] = GpuPlan(flat, self.direct)
            if planned is not None and self.rank == 0 and logger.isEnabledFor(logging.INFO):
                self._log_plan(coll, nbytes, planned, hit)
        return hit

    def _schedule(self, coll: str, nbytes: int, root: int) -> Schedule:
        """This rank's own plan (rank 0's, which :meth:`_plan` shares with the others)."""
        if coll == "barrier":
            return barrier_schedule(self.size)
        return cuda_schedule(self.topology(), coll, self.size, nbytes, root=root,
                             algo=self.config.algo)

    def _dump(self, nbytes: int, schedule: Schedule) -> None:
        if self.config.plan_dump_file and self.rank == 0:
            with open(self.config.plan_dump_file, "a") as f:
                f.write(json.dumps({"nbytes": nbytes, "device": "cuda",
                                    "schedule": schedule.to_dict()}) + "\n")

    def _log_plan(self, coll: str, nbytes: int, planned: Planned, plan: GpuPlan) -> None:
        s = planned.schedule
        low = 1 << (nbytes.bit_length() - 1) if nbytes else 0
        how = ("direct: user buffers used in place" if self.direct else
               f"staged: tiles of up to {plan.flat.tile_count(self.win.set_bytes, 1)} bytes")
        logger.info("rank 0/%d (GPU %d): %s of %d-%d bytes per rank: %s schedule (%s), %d "
                    "chunks, %d lanes, up to %d channels; %s; %s", self.size,
                    self.win.device, coll, low, max(2 * low - 1, 0), s.algorithm,
                    s.meta_dict().get("pattern", "-"), s.nchunks, plan.stride,
                    channels(2 * low, plan.stride, self._blocks, self.config.cuda_channels), how,
                    planned.describe())

    def _watch_rank_zero(self, coll: str, nbytes: int, root: int) -> None:
        """Raises while this rank waits for a plan that rank 0 will not publish: it rejected
        this call (its window says so only through a device copy, so it says so in the store),
        its process is gone, or it makes another call in this one's place (RankZeroElsewhere:
        its descriptor of this call, read from its window, names another)."""
        if self._shared.aborted(self._seq):
            self.poison(f"rank 0 rejected call #{self._seq}")
            raise PeerAborted(f"rank {self.rank} (GPU {self.win.device}), {coll} #{self._seq}: "
                              f"rank 0 aborted this call (see the error raised there); expected "
                              f"it to run the collective; fix the error there", rank=0)
        pid = int(self.win.peers[0]["pid"])
        if pid != os.getpid() and not _alive(pid):
            self.poison(f"rank 0 (pid {pid}) died")
            raise PeerFailure(f"rank {self.rank} (GPU {self.win.device}), {coll} #{self._seq}: "
                              f"rank 0 (pid {pid}) died before it published the plan; expected "
                              f"it alive; check its log for the crash", rank=0)
        ready = self.win.read_words(0, 0, 1)[0]   # first: the kernel posts it after the desc
        desc = self.win.read_words(0, DESC_OFFSET + 64 * (self._seq & 1), 6)
        theirs = posted_call(ready, desc, self._seq, self._epoch)
        if theirs is not None and theirs != (coll, nbytes, root):
            raise RankZeroElsewhere()

    def topology(self):
        """The GPU topology to plan on, or None (one-hop plan) when ranks share a GPU."""
        if self._topology is None and not self.win.shared_gpu:
            from ...topology import gpus, local_topology
            topo = local_topology(self.config)
            self._topology = topo if len(gpus(topo)) >= self.size else None
        return self._topology

    # -- running --------------------------------------------------------------------------------
    def run(self, coll: str, src, dst, count: int, dtype: int, itemsize: int, op: int, root: int,
            overlap: bool, stream: int):
        """Queue one collective on ``stream``; returns the event recorded after it."""
        if tracing():
            trace_call(self, coll, count, dtype, op, root)
        with self._lock:
            self._check_usable()
            if self._watchdog.dead is not None:
                self._peer_died_locked(coll)
            self._poll_locked(block=False, stream=stream)
            try:
                plan = self._plan(coll, dtype, itemsize, count, root, stream)
            except RankZeroElsewhere:
                raise self._mismatch_locked(coll, dtype, itemsize, count, op, root,
                                            stream) from None
            seq, slot, event = self._launch_locked(plan, coll, src, dst, count, dtype, itemsize,
                                                   op, root, overlap, stream)
            if seq is not None:
                self._pending.append((seq, coll, slot, event))
                self._watchdog.start()
            return event

    def _peer_died_locked(self, coll: str) -> None:
        """The watchdog saw a peer process die: raise what the stopped calls report, or, with
        none left, PeerFailure for this call."""
        self._poll_locked(block=True)
        dead = self._watchdog.dead
        self.poison(f"rank {dead} died")
        raise PeerFailure(f"rank {self.rank} (GPU {self.win.device}), {coll} #{self._seq}: rank "
                          f"{dead} (pid {self.win.peers[dead]['pid']}) died; expected it alive",
                          rank=dead)

    def _launch_locked(self, plan, coll, src, dst, count, dtype, itemsize, op, root, overlap,
                       stream) -> tuple:
        """Queue ``plan`` as this rank's next call: its (seq, status slot, event)."""
        slot = self._free_slot()
        event = self._events[slot] or self._new_event(slot)
        a = self._fill(plan, coll, src, dst, count, dtype, itemsize, op, root, overlap, slot)
        a.done_event = self._event_ptrs[slot]
        # One library call per collective (it sets the device and records the event too):
        # ranks as threads of one process take turns at the GIL at every call into C.
        rc = self._lib.cx_cuda_exec_launch(a, self._ffi.cast("void*", stream))
        if rc != 0 and a.captured:
            raise ArgumentError(
                f"rank {self.rank}: {coll} called while its stream captures a CUDA graph, but "
                f"this communicator's ranks are separate processes, whose calls stage through "
                f"windows a replay cannot follow; expected ranks of one process (threads) for "
                f"captured collectives; call it outside the capture")
        if rc != 0:
            self.poison(f"launch failed ({rc})")
            _rt.check(rc, f"cx_cuda_exec_launch({coll})")
        if a.captured:   # runs at every replay, reports to the capture record (RING)
            return None, RING, _rt.Event(handle=0)
        seq = self._seq
        self._seq += 1
        self._epoch += tiles(count, a.tile_count)
        return seq, slot, event

    def _new_event(self, slot: int):
        """The event of status slot ``slot``, made on its first use and kept: a call's event is
        recorded again RING calls later, by when the call is long done (its slot was polled)."""
        self._events[slot] = _rt.Event()
        self._event_ptrs[slot] = self._ffi.cast("void*", self._events[slot].handle)
        return self._events[slot]

    def _mismatch_locked(self, coll, dtype, itemsize, count, op, root, stream) -> Exception:
        """Rank 0 makes another call in this one's place, so this rank has no plan: post this
        call's descriptor behind the barrier's plan (no transfers), so that every rank's
        kernel finds the mismatch as if this rank had had a plan; the error to raise."""
        plan = self._plan("barrier", dtype, itemsize, 0, 0)
        seq, slot, event = self._launch_locked(plan, coll, None, None, count, dtype, itemsize, op,
                                               root, False, stream)
        self._poll_locked(block=True)   # earlier calls first: a failure there comes first
        event.synchronize()
        rec = self._status_record(slot)
        return self._failure(coll, seq, rec.status or EXEC_STATUS["MISMATCH"], rec.rank, rec.lane,
                             rec.index)

    def _fill(self, plan, coll, src, dst, count, dtype, itemsize, op, root, overlap, slot):
        a, ffi, win = self._args, self._ffi, self.win
        if self._filled is not plan:   # what stays the same from call to call of one plan
            a.plan, a.self_window = plan.native, ffi.cast("void*", win.self_base)
            a.d_windows = ffi.cast("void**", win.d_windows)
            a.set_bytes, a.threads, a.timeout_ns = win.set_bytes, 0, int(self.timeout * 1e9)
            a.direct, a.lane_stride, a.device = int(self.direct), plan.stride, win.device
            a.out_private = int(plan.flat.out_private)
            a.capture_status = self._records[RING]
            self._filled = plan
        a.coll, a.root, a.dtype, a.op, a.count = COLL_CODES[coll], root, dtype, op, count
        a.tile_count = tile_count(plan.flat, win.set_bytes, itemsize, count, self.direct)
        a.channels = channels(count * itemsize, plan.stride, self._blocks,
                              self.config.cuda_channels)
        same = src is not None and dst is not None and src.ptr == dst.ptr
        a.copy_input = int(self.direct and overlap and not (same and plan.in_place))
        a.user_in = ffi.cast("void*", src.ptr if src is not None else 0)
        a.user_out = ffi.cast("void*", dst.ptr if dst is not None else 0)
        a.in_private = int(plan.flat.in_private and not overlap)
        a.scale = 1.0 / self.size if op == 4 else 1.0
        a.seq, a.epoch = self._seq, self._epoch
        a.status_host = self._records[slot]
        self._records[slot].status = 0
        return a

    def _status_record(self, slot: int):
        return self._records[slot]

    def _free_slot(self) -> int:
        slot = self._seq % RING
        while self._pending and self._pending[0][2] == slot:  # ring full: wait for the oldest
            self._poll_locked(block=True, upto=1)
        return slot

    def abort_call(self, stream: int) -> None:
        """This rank rejects its next call: peers fail it with PeerAborted instead of hanging.
        The communicator is unusable afterwards (see the module notes)."""
        with self._lock:
            if self._poisoned:
                return
            self._lib.cx_cuda_exec_abort(self._ffi.cast("void*", self.win.self_base), self._seq,
                                         self._epoch, self._ffi.cast("void*", stream))
            self._shared.mark_aborted(self._seq)   # peers may wait for this rank's plan
            self.poison(f"call #{self._seq} rejected its arguments")

    def poll(self, block: bool = False) -> None:
        """Raise the first failure among finished calls (``block``: wait for all first)."""
        with self._lock:
            self._poll_locked(block)

    def _poll_locked(self, block: bool, upto: int | None = None, stream: int | None = None):
        """Raise the first failure among finished calls, oldest first (``block``: wait for
        them). Before a call on ``stream``, asks nothing while that stream captures a graph."""
        rec = self._status_record(RING)
        if rec.status:   # a replay of a captured call failed
            raise self._failure("a collective captured into a CUDA graph", -1, rec.status,
                                rec.rank, rec.lane, rec.index)
        done = 0
        while self._pending and (upto is None or done < upto):
            seq, coll, slot, event = self._pending[0]
            if block:
                event.synchronize()
            elif stream is not None and done == 0:
                if self._state(event.handle, stream) != 0:   # running, or capturing
                    return
            elif not event.query():
                return
            self._pending.popleft()
            done += 1
            rec = self._status_record(slot)
            if rec.status:
                raise self._failure(coll, seq, rec.status, rec.rank, rec.lane, rec.index)

    def _state(self, event: int, stream: int) -> int:
        """0: ``event`` (0: none) is done, 1: it is not, 2: ``stream`` captures a graph."""
        state = self._ffi.new("int*")
        _rt.check(self._lib.cx_cuda_exec_poll(self._ffi.cast("void*", event),
                                              self._ffi.cast("void*", stream), state),
                  "cx_cuda_exec_poll")
        return state[0]

    def poison(self, why: str) -> None:
        if self._poisoned is None:
            self._poisoned = why

    def _check_usable(self) -> None:
        if self._poisoned:
            raise unusable(self.rank, self._poisoned, "CUDA communicator",
                           "collectx.init(device='cuda')")

    def _failure(self, coll, seq, status, peer, lane, index) -> Exception:
        self.poison(f"{coll} #{seq} failed with executor status {status}")
        me = f"rank {self.rank} (GPU {self.win.device}), {coll} #{seq}"
        if status == EXEC_STATUS["MISMATCH"]:
            return CollectiveMismatch(f"{me}: ranks called different collectives: "
                                      f"{self._describe(seq)}; expected every rank to make the "
                                      f"same call (collective, dtype, op, count, root) in order")
        if status == EXEC_STATUS["ABORTED"]:
            return PeerAborted(f"{me}: rank {peer} aborted this call or failed (see the error "
                               f"raised there); expected it to run the collective", rank=peer)
        if status == EXEC_STATUS["TIMEOUT"]:
            return Timeout(f"{me}: no progress within {self.timeout:g} s waiting on rank {peer} "
                           f"(lane {lane}, instruction {index}); expected every rank to call "
                           f"{coll}; a rank may be missing, dead or stuck, or raise "
                           f"COLLECTX_TIMEOUT")
        if status == EXEC_STATUS["PEER_DEAD"]:
            return PeerFailure(f"{me}: rank {peer} died; expected it alive", rank=peer)
        return NativeError(f"{me}: the CUDA executor rejected the plan (status {status}, lane "
                           f"{lane}, instruction {index}); expected a valid schedule; report "
                           f"this with COLLECTX_PLAN_DUMP_FILE", code=status)

    def _describe(self, seq: int) -> str:
        parts = []
        for r in range(self.size):
            d = self.win.read_words(r, DESC_OFFSET + 64 * (seq & 1), 6)
            parts.append(f"rank {r}: {_NAMES.get(d[1], d[1])}(dtype={d[2]}, op={d[3]}, "
                         f"count={d[4]}, root={d[5]})")
        return "; ".join(parts)

    def close(self) -> None:
        """Wait for queued calls, free plans and status memory (errors are not raised here)."""
        self._watchdog.stop()
        with self._lock:
            for *_, event in self._pending:
                event.synchronize()
            self._pending.clear()
            for event in self._events:
                if event is not None:
                    event.destroy()
            self._events, self._event_ptrs = [None] * RING, [None] * RING
            for plan in self._plans.values():
                plan.free()
            self._plans.clear()
            if self._status:
                _rt.host_free(self._status)
                self._status = 0
            self._poisoned = self._poisoned or "closed"
