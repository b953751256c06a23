"""The CUDA communicator: the CPU Communicator's collectives on device buffers, stream-ordered.

Semantics, NCCL style: a collective is queued on the caller's current stream (torch's current
stream for tensors, the CUDA Array Interface ``stream`` for CuPy arrays) and returns without a
host sync; the result is ready for any later work on that stream. ``async_op=True`` returns a
:class:`CudaWork` whose ``wait()`` makes the caller's current stream wait for the collective (no
host block) and whose ``is_completed()`` asks the event. Failures found by the kernel (timeout,
mismatch, an aborted peer) are raised by the next call, ``Work.wait`` / ``synchronize``, or
:meth:`CudaCommunicator.synchronize`.
"""

from __future__ import annotations

import weakref
from typing import Callable

from ...config import get_config
from ...errors import ArgumentError, DTypeError
from ..arrays import check_rank, check_world, op_code
from ..bootstrap import timeout_s
from ..store import as_store, next_key_prefix
from . import _rt
from .arrays import DeviceBuffer, as_device_buffer, empty_like
from .engine import CudaEngine
from .window import CudaWindow
from .work import CudaWork, current_stream



class CudaCommunicator:
    """``size`` ranks (processes, or threads on their own streams) over CUDA IPC windows.

    Several ranks may share one GPU (the way a single-GPU machine tests multi-rank
    collectives); ``device`` defaults to ``rank % device_count()``.
    """

    def __init__(self, rank: int, size: int, store, *, device: int | None = None, topology=None,
                 timeout: float | None = None, config=None,
                 on_close: Callable[[], None] | None = None):
        cfg = config or get_config()
        rank, size = self.rank, self.size = check_world(rank, size)   # numpy's as ints
        ndev = require_gpu()
        self.device = rank % ndev if device is None else int(device)
        self.timeout = timeout_s(timeout, cfg)
        store = as_store(store)
        prefix = next_key_prefix("cuda", store, rank)
        _rt.set_device(self.device)
        _rt.preload_kernels()
        self._window = CudaWindow(rank, size, store, prefix, cfg.window_bytes,
                                  self.timeout, self.device)
        self._engine = CudaEngine(self._window, cfg, topology, self.timeout, store=store,
                                  key_prefix=prefix)
        self._stream = _rt.stream_create()
        # the rendezvous's cleanup, once closed or collected: its store shares plans until then
        self._on_close = weakref.finalize(self, on_close or _nothing)

    # -- collectives --------------------------------------------------------------------------
    def allreduce(self, x, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` over all ranks; result in ``out`` (default: in place in ``x``).

        Host arrays (numpy, CPU tensors) are staged through the GPU and the call blocks until
        the result is back: a convenience for small control values, not a fast path."""
        if _on_host(x):
            return self._host_allreduce(x, x if out is None else out, op)

        def prepare():
            src = self._input(x)
            res = x if out is None else out
            # In place, a tensor is parsed once (an array interface may be read-only: check it)
            dst = src if res is x and src.kind == "torch" else self._output(res, src.count, src,
                                                                            "out")
            return "allreduce", src, dst, src.count, self._op(op), 0, res
        return self._submit(prepare, x, async_op)

    def reduce_scatter(self, x, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` (``size * n`` elements) and leave block ``rank`` (``n``) in ``out``."""
        def prepare():
            src = self._input(x)
            n = self._blocks(src, "reduce_scatter")
            res = empty_like(x, n) if out is None else out
            return ("reduce_scatter", src, self._output(res, n, src, "out"), n, self._op(op), 0,
                    res)
        return self._submit(prepare, x, async_op)

    def allgather(self, x, out=None, async_op: bool = False):
        """Gather every rank's ``x`` into ``out`` (``size * len(x)``, rank-major)."""
        def prepare():
            src = self._input(x)
            n = src.count * self.size
            res = empty_like(x, n) if out is None else out
            return ("allgather", src, self._output(res, n, src, "out"), src.count, 0, 0, res)
        return self._submit(prepare, x, async_op)

    def alltoall(self, x, out=None, async_op: bool = False):
        """Block ``j`` of rank ``i``'s ``x`` lands in block ``i`` of rank ``j``'s ``out``."""
        def prepare():
            src = self._input(x)
            n = self._blocks(src, "alltoall")
            res = empty_like(x, src.count) if out is None else out
            return ("alltoall", src, self._output(res, src.count, src, "out"), n, 0, 0, res)
        return self._submit(prepare, x, async_op)

    def broadcast(self, x, root: int = 0, async_op: bool = False):
        """Copy root's ``x`` into every rank's ``x`` (in place)."""
        def prepare():
            r = self._root(root)
            buf = as_device_buffer(x, "x", writable=True)
            return ("broadcast", buf if self.rank == r else None, buf, buf.count, 0, r, x)
        return self._submit(prepare, x, async_op)

    def reduce(self, x, root: int = 0, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` onto ``root``: into ``out`` there (default: in place in ``x``)."""
        def prepare():
            r = self._root(root)
            src = self._input(x)
            res = (x if out is None else out) if self.rank == r else None
            dst = None if res is None else self._output(res, src.count, src, "out")
            return ("reduce", src, dst, src.count, self._op(op), r, res)
        return self._submit(prepare, x, async_op)

    def barrier(self, async_op: bool = False):
        """Every rank enters before any leaves; without ``async_op`` the host waits too."""
        work = self._submit(lambda: ("barrier", None, None, 0, 0, 0, None), None, True)
        return work if async_op else work.synchronize()

    def synchronize(self) -> None:
        """Block the host until every queued collective finished; raise the first failure."""
        self._engine.poll(block=True)

    # -- plumbing -------------------------------------------------------------------------------
    def _host_allreduce(self, x, out, op: str):
        from ..arrays import as_array
        src, code = as_array(x, "x")
        dst, out_code = as_array(out, "out", writable=True)
        if out_code != code or dst.size != src.size:
            raise ArgumentError(f"out is {dst.size} x code {out_code}, x is {src.size} x code "
                                f"{code}; expected the same length and dtype")
        nbytes, s = src.nbytes, self._stream
        dev = _rt.malloc(max(nbytes, 16))
        try:
            _rt.memcpy(dev, src.__array_interface__["data"][0], nbytes, s)
            buf = DeviceBuffer(dev, src.size, code, src.itemsize, s, self.device, "host")
            self._engine.run("allreduce", buf, buf, src.size, code, src.itemsize, self._op(op), 0,
                             True, s)
            _rt.memcpy(dst.__array_interface__["data"][0], dev, nbytes, s)
            _rt.stream_synchronize(s)
        finally:
            _rt.free(dev)
        self._engine.poll(block=True)
        return out

    def _submit(self, prepare, x, async_op: bool):
        stream = self._stream if x is None else None
        try:
            coll, src, dst, count, op, root, res = prepare()
            ref = src if src is not None else dst
            stream = self._stream if ref is None else ref.stream
            self._check_device(src, dst)
        except (ArgumentError, DTypeError):
            self._engine.abort_call(self._stream if stream is None else stream)
            raise
        dt = ref.code if ref is not None else 1
        itemsize = ref.itemsize if ref is not None else 1
        event = self._engine.run(coll, src, dst, count, dt, itemsize, op, root,
                                 _overlap(src, dst), stream)
        if not async_op:
            return res
        return CudaWork(event, self._engine, res, stream)

    def _input(self, x) -> DeviceBuffer:
        return as_device_buffer(x, "x")

    def _output(self, out, n: int, src: DeviceBuffer, what: str) -> DeviceBuffer:
        buf = as_device_buffer(out, what, writable=True)
        if buf.code != src.code:
            raise DTypeError(f"{what} has dtype code {buf.code}, input {src.code}; expected the "
                             f"same dtype")
        if buf.count != n:
            raise ArgumentError(f"{what} has {buf.count} elements; expected {n}")
        return buf

    def _blocks(self, src: DeviceBuffer, coll: str) -> int:
        if src.count % self.size:
            raise ArgumentError(f"{coll} input has {src.count} elements; expected a multiple of "
                                f"the world size {self.size}")
        return src.count // self.size

    def _check_device(self, *bufs) -> None:
        for b in bufs:
            if b is not None and b.device not in (-1, self.device):
                raise ArgumentError(f"buffer on GPU {b.device}, communicator on GPU "
                                    f"{self.device}; expected the communicator's device")

    def _op(self, op: str) -> int:
        return op_code(op)

    def _root(self, root) -> int:
        return check_rank(root, self.size)

    def close(self) -> None:
        """Wait for queued work, free plans and windows. Idempotent."""
        if self._stream:
            self._engine.close()
            _rt.stream_synchronize(self._stream)
            _rt.stream_destroy(self._stream)
            self._stream = 0
            self._window.close()
            self._on_close()

    def __enter__(self) -> "CudaCommunicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CudaCommunicator(rank={self.rank}, size={self.size}, device={self.device})"


def _nothing() -> None:
    pass


def require_gpu() -> int:
    """Number of visible GPUs; raises CudaUnavailable (with the reason) when there is none.

    >>> from collectx.errors import CudaUnavailable
    >>> try:
    ...     n = require_gpu()
    ... except CudaUnavailable as e:
    ...     n = 0
    >>> n >= 0
    True
    """
    from ...errors import CudaUnavailable
    n = _rt.device_count()
    if n < 1:
        probe = _rt.lib()[0].new("int*")
        _rt.lib()[1].cx_cuda_device_count(probe)
        raise CudaUnavailable(f"no CUDA device is visible ({_rt.last_error()}); expected an "
                              f"NVIDIA GPU and driver; use collectx.init() (CPU) or check "
                              f"nvidia-smi and CUDA_VISIBLE_DEVICES")
    return n


def _on_host(x) -> bool:
    """numpy arrays and CPU tensors (not device arrays)."""
    if type(x).__module__.startswith("torch"):
        return x.is_cpu
    return hasattr(x, "__array_interface__") and not hasattr(x, "__cuda_array_interface__")


def _overlap(src: DeviceBuffer | None, dst: DeviceBuffer | None) -> bool:
    if src is None or dst is None or not src.nbytes or not dst.nbytes:
        return False
    return src.ptr < dst.ptr + dst.nbytes and dst.ptr < src.ptr + src.nbytes


__all__ = ["CudaCommunicator", "require_gpu", "current_stream"]
