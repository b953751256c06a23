"""The CUDA executor's interpreter, run on the CPU: ``cx_cuda_exec_emulate`` compiles the very code
the kernel runs (native/cuda/interp.inc) for the host, one thread per lane, over host-memory
windows laid out like the GPU's. Ranks are Python threads (cffi releases the GIL), calls follow
each other on the same windows (epochs, both staging sets, tiles), and results are compared with
numpy. What this cannot show -- GPU memory ordering, IPC, streams -- is left to test_cuda_gpu.py.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import _needs as needs
import _runtime_workers as W
from collectx.errors import CudaUnavailable
from collectx.planner import make_schedule
from collectx.runtime.arrays import DTYPE_CODES, OP_CODES
from collectx.runtime.engine import COLL_CODES, barrier_schedule
from collectx.runtime.cuda.geometry import (for_direct_calls, lane_stride, reads_precede_writes,
                                            tile_count, tiles)
from collectx.runtime.executor import FlatPlan
from collectx.topology import generators as G


def _lib():
    """The library with its CUDA objects, or None where it was built without them (no nvcc);
    any other failure to load it fails the tests instead of skipping them."""
    from collectx.runtime.cuda import _rt
    try:
        ffi, lib = _rt.lib()
    except CudaUnavailable:
        return None
    getattr(lib, "cx_cuda_exec_emulate")   # the emulator comes with every CUDA build
    return ffi, lib


pytestmark = pytest.mark.skipif(_lib() is None, reason=needs.reason("nvcc"))
COLLS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall")


def _aligned(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.zeros(nbytes + align, np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip:skip + nbytes]


class Emulator:
    """``nranks`` host windows and the call sequence state every rank agrees on; calls run on
    ``channels`` blocks per lane, ``direct`` ones with the user's buffers used in place on every
    rank (the CUDA engine's calls among ranks of one process)."""

    def __init__(self, nranks: int, set_bytes: int = 1 << 16, channels: int = 1,
                 direct: bool = False):
        from collectx.runtime.cuda.window import ctl_bytes
        self.ffi, self.lib = _lib()
        self.nranks, self.set_bytes = nranks, set_bytes
        self.channels, self.direct = channels, direct
        self.windows = [_aligned(ctl_bytes() + 2 * set_bytes) for _ in range(nranks)]
        self.table = self.ffi.new("void*[]", [self.ffi.cast("void*", w.ctypes.data)
                                              for w in self.windows])
        self.seq, self.epoch = 0, 1

    def call(self, coll, schedule, ins, outs, counts, dtype, op="sum", root=0, ranks=None,
             timeout_s=30.0, colls=None):
        """Every rank in ``ranks`` runs its part at once; returns each rank's status record.
        ``schedule`` may be a dict (rank -> schedule), ``colls`` one (rank -> collective) for
        ranks that call another collective than ``coll``."""
        ranks = range(self.nranks) if ranks is None else ranks
        status = {r: self.ffi.new("cx_cuda_exec_status*") for r in ranks}
        keep, threads, ntiles = [], [], 1
        plans = schedule if isinstance(schedule, dict) else {r: schedule for r in ranks}
        stride = max(lane_stride(s) for s in plans.values())
        for r in ranks:
            fp = FlatPlan(plans[r], r)
            itemsize = np.dtype("uint16" if dtype == "bfloat16" else dtype).itemsize
            tile = tile_count(fp, self.set_bytes, itemsize, max(counts), self.direct)
            a = self._args(fp, r, (colls or {}).get(r, coll), ins[r], outs[r], counts[r], tile,
                           dtype, op, root, timeout_s, status[r])
            a.channels, a.lane_stride, a.direct = self.channels, stride, int(self.direct)
            overlap = ins[r] is not None and outs[r] is not None and \
                np.shares_memory(ins[r], outs[r])
            same = overlap and ins[r].ctypes.data == outs[r].ctypes.data
            a.copy_input = int(self.direct and overlap and
                               not (same and reads_precede_writes(plans[r], r)))
            keep.append((fp, a))
            ntiles = max(ntiles, tiles(counts[r], tile))
            threads.append(threading.Thread(target=self.lib.cx_cuda_exec_emulate,
                                            args=(fp.native, a)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.seq += 1
        self.epoch += ntiles
        return {r: (s.status, s.rank) for r, s in status.items()}

    def _args(self, fp, r, coll, x, out, count, tile, dtype, op, root, timeout_s, status):
        ffi = self.ffi
        a = ffi.new("cx_cuda_exec_args*")
        a.self_window, a.d_windows = self.table[r], self.table
        a.set_bytes, a.coll, a.root = self.set_bytes, COLL_CODES[coll], root
        a.dtype, a.op, a.count, a.tile_count = DTYPE_CODES[dtype], OP_CODES[op], count, tile
        a.user_in = ffi.cast("void*", 0 if x is None else x.ctypes.data)
        a.user_out = ffi.cast("void*", 0 if out is None else out.ctypes.data)
        overlap = x is not None and out is not None and np.shares_memory(x, out)
        a.in_private, a.out_private = int(fp.in_private and not overlap), int(fp.out_private)
        a.scale = 1.0 / self.nranks if op == "avg" else 1.0
        a.seq, a.epoch = self.seq, self.epoch
        a.timeout_ns, a.status_host = int(timeout_s * 1e9), status
        return a


def run_collective(emu, coll, dtype, op, n, root, seed=3, schedule=None, inplace=False):
    """One collective on every rank against the numpy reference; returns failure texts."""
    size = emu.nranks
    if coll in ("reduce_scatter", "alltoall"):
        n *= size
    inputs = [W.rank_input(seed, r, n, dtype) for r in range(size)]
    ins = [x.copy() for x in inputs]
    out_n = {"allgather": n * size, "reduce_scatter": n // size}.get(coll, n)
    outs = [x if inplace else np.full(out_n, 99, dtype) for x in ins]
    count = {"reduce_scatter": n // size, "alltoall": n // size}.get(coll, n)
    if coll == "broadcast":
        ins = [x if r == root else None for r, x in enumerate(ins)]
        outs = [x if r == root else np.full(n, 99, dtype) for r, x in enumerate(ins)]
    if coll == "reduce":
        outs = [o if r == root else None for r, o in enumerate(outs)]
    itemsize = np.dtype(dtype).itemsize
    schedule = schedule or make_schedule(None, coll, size, n * itemsize, root=root)
    if emu.direct:
        schedule = for_direct_calls(schedule)   # as the CUDA engine runs them

    reduces = coll in ("allreduce", "reduce_scatter", "reduce")
    status = emu.call(coll, schedule, ins, outs, [count] * size, dtype, op if reduces else "sum",
                      root)
    bad = [f"rank {r}: status {s}" for r, s in status.items() if s[0]]
    for r in range(size):
        if outs[r] is None:
            continue
        want = W.reference(coll, op, inputs, r, root)
        if not np.array_equal(outs[r], want):
            bad.append(f"rank {r}: {coll} {dtype} {op} n={n}: {outs[r][:5]} vs {want[:5]}")
    return bad


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_every_collective_on_one_set_of_windows(nranks):
    # A 64 KiB staging set: the 30001-element cases take several tiles, both sets, many epochs.
    emu = Emulator(nranks)
    bad = []
    for coll in COLLS:
        for dtype, op in (("float32", "sum"), ("int32", "max"), ("float64", "avg"),
                          ("int8", "prod"), ("float16", "min"), ("uint8", "max"),
                          ("int64", "avg")):
            for n in (0, 1, 17, 30001):
                bad += run_collective(emu, coll, dtype, op, n, root=nranks - 1)
    assert bad == []


@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_multi_lane_schedules_with_cross_rank_dependencies(algo):
    emu = Emulator(4, set_bytes=1 << 18)
    bad = []
    for n in (5, 4096, 100_003):
        s = make_schedule(G.ring(4), "allreduce", 4, n * 4, algo=algo)
        bad += run_collective(emu, "allreduce", "float32", "sum", n, 0, schedule=s)
    assert bad == []


def test_in_place_allreduce_reads_and_writes_the_user_buffer():
    emu = Emulator(3)
    assert run_collective(emu, "allreduce", "int64", "sum", 1000, 0, inplace=True) == []


CASES = (("float32", "sum"), ("int32", "max"), ("float64", "avg"), ("int8", "prod"),
         ("float16", "min"), ("uint8", "max"))


@pytest.mark.parametrize("nranks, channels", [(2, 3), (3, 2), (4, 5)])
def test_every_collective_on_several_channels(nranks, channels):
    # Each lane runs on several blocks, each over its own share of every tile with flags of its
    # own; shares are whole 64-element blocks, so small counts leave some blocks nothing to do.
    emu = Emulator(nranks, channels=channels)
    bad = []
    for coll in COLLS:
        for dtype, op in CASES:
            for n in (0, 1, 17, 30001):
                bad += run_collective(emu, coll, dtype, op, n, root=nranks - 1)
    assert bad == []


@pytest.mark.parametrize("nranks, channels", [(2, 1), (2, 4), (3, 3), (4, 2)])
def test_direct_calls_use_every_ranks_buffers_in_place(nranks, channels):
    # Ranks of one process: peers read each rank's input and write its output where the user
    # keeps them (published in the control block), reductions push their results into the
    # peers' outputs in the same pass, and every rank leaves only once all are done.
    emu = Emulator(nranks, channels=channels, direct=True)
    bad = []
    for coll in COLLS:
        for dtype, op in CASES:
            for n in (0, 1, 17, 30001):
                bad += run_collective(emu, coll, dtype, op, n, root=nranks - 1)
    for coll in ("allreduce", "broadcast", "reduce"):
        bad += run_collective(emu, coll, "float32", "sum", 5000, 0, inplace=True)
    assert bad == []


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "reduce", "allgather"])
@pytest.mark.parametrize("nranks", [2, 3, 8])
def test_pushed_schedules_without_their_empty_lanes_verify(coll, nranks):
    from collectx.schedule.verify import verify
    s = for_direct_calls(make_schedule(None, coll, nranks, 1 << 20))
    verify(s)   # raises on a race, a deadlock or a wrong result
    assert all(lane.instrs for lanes in s.lanes for lane in lanes)


def test_a_direct_in_place_allgather_reads_a_copy_of_its_input():
    # torch's all_gather_into_tensor in place: each input is its rank's slot of its output, so
    # peers would read it while other slots are written; the call reads a copy made first.
    emu = Emulator(3, channels=2, direct=True)
    n, inputs = 1001, [W.rank_input(9, r, 1001, "int32") for r in range(3)]
    outs = [np.full(3 * n, -1, np.int32) for _ in range(3)]
    for r in range(3):
        outs[r][r * n:(r + 1) * n] = inputs[r]
    ins = [outs[r][r * n:(r + 1) * n] for r in range(3)]
    status = emu.call("allgather", make_schedule(None, "allgather", 3, 4 * n), ins, outs,
                      [n] * 3, "int32")
    assert status == {r: (0, 0) for r in range(3)}
    assert all(np.array_equal(o, np.concatenate(inputs)) for o in outs)


def test_direct_scratch_schedules_tile_on_their_scratch_alone():
    # A ring allreduce has scratch: a direct call's tiles hold scratch only, several per call.
    # In place, its order is not shown safe (reads_precede_writes), so it reads a copy.
    emu = Emulator(4, set_bytes=1 << 14, channels=2, direct=True)
    bad = []
    for algo in ("ring", "tree"):
        s = make_schedule(G.ring(4), "allreduce", 4, 100_003 * 4, algo=algo)
        assert not reads_precede_writes(s, 0)
        for inplace in (False, True):
            bad += run_collective(emu, "allreduce", "float32", "sum", 100_003, 0, schedule=s,
                                  inplace=inplace)
    assert bad == []


def test_mismatched_counts_are_reported_by_every_rank():
    emu = Emulator(2)
    s = make_schedule(None, "allreduce", 2, 400)
    xs = [np.ones(100, np.float32), np.ones(101, np.float32)]
    status = emu.call("allreduce", s, xs, [x.copy() for x in xs], [100, 101], "float32")
    assert status == {0: (4, 1), 1: (4, 0)}   # CX_EXEC_MISMATCH, naming the other rank


def test_a_rank_without_a_plan_posts_its_descriptor_and_every_rank_finds_the_mismatch():
    # Rank 1 waited for the plan of an allreduce while rank 0 runs an allgather in its place:
    # it runs the barrier's plan (no transfers) behind its own call's descriptor, as the CUDA
    # engine does then, and neither rank hangs.
    emu = Emulator(2)
    plans = {0: make_schedule(None, "allgather", 2, 400), 1: barrier_schedule(2)}
    xs = [np.ones(100, np.float32), np.ones(100, np.float32)]
    outs = [np.zeros(200, np.float32), None]
    status = emu.call("allgather", plans, [xs[0], None], outs, [100, 100], "float32",
                      colls={1: "allreduce"}, timeout_s=10.0)
    assert status == {0: (4, 1), 1: (4, 0)}   # CX_EXEC_MISMATCH on both, naming the other


def test_a_missing_rank_is_a_timeout_not_a_hang():
    emu = Emulator(2)
    s = make_schedule(None, "allreduce", 2, 400)
    x = [np.ones(100, np.float32)] * 2
    status = emu.call("allreduce", s, x, [a.copy() for a in x], [100, 100], "float32",
                      ranks=[0], timeout_s=0.3)
    assert status[0][0] == 1    # CX_EXEC_TIMEOUT


@pytest.mark.parametrize("algo", ["direct", "ring"])
def test_the_same_launch_arguments_run_again_as_new_calls(algo):
    # What a CUDA graph replays: every rank's call with the very arguments it was captured with
    # (host sequence number and epoch included). The kernels count calls on the device, so each
    # run is a new call -- with scratch too, whose staging set alternates with the device epoch.
    emu = Emulator(3, set_bytes=1 << 14, channels=2, direct=True)
    n = 20_000
    s = for_direct_calls(make_schedule(G.ring(3) if algo == "ring" else None, "allreduce", 3,
                                       4 * n, algo=algo))
    bufs = [np.zeros(n, np.float32) for _ in range(3)]
    plans = [FlatPlan(s, r) for r in range(3)]
    tile = tile_count(plans[0], emu.set_bytes, 4, n, direct=True)
    status = [emu.ffi.new("cx_cuda_exec_status*") for _ in range(3)]
    args = [emu._args(plans[r], r, "allreduce", bufs[r], bufs[r], n, tile, "float32", "sum", 0,
                      30.0, status[r]) for r in range(3)]
    for a in args:
        a.channels, a.lane_stride, a.direct = 2, lane_stride(s), 1
        a.copy_input = int(not reads_precede_writes(s, 0))
    for replay in range(4):
        for r in range(3):
            bufs[r][:] = np.arange(n, dtype=np.float32) % 97 + 10 * r + replay
        threads = [threading.Thread(target=emu.lib.cx_cuda_exec_emulate,
                                    args=(plans[r].native, args[r])) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        want = 3 * (np.arange(n, dtype=np.float32) % 97 + replay) + 30
        assert [st.status for st in status] == [0, 0, 0]
        assert all(np.array_equal(b, want) for b in bufs), replay


@pytest.mark.parametrize("direct", [False, True])
def test_a_status_written_from_outside_stops_a_waiting_kernel(direct):
    # The watchdog's way to stop a rank whose peer process died: it writes PEER_DEAD and the dead
    # rank into the rank's status record; the kernel's waits see it within a few hundred polls.
    from collectx.runtime.cuda.watchdog import STATUS_OFFSET, death_words
    emu = Emulator(2, direct=direct)
    s = make_schedule(None, "allreduce", 2, 400)
    x = [np.ones(100, np.float32)] * 2
    status_words, _ = death_words(1, 0)
    timer = threading.Timer(0.3, lambda: emu.windows[0][STATUS_OFFSET:STATUS_OFFSET + 16]
                            .view(np.uint64).__setitem__(slice(None), status_words))
    timer.start()
    status = emu.call("allreduce", s, x, [a.copy() for a in x], [100, 100], "float32",
                      ranks=[0], timeout_s=30.0)
    timer.join()
    assert status[0] == (2, 1)    # CX_EXEC_PEER_DEAD, rank 1, long before the 30 s deadline


PACKED = {"allreduce": ("blink", "forest"), "broadcast": ("blink",), "reduce": ("blink",),
          "allgather": ("forest",), "reduce_scatter": ("forest",), "alltoall": ()}


@pytest.mark.parametrize("coll", COLLS)
def test_dgx1v_tree_packings_run_exactly(coll):
    # What the CUDA engine gets on a DGX-1V allocation without an NVLink ring: packed trees
    # over NVLink and PCIe peer routes, one lane (a block on the GPU) per tree edge, lanes
    # waiting on other ranks' lanes. Planned at 4 MiB to keep the instruction count small;
    # run at other counts, so chunks come out uneven and some empty.
    from collectx.runtime.cuda.planning import cuda_schedule
    from collectx.topology import load, subset
    view = subset(load("dgx1v"), [0, 1, 2, 5])
    schedules = [cuda_schedule(view, coll, 4, 4 << 20, root=1)]
    schedules += [cuda_schedule(view, coll, 4, 4 << 20, root=1, algo=a) for a in PACKED[coll]]
    bad = []
    for emu in (Emulator(4, set_bytes=1 << 18), Emulator(4, set_bytes=1 << 18, channels=2,
                                                         direct=True)):
        for s in schedules:
            assert not s.uses_host
            for n in (7, 100_003):
                bad += [f"{s.algorithm}: {b}" for b in
                        run_collective(emu, coll, "float32", "sum", n, root=1, schedule=s)]
    assert bad == []
    assert all(max(len(lanes) for lanes in s.lanes) > 1 for s in schedules[1:])
