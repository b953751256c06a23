"""Plans made once: rank 0 plans and shares through the store; the disk cache keeps plans
across runs, and a file that does not check out costs a plan, never a wrong collective.

Every test passes its own cache directory (tmp_path): the suite runs with
COLLECTX_CACHE_DIR=off (conftest.py) and never touches ~/.cache.
"""

from __future__ import annotations

import array
import json
import logging
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

import collectx
import collectx.planner as planner
from collectx.config import Config
from collectx.errors import NoFeasiblePlan, PeerAborted, Timeout
from collectx.runtime import plan_cache as pc
from collectx.runtime.plan_share import SharedPlans
from collectx.runtime.store import FileStore, HashStore
from collectx.schedule.ir import Schedule
from collectx.topology import load, ring

from _threads import on_threads

NBYTES = 4 << 20             # above the one-step sizes: the planner is used
RING4 = ring(4)


def _threads(nranks, fn):
    results, errors = on_threads(nranks, fn)
    for e in errors:
        if e is not None:
            raise e
    return results


@pytest.fixture
def planner_calls(monkeypatch):
    """Counts make_schedule calls (the engines import it when they plan)."""
    calls = []
    real = planner.make_schedule

    def counting(*args, **kw):
        calls.append(args[1:4])
        return real(*args, **kw)
    monkeypatch.setattr(planner, "make_schedule", counting)
    return calls


def _plan_ring4(calls=None):
    def plan(topo):
        if calls is not None:
            calls.append(1)
        return planner.make_schedule(topo, "allreduce", 4, NBYTES)
    return plan


def _lead(cache_dir, calls):
    """Rank 0 of a 4-rank communicator getting the ring(4) allreduce plan."""
    shared = SharedPlans("cpu", 0, 4, HashStore(), "t", 5.0, str(cache_dir))
    return shared.get("allreduce", NBYTES, 0, lambda: RING4, _plan_ring4(calls))


def _key():
    return pc.plan_key(RING4, 4, "allreduce", NBYTES, executor="cpu")


# -- the disk cache -------------------------------------------------------------------------------
def test_a_cache_hit_returns_an_equal_schedule(tmp_path):
    s = planner.make_schedule(RING4, "allreduce", 4, NBYTES)
    cache = pc.PlanCache(tmp_path)
    blob = cache.save(_key(), s, NBYTES)
    hit, read = cache.load(_key())
    assert hit == s and read == blob
    assert [p.name for p in tmp_path.iterdir()] == [_key().file_name]   # no temporary left


