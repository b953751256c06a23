"""The CUDA runtime, everything that can be checked without a GPU.

* the build: nvcc present -> the library carries the CUDA executor objects;
* the plan the GPU receives is the CPU executor's FlatPlan encoding, word for word, and
  malformed plans are refused before any upload;
* with no driver or device every entry point returns a status (no crash) and the Python layer
  raises a clear CollectXError subclass, ``collectx.init(device="cuda")`` included;
* device-buffer parsing (CUDA Array Interface, torch) and its error messages.

GPU behaviour is in test_cuda_gpu.py (marked ``gpu``).
"""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import _needs as needs

import collectx
from collectx import _native
from collectx.errors import ArgumentError, CollectXError, CudaError, CudaUnavailable, DTypeError
from collectx.planner import make_schedule
from collectx.runtime.executor import FlatPlan
from collectx.topology import generators as G

HAVE_NVCC = shutil.which("nvcc") is not None


def _cuda_objects() -> bool:
    try:
        return _native.build_info()["cuda_objects"]
    except CollectXError:
        return False


needs_objects = pytest.mark.skipif(not _cuda_objects(),
                                   reason=needs.reason("nvcc"))
no_gpu = pytest.mark.skipif(_native.cuda_available(),
                            reason="a GPU is visible: the no-device paths cannot be exercised")


# ---- build ------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not on PATH: CUDA objects are not expected")
def test_build_with_nvcc_has_the_cuda_executor():
    info = _native.build_info()
    assert info["cuda_objects"] is True
    assert "80" in info["cuda_archs"] and "90" in info["cuda_archs"]
    lib = _native.load()[1]
    for name in ("cx_cuda_exec_launch", "cx_cuda_plan_upload", "cx_cuda_ipc_open",
                 "cx_cuda_event_query", "cx_cuda_pointer_base"):
        assert getattr(lib, name) is not None


@needs_objects
def test_control_block_size_matches_the_header():
    from collectx.runtime.cuda.window import ctl_bytes
    from collectx.runtime.segment import set_bytes_for
    assert ctl_bytes() == 65536
    assert set_bytes_for(8 << 20) == 4 << 20 and set_bytes_for(0) == 1 << 16


# ---- plan encoding ------------------------------------------------------------------------------
def _schedules():
    for coll in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"):
        for n in (2, 3, 4, 8):
            yield f"direct-{coll}-{n}", make_schedule(None, coll, n, 1 << 16, root=n - 1)
    for algo in ("ring", "tree"):
        yield f"{algo}-ring8", make_schedule(G.ring(8), "allreduce", 8, 1 << 20, algo=algo)
    yield "auto-switch4", make_schedule(G.switch(4), "allgather", 4, 1 << 22)


def _flat_arrays(fp: FlatPlan) -> dict[str, list[int]]:
    p = fp.native
    ninstr = p.lane_off[p.nlanes]
    n_src = max([p.instrs[9 * i + 5] + p.instrs[9 * i + 6] for i in range(ninstr)] or [0])
    n_dep = max([p.instrs[9 * i + 7] + p.instrs[9 * i + 8] for i in range(ninstr)] or [0])
    return {"lane_off": [p.lane_off[i] for i in range(p.nlanes + 1)],
            "instrs": [p.instrs[i] for i in range(9 * ninstr)],
            "srcs": [p.srcs[i] for i in range(4 * n_src)],
            "deps": [p.deps[i] for i in range(3 * n_dep)],
            "fin": [p.fin_deps[i] for i in range(3 * p.nfin)]}


