"""The CUDA communicator on a real GPU: collectives against numpy references, CuPy and torch
inputs, stream semantics, failures. Skipped (with the reason) where no GPU is visible.

Most tests run the ranks as threads of this process on GPU 0, each rank on its own non-blocking
stream (on one stream the ranks' kernels would queue behind each other and wait forever); one
test runs ranks as processes, so windows travel through CUDA IPC. Either way several ranks share
one GPU, the way a single-GPU machine tests multi-rank collectives.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

import _needs as needs

import _runtime_workers as W
import collectx
from collectx import _native
from collectx.config import get_config
from collectx.errors import CollectiveMismatch, CommError, Timeout

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _native.cuda_available(),
                                 reason="no CUDA GPU visible (collectx._native.cuda_available() "
                                        "is False): GPU tests need an NVIDIA GPU and driver")]

COLLS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall")
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
OPS = ("sum", "prod", "min", "max", "avg")


# ---- device arrays through whichever framework is installed -----------------------------------
class Torch:
    name = "torch"

    def __init__(self):
        import torch
        if not torch.cuda.is_available():
            pytest.skip("torch without CUDA")
        self.t = torch
        # Load the cast and multiply kernels the ranks use before any rank's collective is in flight: under
        # lazy module loading a first launch can wait for the context to go idle, and the ranks
        # (threads of this process) share one context with their peers' spinning kernels.
        (torch.zeros(4).to("cuda").to(torch.bfloat16).float() * 2).cpu()

    def new_stream(self):
        s = self.t.cuda.Stream()
        self.t.cuda.set_stream(s)
        return s

    def to_device(self, a: np.ndarray, dtype: str):
        if dtype == "bfloat16":
            return self.t.from_numpy(a.astype(np.float32)).to("cuda").to(self.t.bfloat16)
        return self.t.from_numpy(a).to("cuda")

    def to_host(self, x, dtype: str) -> np.ndarray:
        self.t.cuda.current_stream().synchronize()
        if dtype == "bfloat16":
            return x.float().cpu().numpy()
        return x.cpu().numpy()


class CuPy:
    name = "cupy"

    def __init__(self):
        self.cp = needs.module("cupy")
        self.cp.asnumpy(self.cp.ones(4, self.cp.float32) * 2)  # load the kernel now (see Torch)

    def new_stream(self):
        s = self.cp.cuda.Stream(non_blocking=True)
        s.use()
        return s

    def to_device(self, a: np.ndarray, dtype: str):
        if dtype == "bfloat16":
            pytest.skip("CuPy has no bfloat16")
        return self.cp.asarray(a)

    def to_host(self, x, dtype: str) -> np.ndarray:
        self.cp.cuda.get_current_stream().synchronize()
        return self.cp.asnumpy(x)


def _framework(name: str | None = None):
    for cls in (CuPy, Torch) if name is None else ({"cupy": CuPy, "torch": Torch}[name],):
        try:
            return cls()
        except (ImportError, pytest.skip.Exception):
            continue
    pytest.skip("neither CuPy nor torch with CUDA is installed")


def run_ranks(nranks: int, body, *, timeout: float = 60, window_bytes: int | None = None,
              fw=None, topology=None, algo: str | None = None, channels: int | None = None):
    """``body(comm, fw)`` on every rank (threads, GPU 0, own stream each); results by rank.
    ``topology``: the machine the ranks plan on (its first ``nranks`` GPUs; else one hop),
    ``algo``: the planner algorithm they are made to use (COLLECTX_ALGO), ``channels``: blocks
    per lane (COLLECTX_CUDA_CHANNELS)."""
    from collectx.runtime.cuda import CudaCommunicator
    from collectx.runtime.store import HashStore
    fw = fw or _framework()
    cfg = get_config()
    if window_bytes:
        cfg = dataclasses.replace(cfg, window_bytes=window_bytes)
    if algo:
        cfg = dataclasses.replace(cfg, algo=algo)
    if channels:
        cfg = dataclasses.replace(cfg, cuda_channels=channels)
    store, results, errors = HashStore(), [None] * nranks, []

    def rank_main(r):
        try:
            fw.new_stream()
            with CudaCommunicator(r, nranks, store, device=0, timeout=timeout, config=cfg,
                                  topology=topology) as c:
                results[r] = body(c, fw)
        except BaseException as e:  # re-raised below with its rank
            errors.append((r, e))
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 3)
    if errors:
        raise errors[0][1]
    return results


def _reference_inputs(seed, nranks, n, dtype):
    src = "float32" if dtype == "bfloat16" else dtype
    return [W.rank_input(seed, r, n, src) for r in range(nranks)]


def run_case(comm, fw, coll, dtype, op, n, root, seed):
    if coll in ("reduce_scatter", "alltoall"):
        n = n * comm.size
    inputs = _reference_inputs(seed, comm.size, n, dtype)
    x = fw.to_device(inputs[comm.rank].copy(), dtype)
    got = W.call(comm, coll, x, op, root)
    want = W.reference(coll, op, inputs, comm.rank, root)
    if got is None:
        return None
    have = fw.to_host(got, dtype)
    if dtype in ("float16", "bfloat16"):
        ok = np.allclose(have.astype(np.float64), want.astype(np.float64), rtol=2e-2, atol=1e-2)
    else:
        ok = np.array_equal(have, want)
    return None if ok else f"rank {comm.rank}: {coll} {dtype} {op} n={n}: {have[:6]} vs {want[:6]}"


# ---- correctness ---------------------------------------------------------------------------------
@pytest.mark.parametrize("nranks", [2, 4, 8])
def test_allreduce_every_dtype_and_op(nranks):
    fw = _framework("torch") if _has("torch") else _framework()
    dtypes = DTYPES if fw.name == "torch" else tuple(d for d in DTYPES if d != "bfloat16")

    def body(comm, fw):
        return [run_case(comm, fw, "allreduce", d, o, 1001, 0, 11) for d in dtypes for o in OPS]
    bad = [m for per_rank in run_ranks(nranks, body, fw=fw) for m in per_rank if m]
    assert bad == []


@pytest.mark.parametrize("nranks", [2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 17, 4099, 300_001])
def test_every_collective_with_tiny_tiles(nranks, n):
    # A 256 KiB window forces many tiles (and both staging sets) for the larger sizes.
    def body(comm, fw):
        return [run_case(comm, fw, c, d, o, n, nranks - 1, 5) for c in COLLS
                for d, o in (("float32", "sum"), ("int32", "max"), ("float64", "avg"))]
    bad = [m for per_rank in run_ranks(nranks, body, window_bytes=256 << 10) for m in per_rank
           if m]
    assert bad == []


PACKED = {"allreduce": ("blink", "forest"), "broadcast": ("blink",), "reduce": ("blink",),
          "allgather": ("forest",), "reduce_scatter": ("forest",), "alltoall": ()}


@pytest.mark.parametrize("coll", COLLS)
def test_dgx1v_tree_packings_run_exactly(coll):
    # What the engine plans for GPUs 0, 1, 2, 5 of a DGX-1V (no NVLink ring): packed trees over
    # NVLink and PCIe peer routes, a block per tree edge waiting on other ranks' blocks. Four
    # thread ranks plan on that allocation and run on one GPU: the chooser's plans, then each
    # packing forced (the emulation's twin: test_cuda_emulation.py).
    from collectx.topology import load, subset
    view = subset(load("dgx1v"), [0, 1, 2, 5])
    for algo in (None, *PACKED[coll]):
        def body(comm, fw):
            return [run_case(comm, fw, coll, "float32", "sum", n, 1, 7) for n in (7, 1 << 20)]
        bad = [m for per_rank in run_ranks(4, body, topology=view, algo=algo) for m in per_rank
               if m]
        assert bad == [], algo


@pytest.mark.parametrize("name", ["cupy", "torch"])
def test_framework_inputs_are_used_in_place(name):
    fw = _framework(name)

    def body(comm, fw):
        x = fw.to_device(np.full(4096, comm.rank + 1, np.float32), "float32")
        ptr = x.data_ptr() if name == "torch" else x.data.ptr
        out = comm.allreduce(x)
        same = (out.data_ptr() if name == "torch" else out.data.ptr) == ptr
        return same, fw.to_host(out, "float32")[:3].tolist()
    results = run_ranks(2, body, fw=fw)
    assert results == [(True, [3.0, 3.0, 3.0])] * 2


# ---- direct calls: ranks of one process use each other's buffers in place ----------------------
@pytest.mark.parametrize("nranks", [2, 4])
def test_collectives_whose_input_lies_inside_their_output(nranks):
    # torch's all_gather_into_tensor and reduce_scatter_tensor in place: the input is this rank's
    # slot of the output, or the output this rank's slot of the input. Peers read inputs where
    # they lie, so such a call reads a copy of its input, made first on the stream.
    n = 10_001

    def body(comm, fw):
        k, r = comm.size, comm.rank
        whole = np.full(k * n, -1.0, np.float32)
        whole[r * n:(r + 1) * n] = r + 1
        out = fw.to_device(whole, "float32")
        comm.allgather(out[r * n:(r + 1) * n], out)
        gathered = fw.to_host(out, "float32")
        slots = np.repeat(np.arange(k, dtype=np.float32), n) + 10 * r   # slot s holds 10r + s
        x = fw.to_device(slots, "float32")
        comm.reduce_scatter(x, x[r * n:(r + 1) * n])
        reduced = fw.to_host(x, "float32")[r * n:(r + 1) * n]
        want = np.float32(10 * k * (k - 1) // 2 + k * r)
        return (np.array_equal(gathered, np.repeat(np.arange(1, k + 1, dtype=np.float32), n)),
                bool((reduced == want).all()))
    assert run_ranks(nranks, body) == [(True, True)] * nranks


@pytest.mark.parametrize("channels", [1, 3, 64])
def test_any_channel_count_gives_the_exact_result(channels):
    # COLLECTX_CUDA_CHANNELS: every lane on that many blocks, each over its own share of the
    # message; capped where the blocks of all ranks would not fit the SMs at once (64 did not).
    def body(comm, fw):
        return [run_case(comm, fw, c, "int32", "sum", 300_007, 0, 3)
                for c in ("allreduce", "allgather", "reduce_scatter", "broadcast")]
    bad = [m for per_rank in run_ranks(3, body, channels=channels) for m in per_rank if m]
    assert bad == []


# ---- CUDA graphs --------------------------------------------------------------------------------
def test_a_captured_allreduce_replays_exactly_every_time():
    # Each replay is a new call to the kernels: they take the call's epoch and sequence number
    # from the device's counters, not from numbers fixed when the graph was captured.
    fw = _framework("torch")
    t = fw.t
    probe = t.ones(4, device="cuda")   # the kernels the ranks use, loaded before any collective
    bool((probe == 2.0).all())
    probe.fill_(3.0)
    # torch.cuda.graph synchronizes the device as it begins: no rank may be in a collective
    # (spinning for its peer) while another begins its capture.
    together = threading.Barrier(2)

    def body(comm, fw):
        x = t.full((1 << 20,), float(comm.rank + 1), device="cuda")
        comm.allreduce(x)               # planned outside the capture, as a warm-up
        comm.synchronize()
        together.wait()
        graph = t.cuda.CUDAGraph()
        with t.cuda.graph(graph, stream=t.cuda.current_stream(),
                          capture_error_mode="thread_local"):
            comm.allreduce(x)
        together.wait()
        wrong = 0
        for i in range(100):
            x.fill_(float(comm.rank + 1 + i))
            graph.replay()
            wrong += not bool((x == float(sum(r + 1 + i for r in range(comm.size)))).all())
        comm.synchronize()
        return wrong
    assert run_ranks(2, body, fw=fw, timeout=20) == [0, 0]


# ---- stream semantics -------------------------------------------------------------------------------
def test_async_work_orders_the_current_stream_without_a_host_wait():
    fw = _framework("torch") if _has("torch") else _framework()

    def body(comm, fw):
        x = fw.to_device(np.ones(1 << 20, np.float32), "float32")
        work = comm.allreduce(x, async_op=True)
        assert work.wait() is True                 # device-side ordering only
        y = x * 2                                  # queued after the collective on this stream
        work.synchronize()
        assert work.is_completed()
        comm.barrier()
        return float(fw.to_host(y, "float32")[0])
    assert run_ranks(2, body, fw=fw) == [4.0, 4.0]


def test_sync_call_returns_before_the_kernel_finishes_the_stream_orders_it():
    def body(comm, fw):
        x = fw.to_device(np.full(1 << 22, comm.rank, np.float32), "float32")
        for _ in range(8):
            comm.allreduce(x, op="max")
        comm.synchronize()
        return float(fw.to_host(x, "float32")[-1])
    assert run_ranks(4, body) == [3.0] * 4


# ---- failures ---------------------------------------------------------------------------------------
def test_mismatched_calls_raise_collective_mismatch():
    def body(comm, fw):
        x = fw.to_device(np.ones(100 + comm.rank, np.float32), "float32")
        comm.allreduce(x)
        with pytest.raises(CollectiveMismatch, match="different collectives"):
            comm.synchronize()
        with pytest.raises(CommError, match="unusable"):
            comm.allreduce(x)
        return True
    assert run_ranks(2, body) == [True, True]


# Rank 1 waits for the plan of a call rank 0 does not make (rank 0 runs another, whose plan it
# has): it reads rank 0's descriptor and posts its own, so both raise within the timeout.
def test_a_rank_waiting_for_a_plan_rank_0_never_makes_raises_collective_mismatch():
    def body(comm, fw):
        x = fw.to_device(np.ones(1000, np.float32), "float32")
        comm.allreduce(x)                   # the allreduce plan, shared
        comm.synchronize()
        with pytest.raises(CollectiveMismatch, match="different collectives"):
            if comm.rank == 0:
                comm.allreduce(x)
            else:
                comm.allgather(x)           # a new plan, which rank 0 never publishes
            comm.synchronize()
        return True
    assert run_ranks(2, body, timeout=20) == [True, True]


# A rank that returns early must not unmap its window while a peer still reads it: windows of
# ranks in one process are held until every rank closes (before that fix the waiting kernel
# faulted with cudaErrorIllegalAddress instead of reporting Timeout).
def test_a_missing_rank_turns_into_timeout_not_a_hang():
    def body(comm, fw):
        if comm.rank == 1:
            return True
        x = fw.to_device(np.ones(64, np.float32), "float32")
        comm.allreduce(x)
        with pytest.raises(Timeout, match="no progress"):
            comm.synchronize()
        return True
    assert run_ranks(2, body, timeout=2) == [True, True]


# ---- ranks as processes (CUDA IPC) -----------------------------------------------------------------
def ipc_worker(n: int) -> list[float]:
    import cupy as cp
    comm = collectx.init(device="cuda:0")
    with cp.cuda.Stream(non_blocking=True):
        x = cp.full(n, comm.rank + 1, dtype=cp.float32)
        comm.allreduce(x)
        g = comm.allgather(x[:4])
        comm.synchronize()
        out = [float(x[0]), float(x[-1])] + cp.asnumpy(g).tolist()
    comm.close()
    return out


def test_ranks_as_processes_share_one_gpu_through_ipc():
    needs.module("cupy")
    got = collectx.launch(ipc_worker, 2, args=(1 << 20,), timeout=240)
    assert got == [[3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]] * 2


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False