def test_a_second_communicator_reads_the_plan_from_disk(tmp_path, planner_calls):
    cfg = Config(cache_dir=str(tmp_path))

    def run(store):
        def rank_fn(rank):
            with collectx.runtime.Communicator(rank, 2, store, config=cfg, timeout=60) as comm:
                x = np.full(NBYTES // 4, rank + 1.0, np.float32)
                comm.allreduce(x)
                comm.allreduce(x)      # same size class: no store, no plan
                planned = comm._engine._shared.known("allreduce", NBYTES, 0)
                return float(x[0]), planned.source
        return _threads(2, rank_fn)
    assert run(HashStore()) == [(6.0, "planned"), (6.0, "rank 0")]
    assert len(planner_calls) == 1
    assert run(HashStore()) == [(6.0, "disk cache"), (6.0, "rank 0")]
    assert len(planner_calls) == 1          # the second communicator did not plan


def test_a_second_process_reads_the_plan_from_disk(tmp_path):
    code = ("import collectx, numpy as np\n"
            "with collectx.init() as c: c.allreduce(np.ones(1 << 20, np.float32))\n")
    env = dict(os.environ, COLLECTX_DEBUG="INFO", COLLECTX_CACHE_DIR=str(tmp_path / "plans"))

    def schedule_line():
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return next(line for line in run.stderr.splitlines() if "schedule" in line)
    assert "; planned in" in schedule_line()
    assert len(os.listdir(tmp_path / "plans")) == 1
    assert "; read from the disk cache in" in schedule_line()


def _damaged(blob: bytes) -> dict[str, bytes]:
    head, _, code = zlib.decompress(blob).partition(b"\n")
    data = json.loads(head)
    unloadable = dict(data, schedule={"schema": data["schedule"]["schema"], "lanes": 7})
    wrong_root = dict(data, schedule=dict(data["schedule"], root=2))
    pack = lambda d, words=code: zlib.compress(json.dumps(d).encode() + b"\n" + words)  # noqa: E731
    return {"truncated": blob[:len(blob) // 2], "flipped": blob[:-5] + b"xxxxx",
            "not json": zlib.compress(b"{not json"), "empty": b"",
            "unloadable": pack(unloadable), "wrong root": pack(wrong_root),
            "short words": pack(data, code[:-8]), "odd bytes": pack(data, code[:-3])}


@pytest.mark.parametrize("damage", ["truncated", "flipped", "not json", "empty", "unloadable",
                                    "wrong root", "short words", "odd bytes"])
def test_a_damaged_file_warns_and_is_planned_again(tmp_path, damage):
    calls = []
    good = _lead(tmp_path, calls).schedule
    path = tmp_path / _key().file_name
    path.write_bytes(_damaged(path.read_bytes())[damage])
    with pytest.warns(pc.PlanCacheWarning, match=rf"{path.name} is ignored: it"):
        again = _lead(tmp_path, calls)
    assert again.source == "planned" and again.schedule == good and len(calls) == 2
    assert pc.PlanCache(tmp_path).load(_key())[0] == good   # replaced by a good entry


@pytest.mark.parametrize("field, value, says", [
    ("version", "0.0.1", "written for version '0.0.1'"),
    ("schema", "collectx.schedule/1", "written for schema"),
    ("root", 3, "another plan: root 3"),
    ("topology", "0" * 64, "another plan: topology"),
])
def test_a_file_of_another_version_or_key_warns_and_is_planned_again(tmp_path, field, value,
                                                                      says):
    calls = []
    good = _lead(tmp_path, calls).schedule
    path = tmp_path / _key().file_name
    foreign = dict(_key().to_dict(), **{field: value})
    path.write_bytes(pc.encode(foreign, good, NBYTES))
    with pytest.warns(pc.PlanCacheWarning, match=says):
        assert _lead(tmp_path, calls).source == "planned"
    assert len(calls) == 2


def test_an_unwritable_directory_only_warns(tmp_path, planner_calls):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = Config(cache_dir=str(blocker / "plans"))   # cannot be created
    store = HashStore()

    def rank_fn(rank):
        with collectx.runtime.Communicator(rank, 2, store, config=cfg, timeout=60) as comm:
            x = np.ones(NBYTES // 4, np.float32)
            comm.allreduce(x)
            comm.allgather(x)
            return float(x[0])
    with pytest.warns(pc.PlanCacheWarning, match="cannot write plan cache directory") as seen:
        assert _threads(2, rank_fn) == [2.0, 2.0]
    assert len([w for w in seen if issubclass(w.category, pc.PlanCacheWarning)]) == 1


def test_the_key_follows_the_topology_and_the_code(monkeypatch):
    key = _key()
    assert pc.plan_key(RING4, 4, "allreduce", NBYTES + 1, executor="cpu") == key
    other = ring(4)
    other.edges["GPU0", "GPU1"]["latency_us"] = 9.0
    assert pc.plan_key(other, 4, "allreduce", NBYTES, executor="cpu").topology != key.topology
    assert pc.plan_key(RING4, 4, "allreduce", NBYTES, executor="cuda").digest != key.digest
    monkeypatch.setattr(pc, "code_fingerprint", lambda: "edited")
    assert pc.plan_key(RING4, 4, "allreduce", NBYTES, executor="cpu").digest != key.digest


def test_collectx_cache_dir_is_read_into_the_config(tmp_path):
    home = {"HOME": str(tmp_path)}
    assert Config.from_env(home).cache_dir == str(tmp_path / ".cache" / "collectx")
    assert Config.from_env(dict(home, XDG_CACHE_HOME="/x")).cache_dir == "/x/collectx"
    assert Config.from_env(dict(home, COLLECTX_CACHE_DIR="/p")).cache_dir == "/p"
    for off in ("", "off", "OFF", " 0 "):
        assert Config.from_env(dict(home, COLLECTX_CACHE_DIR=off)).cache_dir is None
    assert Config().cache_dir is None


def test_no_cache_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = SharedPlans("cpu", 0, 4, HashStore(), "t", 5.0, None)
    assert shared.get("allreduce", NBYTES, 0, lambda: RING4, _plan_ring4()).source == "planned"
    assert os.listdir(tmp_path) == []


# -- sharing through the store --------------------------------------------------------------------
class CountingStore(HashStore):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, str]] = []

    def set(self, key, value):
        self.ops.append(("set", key))
        super().set(key, value)

    def get(self, key, timeout=None):
        self.ops.append(("get", key))
        return super().get(key, timeout)


@pytest.mark.parametrize("kind", ["hash", "file"])
def test_rank_0_plans_once_and_every_rank_gets_its_schedule(tmp_path, kind):
    store = CountingStore() if kind == "hash" else FileStore(tmp_path)
    calls = []

    def rank_fn(rank):
        shared = SharedPlans("cpu", rank, 4, store, "c0", 30.0, None)
        first = shared.get("allreduce", NBYTES, 0, lambda: RING4, _plan_ring4(calls))
        again = shared.get("allreduce", NBYTES + 1, 0, lambda: RING4, _plan_ring4(calls))
        return first, again
    got = _threads(4, rank_fn)
    assert len(calls) == 1
    assert [p.source for p, _ in got] == ["planned", "rank 0", "rank 0", "rank 0"]
    assert all(p.schedule == got[0][0].schedule and again is p for p, again in got)
    if kind == "hash":   # rank 0 sets once and never waits; later calls never use the store
        key = "c0/plan/cpu/allreduce/23/0/auto/0"
        assert [op for op in store.ops if op[0] == "set"] == [("set", key)]
        assert all(k == key for _, k in store.ops)


def test_rank_0_planning_errors_are_raised_on_every_rank_and_a_retry_plans_afresh():
    store = HashStore()
    shared = [SharedPlans("cpu", rank, 4, store, "c", 30.0, None) for rank in range(4)]

    def fail(topo):
        raise NoFeasiblePlan("GPU3 cannot reach GPU0")

    def rank_fn(rank):
        return shared[rank].get("allreduce", NBYTES, 0, lambda: RING4, fail)
    _, errors = on_threads(4, rank_fn)
    assert all(isinstance(e, NoFeasiblePlan) for e in errors)
    assert "rank 0 could not plan: GPU3 cannot reach GPU0" in str(errors[1])
    # the same call again: the ranks meet under a new key, not at the old error
    got = _threads(4, lambda r: shared[r].get("allreduce", NBYTES, 0, lambda: RING4,
                                              _plan_ring4()))
    assert [p.source for p in got] == ["planned", "rank 0", "rank 0", "rank 0"]


def test_a_rank_waiting_for_rank_0_times_out_with_a_typed_error():
    shared = SharedPlans("cpu", 1, 2, HashStore(), "c", 0.05, None)
    with pytest.raises(Timeout, match="rank 0 did not publish the plan"):
        shared.get("allreduce", NBYTES, 0, lambda: RING4, _plan_ring4())


def test_a_plan_published_by_another_collectx_is_refused():
    from collectx.errors import PlanError
    store = HashStore()
    foreign = dict(_key().to_dict(), version="0.0.1")
    store.set("c/plan/cpu/allreduce/23/0/auto/0",
              pc.encode(foreign, planner.make_schedule(RING4, "allreduce", 4, NBYTES), NBYTES))
    with pytest.raises(PlanError, match="written for version '0.0.1'.*same collectx"):
        SharedPlans("cpu", 1, 4, store, "c", 5.0, None).get(
            "allreduce", NBYTES, 0, lambda: RING4, _plan_ring4())


def test_a_call_rank_0_rejects_before_planning_gives_peer_aborted(planner_calls):
    store = HashStore()

    def rank_fn(rank):
        with collectx.runtime.Communicator(rank, 3, store, timeout=60) as comm:
            x = np.ones(NBYTES // 4, np.float32)
            if rank == 0:
                with pytest.raises(collectx.ArgumentError):
                    comm.allreduce(x, out=np.empty(3, np.float32))
            else:
                with pytest.raises(PeerAborted, match="rank 0 aborted this call"):
                    comm.allreduce(x)
            comm.allreduce(x)      # still in step, and planned now
            return float(x[0])
    assert _threads(3, rank_fn) == [3.0, 3.0, 3.0]
    assert len(planner_calls) == 1


def test_info_says_where_the_schedule_came_from(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="collectx")
    cfg = Config(cache_dir=str(tmp_path))

    def run():
        store = HashStore()

        def rank_fn(rank):
            with collectx.runtime.Communicator(rank, 2, store, config=cfg, timeout=60) as comm:
                comm.allgather(np.ones(NBYTES // 4, np.float32))
        _threads(2, rank_fn)
    try:
        run()
        run()
    finally:
        logging.getLogger("collectx").setLevel(logging.NOTSET)
    lines = [r.getMessage() for r in caplog.records if "schedule" in r.getMessage()]
    assert len(lines) == 2 and all(line.startswith("rank 0/2: allgather") for line in lines)
    assert "; planned in " in lines[0] and "; read from the disk cache in " in lines[1]


# -- the CUDA engine's planning, without a GPU ----------------------------------------------------
def _cuda_engines(monkeypatch, cfg, nranks=2):
    """CudaEngines of ranks as threads over one store, with stub windows and plan uploads."""
    from types import SimpleNamespace
    from collectx.runtime.cuda import _rt, engine as E
    try:
        _rt.lib()
    except collectx.CollectXError as e:
        pytest.skip(f"no CUDA entry points in the library: {e}")
    records = np.zeros((E.RING + 1) * E.STATUS_BYTES, np.uint8)   # the pinned status ring
    monkeypatch.setattr(_rt, "host_alloc", lambda n: records.ctypes.data)
    monkeypatch.setattr(_rt, "host_free", lambda p: None)
    monkeypatch.setattr(_rt, "set_device", lambda d: None)
    monkeypatch.setattr(E, "GpuPlan", lambda flat, direct=False: SimpleNamespace(
        flat=flat, free=lambda: 0, stride=E.lane_stride(flat.schedule), in_place=False))
    store, topo = HashStore(), load("dgx1v")

    def engine(rank):
        win = SimpleNamespace(rank=rank, size=nranks, device=rank, set_bytes=1 << 20,
                              shared_gpu=False, peers=[{"pid": os.getpid()}] * nranks,
                              read_words=lambda r, offset, n: [0] * n)   # nothing posted
        return E.CudaEngine(win, cfg, topo, 30.0, store=store, key_prefix="cuda0")
    return [engine(r) for r in range(nranks)]


def test_the_cuda_engine_shares_and_caches_cuda_schedule(tmp_path, monkeypatch, caplog,
                                                         planner_calls):
    from collectx.runtime.cuda.planning import cuda_schedule
    caplog.set_level(logging.INFO, logger="collectx")
    dump = tmp_path / "plans.jsonl"
    cfg = Config(cache_dir=str(tmp_path / "cache"), plan_dump_file=str(dump))
    want = cuda_schedule(load("dgx1v"), "broadcast", 2, 64 << 20)
    assert not want.uses_host
    try:
        for source in ("planned", "disk cache"):
            engines = _cuda_engines(monkeypatch, cfg)
            got = _threads(2, lambda r: engines[r]._plan("broadcast", 6, 4, 16 << 20, 0))
            assert all(plan.flat.schedule == want for plan in got)
            assert engines[0]._shared.known("broadcast", 64 << 20, 0).source == source
    finally:
        logging.getLogger("collectx").setLevel(logging.NOTSET)
    assert len(planner_calls) == 2          # cuda_schedule above, then rank 0 once
    lines = [r.getMessage() for r in caplog.records if "schedule" in r.getMessage()]
    assert [line.split(";")[-1].split(" in ")[0] for line in lines] == \
        [" planned", " read from the disk cache"]
    assert lines[0].startswith("rank 0/2 (GPU 0): broadcast of 67108864-134217727 bytes")
    assert f"{want.nchunks} chunks, {max(map(len, want.lanes))} lanes" in lines[0]
    dumped = [json.loads(line) for line in dump.read_text().splitlines()]
    assert [Schedule.from_dict(d["schedule"]) for d in dumped] == [want, want]


def test_a_cuda_call_rank_0_rejects_stops_the_waiting_ranks(monkeypatch):
    engines = _cuda_engines(monkeypatch, Config())
    engines[0]._shared.mark_aborted(0)
    with pytest.raises(PeerAborted, match="rank 0 aborted this call"):
        engines[1]._plan("allreduce", 6, 4, 1 << 20, 0)
    assert engines[1]._poisoned


@pytest.mark.parametrize("reader", ["compiled", "python"])
def test_packed_schedules_read_back_equal_and_malformed_words_are_refused(monkeypatch, reader):
    """Schedule.to_packed and from_packed give the same words and schedule through
    collectx._fastpath.pack_words/unpack_words and through Python (copies with dependencies,
    engine calls with groups), and both refuse words that are not what to_packed writes."""
    from collectx import _native
    from collectx.schedule import ir
    if reader == "compiled" and _native.compiled_helper("unpack_words") is None:
        pytest.skip("collectx._fastpath without pack_words/unpack_words")
    if reader == "python":
        monkeypatch.setattr(_native, "compiled_helper", lambda name: None)
    for topo, n in ((load("dgx1v"), 8), (load("multi:dgx_a100:2:25"), 16)):
        s = planner.make_schedule(topo, "allreduce", n, 64 << 20)
        packed = s.to_packed()
        engines = {}
        assert packed["code"] == ir._words_bytes(ir._pack_words(s.lanes, engines))
        assert packed["engine_ops"] == list(engines)
        assert Schedule.from_packed(packed) == s
    assert packed["engine_ops"] == ["allreduce"]     # the engine calls were packed too
    words = array.array("q", packed["code"])
    first = 3                                         # ranks, lanes, instructions, then op
    for at, value in ((first, 9), (first, -1), (first + 2, 7), (0, 17), (1, -2),
                      (first + 5, 1 << 40)):
        bad = array.array("q", words)
        bad[at] = value
        with pytest.raises((ValueError, IndexError, KeyError)):
            Schedule.from_packed(dict(packed, code=bad.tobytes()))
    for code in (packed["code"][:-8], packed["code"] + bytes(8), packed["code"][:-1]):
        with pytest.raises(ValueError):
            Schedule.from_packed(dict(packed, code=code))
    with pytest.raises((IndexError, KeyError)):       # an engine call naming no engine_op
        Schedule.from_packed(dict(packed, engine_ops=[]))


# -- received bytes decoded once per process --------------------------------------------------------
@pytest.fixture
def unpacks(monkeypatch):
    """Counts Schedule.from_packed calls, with an empty decode memo (earlier tests fill it)."""
    calls = []
    real = Schedule.from_packed.__func__

    def counting(cls, d):
        calls.append(1)
        return real(cls, d)
    monkeypatch.setattr(Schedule, "from_packed", classmethod(counting))
    pc.DECODED.clear()
    yield calls
    pc.DECODED.clear()


def _publish(store, blob, executor="cpu", prefix="m"):
    store.set(f"{prefix}/plan/{executor}/allreduce/23/0/auto/0", blob)


def _follow(store, rank, executor="cpu", prefix="m"):
    return SharedPlans(executor, rank, 4, store, prefix, 5.0, None).get(
        "allreduce", NBYTES, 0, lambda: RING4, _plan_ring4())


def test_thread_ranks_receiving_the_same_bytes_decode_them_once(unpacks):
    s = planner.make_schedule(RING4, "allreduce", 4, NBYTES)
    store = HashStore()
    _publish(store, pc.encode(_key(), s, NBYTES))
    got = _threads(3, lambda r: _follow(store, r + 1))
    assert all(p.source == "rank 0" and p.schedule == s for p in got)
    assert got[0].schedule is got[1].schedule is got[2].schedule   # one immutable schedule
    assert len(unpacks) == 1


def test_rank_0s_disk_read_is_its_thread_peers_decode(tmp_path, unpacks):
    _lead(tmp_path, [])                      # plans and writes the file
    pc.DECODED.clear()
    unpacks.clear()
    store = HashStore()

    def rank_fn(rank):
        shared = SharedPlans("cpu", rank, 4, store, "d", 5.0, str(tmp_path))
        return shared.get("allreduce", NBYTES, 0, lambda: RING4, _plan_ring4())
    got = _threads(4, rank_fn)
    assert [p.source for p in got] == ["disk cache", "rank 0", "rank 0", "rank 0"]
    assert all(p.schedule is got[0].schedule for p in got)
    assert len(unpacks) == 1


@pytest.mark.parametrize("damage", ["truncated", "flipped", "not json", "empty", "unloadable",
                                    "wrong root", "short words", "odd bytes"])
def test_damaged_bytes_are_refused_on_every_rank(unpacks, damage):
    from collectx.errors import PlanError
    s = planner.make_schedule(RING4, "allreduce", 4, NBYTES)
    blob = _damaged(pc.encode(_key(), s, NBYTES))[damage]
    errors = [None] * 4

    def read(rank):
        try:
            pc.decode(blob, _key())
        except pc.BadEntry as e:
            errors[rank] = e
    _threads(4, read)
    assert all(isinstance(e, pc.BadEntry) for e in errors)
    store = HashStore()
    _publish(store, blob)
    _, raised = on_threads(3, lambda r: _follow(store, r + 1))
    assert all(isinstance(e, PlanError) and "is unusable: it" in str(e) for e in raised)
    assert len(pc.DECODED) == 0              # a failure is never remembered


def test_a_decoded_entry_is_still_refused_to_a_rank_whose_key_differs(unpacks):
    from collectx.errors import PlanError
    s = planner.make_schedule(RING4, "allreduce", 4, NBYTES)
    blob = pc.encode(_key(), s, NBYTES)
    assert pc.decode(blob, _key()) == s
    for field, value in (("root", 3), ("executor", "cuda"), ("version", "0.0.1")):
        with pytest.raises(pc.BadEntry, match=f"{field} "):
            pc.decode(blob, dict(_key().to_dict(), **{field: value}))
    store = HashStore()
    _publish(store, blob, "cpu")
    _publish(store, blob, "cuda")           # the same bytes where a CUDA rank looks
    assert _follow(store, 1, "cpu").schedule == s
    with pytest.raises(PlanError, match="another plan: executor 'cpu', expected 'cuda'"):
        _follow(store, 2, "cuda")
    assert len(unpacks) == 1                 # refused by its key, not by decoding again


def test_the_decode_memo_is_bounded_and_shared_by_equal_bytes():
    memo, calls = pc.DecodeMemo(capacity=2), []

    def decode(b):
        calls.append(b)
        return [b]
    first = memo.get(b"a", decode)
    assert memo.get(bytearray(b"a"), decode) is first and calls == [b"a"]
    for b in (b"b", b"c"):
        memo.get(b, decode)
    assert len(memo) == 2
    assert memo.get(b"a", decode) is not first and calls == [b"a", b"b", b"c", b"a"]