@needs_objects
@pytest.mark.parametrize("name, schedule", list(_schedules()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_gpu_plan_image_is_the_cpu_flatplan_encoding(name, schedule):
    from collectx.runtime.cuda.engine import pack_plan
    for rank in range(schedule.nranks):
        fp = FlatPlan(schedule, rank)
        words = pack_plan(fp)
        head = words[:16]
        assert head[:4] == [schedule.nranks, rank, schedule.nchunks, fp.native.nlanes]
        assert tuple(head[8:11]) == fp.units and head[7] == fp.native.nfin
        want = _flat_arrays(fp)
        offsets = head[11:16] + [len(words)]
        for i, key in enumerate(("lane_off", "instrs", "srcs", "deps", "fin")):
            assert words[offsets[i]:offsets[i + 1]] == want[key], (name, rank, key)


def _plan_struct(ffi, **override):
    fields = dict(nranks=2, rank=0, nchunks=2, lane_off=[0, 1],
                  instrs=[1, 0, 1, 0, 1, 0, 2, 0, 1], srcs=[0, 0, 0, 1, 1, 0, 0, 1],
                  deps=[1, 0, 0], fin=[1, 0, 0])
    fields.update(override)
    keep = [ffi.new("int[]", fields[k]) for k in ("lane_off", "instrs", "srcs", "deps", "fin")]
    p = ffi.new("cx_exec_plan*")
    p.nranks, p.rank, p.nchunks = fields["nranks"], fields["rank"], fields["nchunks"]
    p.nlanes = len(fields["lane_off"]) - 1
    p.lane_off, p.instrs, p.srcs, p.deps, p.fin_deps = keep
    p.nfin = len(fields["fin"]) // 3
    p.units = [1, 1, 0]
    return p, keep


@needs_objects
@pytest.mark.parametrize("override", [
    {},                                                     # the valid baseline
    {"instrs": [1, 5, 1, 0, 1, 0, 2, 0, 1]},                # destination rank out of range
    {"instrs": [1, 0, 3, 0, 1, 0, 2, 0, 1]},                # buffer code 3
    {"instrs": [2, 0, 1, 0, 1, 0, 2, 0, 1]},                # op code 2
    {"instrs": [1, 0, 1, 0, 1, 0, 0, 0, 1]},                # reduce with no source
    {"deps": [1, 70, 0]},                                   # lane 70 (the kernel has 64)
    {"srcs": [0, 0, 0, 1, 2, 0, 0, 1]},                     # source rank 2 of 2
    {"nchunks": 0},
    {"rank": 2},
])
def test_pack_refuses_malformed_plans(override):
    from collectx.runtime.cuda import _rt
    ffi, lib = _rt.lib()
    p, _keep = _plan_struct(ffi, **override)
    need = ffi.new("long long*")
    rc = lib.cx_cuda_plan_pack(p, ffi.NULL, 0, need)
    assert rc == (0 if not override else -3)
    if not override:
        assert need[0] == 16 + 2 + 9 + 8 + 3 + 3
        small = ffi.new("int[]", 4)
        assert lib.cx_cuda_plan_pack(p, small, 4, need) == -3  # too small a buffer


# ---- no driver / no device ------------------------------------------------------------------------
@needs_objects
@no_gpu
def test_entry_points_fail_with_a_status_and_a_message_without_a_device():
    from collectx.runtime.cuda import _rt
    ffi, lib = _rt.lib()
    assert lib.cx_cuda_available() == 0 and _rt.device_count() == 0
    ptr, ev, st = ffi.new("void**"), ffi.new("void**"), ffi.new("void**")
    assert lib.cx_cuda_malloc(ptr, 1024) < 0 and ptr[0] == ffi.NULL
    assert "cudaMalloc" in _rt.last_error()
    assert lib.cx_cuda_stream_create(st) < 0
    assert lib.cx_cuda_event_create(ev, 1) < 0
    assert lib.cx_cuda_ipc_open(bytes(64), ptr) < 0
    assert lib.cx_cuda_set_device(0) < 0
    assert lib.cx_cuda_preload() < 0
    assert lib.cx_cuda_host_alloc(ptr, 64) < 0
    base, size, dev = ffi.new("void**"), ffi.new("size_t*"), ffi.new("int*")
    host = np.zeros(4)
    assert lib.cx_cuda_pointer_base(ffi.cast("void*", host.ctypes.data), base, size, dev) < 0
    assert lib.cx_cuda_memcpy(ffi.NULL, ffi.NULL, 0, ffi.NULL) == 0    # nothing to copy
    with pytest.raises(CudaError, match="cudaStreamCreate"):
        _rt.stream_create()
    with pytest.raises(CudaError):
        _rt.Event()


@needs_objects
def test_launch_and_helpers_check_their_arguments():
    from collectx.runtime.cuda import _rt
    ffi, lib = _rt.lib()
    args = ffi.new("cx_cuda_exec_args*")
    assert lib.cx_cuda_exec_launch(ffi.NULL, ffi.NULL) == -3
    assert lib.cx_cuda_exec_launch(args, ffi.NULL) == -3        # no plan, no windows
    assert lib.cx_cuda_exec_abort(ffi.NULL, 0, 1, ffi.NULL) == -3
    n = ffi.new("long long*")
    assert lib.cx_cuda_exec_ntiles(10, 4, n) == 0 and n[0] == 3
    assert lib.cx_cuda_exec_ntiles(0, 4, n) == 0 and n[0] == 1
    assert lib.cx_cuda_exec_ntiles(10, 0, n) == -3
    with pytest.raises(ArgumentError, match="64"):
        _rt.ipc_open(b"short")


@no_gpu
def test_init_device_cuda_raises_a_clear_collectx_error():
    with pytest.raises(CudaUnavailable) as info:
        collectx.init(device="cuda")
    assert isinstance(info.value, CollectXError)
    assert "GPU" in str(info.value) or "CUDA objects" in str(info.value)
    with pytest.raises(ArgumentError, match="cuda:N"):
        collectx.init(device="tpu")


@no_gpu
def test_cuda_communicator_needs_a_gpu():
    from collectx.runtime.cuda import CudaCommunicator
    from collectx.runtime.store import HashStore
    with pytest.raises(CudaUnavailable):
        CudaCommunicator(0, 1, HashStore())


# ---- device buffers -------------------------------------------------------------------------------
class _CAI:
    def __init__(self, **kw):
        self.__cuda_array_interface__ = {"shape": (6,), "typestr": "<f4", "data": (4096, False),
                                         "version": 3, "strides": None} | kw


def test_cuda_array_interface_is_read_zero_copy():
    from collectx.runtime.cuda.arrays import as_device_buffer
    b = as_device_buffer(_CAI(shape=(2, 3), typestr="<i8", strides=(24, 8)), "x")
    assert (b.ptr, b.count, b.code, b.itemsize, b.stream, b.nbytes) == (4096, 6, 3, 8, 0, 48)
    assert as_device_buffer(_CAI(stream=1), "x").stream == 1   # the legacy default stream


@pytest.mark.parametrize("kw, err, text", [
    ({"typestr": "<c8"}, DTypeError, "complex64"),
    ({"typestr": "|b1"}, DTypeError, "bool"),
    ({"shape": (2, 3), "strides": (4, 8)}, ArgumentError, "C-contiguous"),
    ({"data": (4096, True)}, ArgumentError, "read-only"),
])
def test_bad_device_buffers_are_refused_with_the_reason(kw, err, text):
    from collectx.runtime.cuda.arrays import as_device_buffer
    with pytest.raises(err, match=text):
        as_device_buffer(_CAI(**kw), "out", writable=True)


def test_host_arrays_are_refused_by_the_cuda_path():
    from collectx.runtime.cuda.arrays import as_device_buffer, empty_like
    with pytest.raises(ArgumentError, match="host arrays go to the CPU communicator"):
        as_device_buffer(np.zeros(3), "x")
    with pytest.raises(ArgumentError, match="pass out="):
        empty_like(_CAI(), 3)
    torch = needs.module("torch")
    with pytest.raises(ArgumentError, match="CUDA tensors"):
        as_device_buffer(torch.zeros(3), "x")


# ---- the GPU check script ---------------------------------------------------------------------------
def test_gpu_check_script_parses_and_is_shellcheck_clean():
    import subprocess
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "perf" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        res = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


# ---- the engine's host side, with the GPU calls replaced ------------------------------------------
class _FakeEvent:
    def __init__(self, done=True):
        self.done, self.handle = done, 1

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True

    def record(self, stream):
        self.done = False

    def destroy(self):
        self.handle = 0


@pytest.fixture
def fake_engine(monkeypatch):
    """A CudaEngine whose pinned status ring is a numpy array and whose window is a stub."""
    from types import SimpleNamespace
    from collectx.runtime.cuda import _rt, engine as E
    ring = np.zeros((E.RING + 1) * E.STATUS_BYTES // 4, dtype=np.int32)
    monkeypatch.setattr(_rt, "host_alloc", lambda n: ring.ctypes.data)
    monkeypatch.setattr(_rt, "host_free", lambda p: None)
    win = SimpleNamespace(rank=1, size=2, device=0, set_bytes=1 << 20, self_base=4096,
                          d_windows=8192, shared_gpu=True,
                          peers=[{"pid": 1, "bus": "0000:01:00.0", "sms": 132},
                                 {"pid": 2, "bus": "0000:01:00.0", "sms": 132}],
                          read_words=lambda r, off, n: [0, 1, 6, 0, 100 + r, 0])
    from collectx.config import get_config
    eng = E.CudaEngine(win, get_config(), None, timeout=5.0)
    return eng, ring, E


@needs_objects
def test_engine_fills_the_launch_struct_the_library_checks(fake_engine):
    from collectx.runtime.cuda.arrays import DeviceBuffer
    eng, ring, E = fake_engine
    flat = FlatPlan(make_schedule(None, "allreduce", 2, 400), 1)
    plan = type("P", (), {"native": eng._ffi.NULL, "flat": flat, "stride": 1, "in_place": False})()
    buf = DeviceBuffer(1 << 20, 100, 6, 4, 0, 0, "cai")
    a = eng._fill(plan, "allreduce", buf, buf, 100, 6, 4, 4, 0, True, 3)
    assert (a.count, a.dtype, a.op, a.coll, a.scale, a.epoch, a.seq) == (100, 6, 4, 1, 0.5, 1, 0)
    assert a.in_private == 0 and a.timeout_ns == 5_000_000_000
    # Ranks as processes on one GPU: staged, one channel for 400 bytes, flags for its one lane.
    assert (a.direct, a.copy_input, a.channels, a.lane_stride) == (0, 0, 1, 1)
    assert a.tile_count == flat.tile_count(1 << 20, 4)
    assert int(eng._ffi.cast("uintptr_t", a.status_host)) == ring.ctypes.data + 3 * 16
    assert eng._lib.cx_cuda_exec_launch(a, eng._ffi.NULL) == -3   # no uploaded plan: refused


@needs_objects
@pytest.mark.parametrize("status, err, text", [
    (4, "CollectiveMismatch", "rank 1: allreduce.*count=101"),
    (3, "PeerAborted", "rank 0 aborted"),
    (1, "Timeout", "no progress within 5 s"),
    (5, "NativeError", "rejected the plan"),
])
def test_engine_reports_kernel_failures_then_refuses_calls(fake_engine, status, err, text):
    import collectx.errors as errors
    eng, ring, E = fake_engine
    eng._pending.append((0, "allreduce", 0, _FakeEvent(done=False)))
    eng.poll()                                   # still running: nothing to report yet
    eng._pending[0][3].done = True
    ring[:4] = (status, 0, 2, 7)
    with pytest.raises(getattr(errors, err), match=text):
        eng.poll()
    with pytest.raises(errors.CommError, match="unusable"):
        eng._check_usable()


def _rank_zero_posting(E, seq, coll, count, ready=1):
    """read_words of a window whose rank 0 posted ``coll`` (float32) as call ``seq``."""
    desc = [seq, E.COLL_CODES[coll], 6, 0, count, 0]

    def read_words(r, offset, n):
        if offset == 0:
            return [ready if r == 0 else 0]
        return desc if r == 0 else [seq, E.COLL_CODES["allreduce"], 6, 0, 100, 0]
    return read_words


@pytest.mark.parametrize("posted, ready, raised", [
    (("allgather", 100), 1, True),     # another collective in this call's place
    (("allreduce", 400), 1, True),     # another size class
    (("allreduce", 100), 1, False),    # this very call: its plan is coming
    (("allgather", 100), 0, False),    # rank 0's descriptor not complete yet
])
def test_a_rank_waiting_for_a_plan_sees_rank_zero_make_another_call(fake_engine, posted, ready,
                                                                   raised):
    from collectx.runtime.engine import RankZeroElsewhere
    eng, _, E = fake_engine
    eng.win.peers = [{"pid": os.getpid()}] * 2
    eng.win.read_words = _rank_zero_posting(E, 0, *posted, ready=ready)
    if raised:
        with pytest.raises(RankZeroElsewhere):
            eng._watch_rank_zero("allreduce", 400, 0)
    else:
        eng._watch_rank_zero("allreduce", 400, 0)


@needs_objects
def test_a_rank_without_its_plan_posts_its_call_and_raises_the_mismatch(fake_engine, monkeypatch):
    import collectx.errors as errors
    from collectx.runtime.engine import RankZeroElsewhere, barrier_schedule
    eng, ring, E = fake_engine
    eng.win.read_words = _rank_zero_posting(E, 0, "allgather", 100)
    flat = FlatPlan(barrier_schedule(2), 1)
    barrier = type("P", (), {"native": eng._ffi.NULL, "flat": flat, "stride": 1,
                             "in_place": False})()

    def plan(coll, dtype, itemsize, count, root, stream=None):
        if coll != "barrier":
            raise RankZeroElsewhere()
        return barrier
    launched = []

    def launch(a, stream):   # the kernel: the descriptors differ, so status MISMATCH
        launched.append((a.coll, a.count, a.seq, a.plan == barrier.native))
        ring[:4] = (4, 0, -1, -1)
        return 0
    real = eng._lib
    eng._lib = SimpleNamespace(cx_cuda_exec_launch=launch,
                               cx_cuda_exec_ntiles=real.cx_cuda_exec_ntiles)
    monkeypatch.setattr(eng, "_plan", plan)
    monkeypatch.setattr(E._rt, "set_device", lambda d: None)
    monkeypatch.setattr(E._rt, "Event", _FakeEvent)
    with pytest.raises(errors.CollectiveMismatch, match="rank 0: allgather.*rank 1: allreduce"):
        eng.run("allreduce", None, None, 100, 6, 4, 0, 0, False, 0)
    assert launched == [(E.COLL_CODES["allreduce"], 100, 0, True)]
    with pytest.raises(errors.CommError, match="unusable"):
        eng._check_usable()


# ---- how a call is cut (runtime/cuda/geometry.py) ---------------------------------------------
def test_channels_follow_the_size_and_stay_within_the_sms_and_the_flags():
    from collectx.runtime.cuda.geometry import MAX_FLAGS, channels
    assert channels(64 << 10, lane_stride=1, blocks=66) == 1           # under 128 KiB: one
    assert channels(1 << 20, lane_stride=1, blocks=66) == 8            # one per 128 KiB
    assert channels(1 << 30, lane_stride=1, blocks=66) == 66           # one block per SM
    assert channels(1 << 30, lane_stride=7, blocks=16) == 2            # lanes share the SMs
    assert channels(1 << 30, lane_stride=1, blocks=1000) == MAX_FLAGS  # the control block's flags
    assert channels(8, lane_stride=2, blocks=66, override=20) == 20    # COLLECTX_CUDA_CHANNELS
    assert channels(8, lane_stride=4, blocks=44, override=64) == 11    # ... within the SMs


def test_direct_tiles_hold_scratch_alone():
    from collectx.runtime.cuda.geometry import tile_count
    from collectx.topology import generators as G
    one_hop = FlatPlan(make_schedule(None, "allreduce", 4, 1 << 20), 0)
    ring = FlatPlan(make_schedule(G.ring(4), "allreduce", 4, 1 << 20, algo="ring"), 0)
    assert tile_count(one_hop, 1 << 16, 4, 1000, direct=True) == 1000     # no scratch: one tile
    staged = tile_count(ring, 1 << 16, 4, 1 << 20)
    direct = tile_count(ring, 1 << 16, 4, 1 << 20, direct=True)
    assert direct > staged and direct * 4 * ring.units[2] <= 1 << 16


def test_blocks_per_rank_share_each_gpu_among_its_ranks():
    from collectx.runtime.cuda.geometry import blocks_per_rank, in_process
    one_gpu = [{"pid": 5, "bus": "a", "sms": 132}] * 4
    assert blocks_per_rank(one_gpu) == 33 and in_process(one_gpu)
    two = [{"pid": p, "bus": b, "sms": 132} for p, b in ((1, "a"), (2, "a"), (3, "a"), (4, "b"))]
    assert blocks_per_rank(two) == 44 and not in_process(two)          # the fullest GPU decides


def _dead_pid() -> int:
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_watchdog_stops_a_rank_whose_peer_process_died():
    from types import SimpleNamespace
    from collectx.runtime.cuda.watchdog import ABORT_OFFSET, STATUS_OFFSET, Watchdog
    writes = []
    win = SimpleNamespace(rank=0, device=0, peers=[{"pid": os.getpid()}, {"pid": os.getpid()},
                                                   {"pid": _dead_pid()}],
                          write_words=lambda r, off, words: writes.append((r, off, words)))
    dog = Watchdog(win, busy=lambda: True)
    assert dog.look() == 2 and dog.dead == 2
    assert writes == [(0, STATUS_OFFSET, [2 | 2 << 32, (1 << 64) - 1]),
                      (0, ABORT_OFFSET, [(1 << 63) | 0])]
    assert Watchdog(SimpleNamespace(rank=0, device=0, peers=[{"pid": 7}] * 2),
                    busy=lambda: True)._watched == []     # ranks of one process: none to watch


@needs_objects
def test_calls_after_a_peer_died_raise_peer_failure(fake_engine):
    import collectx.errors as errors
    eng, ring, E = fake_engine
    eng.win.peers = [{"pid": os.getpid()}, {"pid": _dead_pid()}]
    eng.win.rank = 0
    eng._watchdog = E.Watchdog(eng.win, busy=lambda: True)
    eng.win.write_words = lambda r, off, words: None
    eng._watchdog.look()
    with pytest.raises(errors.PeerFailure, match="rank 1 .* died"):
        eng.run("allreduce", None, None, 100, 6, 4, 0, 0, False, 0)
    with pytest.raises(errors.CommError, match="unusable"):
        eng._check_usable()


# ---- ranks as threads on one GPU: checks that need no device ----------------------------------
def test_too_many_thread_ranks_per_gpu_for_the_hardware_queues_is_refused(monkeypatch):
    from collectx.runtime.cuda import window
    peers = [{"pid": 7, "bus": "0000:01:00.0", "device": 0}] * 8
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    with pytest.raises(ArgumentError, match="CUDA_DEVICE_MAX_CONNECTIONS=32"):
        window._check_hardware_queues(0, peers)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    window._check_hardware_queues(0, peers)
    apart = [dict(p, pid=r) for r, p in enumerate(peers)]  # processes: each has its own queues
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    window._check_hardware_queues(0, apart)


def test_thread_ranks_sharing_a_store_get_the_same_rendezvous_keys():
    from collectx.runtime.store import HashStore, next_key_prefix
    a, b = HashStore(), HashStore()
    assert [next_key_prefix("cuda", a, r) for r in (0, 1, 1, 0)] == \
        ["collectx/cuda0", "collectx/cuda0", "collectx/cuda1", "collectx/cuda1"]
    assert next_key_prefix("cuda", b, 1) == "collectx/cuda0"      # a new store starts afresh
    assert next_key_prefix("comm", a, 0) == "collectx/comm0"      # kinds count apart


def test_a_thread_rank_that_closes_early_keeps_its_window_until_peers_close(monkeypatch):
    # Ranks as threads map each other's windows directly; a rank that returns without calling
    # must not cudaFree memory a peer's kernel still polls (on a GPU that faulted with an
    # illegal address instead of the peer's Timeout).
    import threading
    from collectx.runtime.cuda import _rt, window
    from collectx.runtime.store import HashStore
    allocated, freed = iter(range(1 << 20, 1 << 30, 1 << 20)), []
    for name, fn in {"malloc": lambda n: next(allocated), "free": freed.append,
                     "memset": lambda *a, **k: None, "stream_synchronize": lambda s: None,
                     "set_device": lambda d: None, "pci_bus_id": lambda d: "0000:01:00.0",
                     "sm_count": lambda d: 132,
                     "ipc_handle": lambda p: b"h" * 64}.items():
        monkeypatch.setattr(_rt, name, fn)
    monkeypatch.setattr(window, "ctl_bytes", lambda: 4096)
    monkeypatch.setattr(window.CudaWindow, "_upload_bases", lambda self: None)
    store, wins = HashStore(), [None, None]

    def open_rank(r):
        wins[r] = window.CudaWindow(r, 2, store, "t", 1 << 20, 10.0, device=0)
    threads = [threading.Thread(target=open_rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    early, late = wins[1].self_base, wins[0].self_base
    assert wins[0].bases == [late, early] and wins[1].bases == [late, early]
    wins[1].close()
    assert freed == []                       # rank 0 still maps rank 1's window
    wins[0].close()
    assert sorted(freed) == sorted([early, late])
