"""Inter-host engines: the existing libraries that carry the network stage of hierarchical
collectives (MPI through mpi4py, a torch.distributed process group, NCCL through CuPy).

One small interface, :class:`InterEngine`: in-place ``allreduce(buf, op)``, ``allgather``,
``reduce_scatter``, ``broadcast``, ``alltoall`` and ``barrier`` on flat, C-contiguous numpy
arrays (CUDA arrays for NCCL), plus bootstrap: ``rank``/``size``, ``exchange(obj)`` (every
rank's picklable object, rank order) and ``split(ranks)`` (an engine over a subset of ranks,
called by every rank with its own subset, the subsets partitioning the world). Failures of the
underlying library surface as :class:`~collectx.errors.EngineError`.

>>> e = LoopbackEngine()
>>> x = np.arange(3.0); e.allreduce(x, "sum"); x.tolist()
[0.0, 1.0, 2.0]
>>> e.exchange("hello")
['hello']
"""

from __future__ import annotations

import abc
import contextlib

import numpy as np

from ...errors import ArgumentError, DTypeError, EngineError

OPS = ("sum", "prod", "min", "max", "avg")


class InterEngine(abc.ABC):
    """A collective library spanning hosts. ``rank``/``size`` are this engine's own."""

    name = "engine"
    rank: int = 0
    size: int = 1

    @abc.abstractmethod
    def allreduce(self, buf: np.ndarray, op: str) -> None:
        """Reduce ``buf`` over all ranks, in place."""

    @abc.abstractmethod
    def allgather(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst`` (``size * len(src)``) gets every rank's ``src``, rank-major."""

    @abc.abstractmethod
    def reduce_scatter(self, src: np.ndarray, dst: np.ndarray, op: str) -> None:
        """``dst`` gets block ``rank`` of the reduction of every rank's ``src``."""

    @abc.abstractmethod
    def broadcast(self, buf: np.ndarray, root: int) -> None:
        """Copy root's ``buf`` to every rank's ``buf``."""

    @abc.abstractmethod
    def alltoall(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Block ``j`` of this rank's ``src`` lands in block ``rank`` of rank ``j``'s ``dst``."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has entered."""

    @abc.abstractmethod
    def exchange(self, obj) -> list:
        """Every rank's picklable ``obj``, in rank order (the bootstrap's key-value exchange)."""

    @abc.abstractmethod
    def split(self, ranks: tuple[int, ...]) -> "InterEngine":
        """An engine over ``ranks`` (world ranks, this rank included); collective."""

    def close(self) -> None:
        """Release what the engine created (never the user's own communicator)."""


class LoopbackEngine(InterEngine):
    """A world of one rank: every collective is a local copy (tests, single hosts)."""

    name = "loopback"

    def allreduce(self, buf, op):
        _check_op(op)

    def allgather(self, src, dst):
        dst[...] = src

    def reduce_scatter(self, src, dst, op):
        _check_op(op)
        dst[...] = src

    def broadcast(self, buf, root):
        pass

    def alltoall(self, src, dst):
        dst[...] = src

    def barrier(self):
        pass

    def exchange(self, obj):
        return [obj]

    def split(self, ranks):
        return self


class MPIEngine(InterEngine):
    """MPI through mpi4py: host buffers (device buffers too where MPI is CUDA-aware).

    MPI has no average: ``avg`` runs ``SUM`` and divides (floating dtypes only).
    """

    name = "mpi"

    def __init__(self, comm=None):
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise EngineError("the MPI engine needs mpi4py; install mpi4py or pass a "
                              "torch.distributed process group") from e
        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._owned = comm is not None and comm is not MPI.COMM_WORLD

    def _op(self, op: str):
        _check_op(op)
        M = self._MPI
        return {"sum": M.SUM, "avg": M.SUM, "prod": M.PROD, "min": M.MIN, "max": M.MAX}[op]

    def allreduce(self, buf, op):
        if buf.size == 0:
            return
        with _failures(self.name, "allreduce"), _reducible(buf) as work:
            self.comm.Allreduce(self._MPI.IN_PLACE, work, op=self._op(op))
        _finish_avg(buf, op, self.size)

    def allgather(self, src, dst):
        if src.size:
            with _failures(self.name, "allgather"):
                self.comm.Allgather(_raw(src), _raw(dst))

    def reduce_scatter(self, src, dst, op):
        if dst.size == 0:
            return
        with _failures(self.name, "reduce_scatter"), _reducible(src) as a, \
                _reducible(dst) as b:
            self.comm.Reduce_scatter_block(a, b, op=self._op(op))
        _finish_avg(dst, op, self.size)

    def broadcast(self, buf, root):
        if buf.size:
            with _failures(self.name, "broadcast"):
                self.comm.Bcast(_raw(buf), root=root)

    def alltoall(self, src, dst):
        if src.size:
            with _failures(self.name, "alltoall"):
                self.comm.Alltoall(_raw(src), _raw(dst))

    def barrier(self):
        with _failures(self.name, "barrier"):
            self.comm.Barrier()

    def exchange(self, obj):
        with _failures(self.name, "exchange"):
            return self.comm.allgather(obj)

    def split(self, ranks):
        color = min(ranks)   # the subsets partition the world: their smallest rank names them
        with _failures(self.name, "split"):
            sub = self.comm.Split(color, sorted(ranks).index(self.rank))
        return MPIEngine(sub)

    def close(self):
        if self._owned:
            with contextlib.suppress(Exception):
                self.comm.Free()


class TorchEngine(InterEngine):
    """A torch.distributed process group the caller passes in (gloo on CPU, NCCL on GPU)."""

    name = "torch"

    def __init__(self, group=None, *, _owned: bool = False):
        import torch
        import torch.distributed as dist
        if not dist.is_initialized():
            raise EngineError("torch.distributed is not initialized; call "
                              "init_process_group (gloo or nccl) before collectx")
        self._torch, self._dist, self.group, self._owned = torch, dist, group, _owned
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def _t(self, arr):
        if arr.dtype == np.uint16:
            raise DTypeError("the torch engine got a bfloat16 array as raw uint16 storage; "
                             "pass torch tensors for bfloat16")
        return self._torch.from_numpy(arr)

    def _op(self, op: str):
        _check_op(op)
        R = self._dist.ReduceOp
        return {"sum": R.SUM, "avg": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX}[op]

    def allreduce(self, buf, op):
        with _failures(self.name, "allreduce"):
            self._dist.all_reduce(self._t(buf), op=self._op(op), group=self.group)
        _finish_avg(buf, op, self.size)

    def allgather(self, src, dst):
        with _failures(self.name, "allgather"):
            parts = list(self._t(dst).chunk(self.size))
            self._dist.all_gather(parts, self._t(src), group=self.group)

    def reduce_scatter(self, src, dst, op):
        # gloo has no reduce_scatter: reduce everything, keep this rank's block.
        tmp = np.array(src, copy=True)
        self.allreduce(tmp, "sum" if op == "avg" else op)
        n = dst.size
        dst[...] = tmp[self.rank * n:(self.rank + 1) * n]
        _finish_avg(dst, op, self.size)

    def broadcast(self, buf, root):
        with _failures(self.name, "broadcast"):
            src = self._dist.get_global_rank(self.group, root) if self.group else root
            self._dist.broadcast(self._t(buf), src=src, group=self.group)

    def alltoall(self, src, dst):
        with _failures(self.name, "alltoall"):
            self._dist.all_to_all_single(self._t(dst), self._t(src), group=self.group)

    def barrier(self):
        with _failures(self.name, "barrier"):
            self._dist.barrier(group=self.group)

    def exchange(self, obj):
        out = [None] * self.size
        with _failures(self.name, "exchange"):
            self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def split(self, ranks):
        # new_group is collective over the whole parent: every subset is created everywhere.
        subsets = sorted({tuple(sorted(r)) for r in self.exchange(tuple(sorted(ranks)))})
        mine = None
        with _failures(self.name, "split"):
            for sub in subsets:
                glob = [self._global(r) for r in sub]
                g = self._dist.new_group(glob)
                if self.rank in sub:
                    mine = g
        return TorchEngine(mine, _owned=True)

    def _global(self, r: int) -> int:
        return self._dist.get_global_rank(self.group, r) if self.group else r

    def close(self):
        if self._owned and self.group is not None:
            with contextlib.suppress(Exception):
                self._dist.destroy_process_group(self.group)


class NCCLEngine(InterEngine):
    """NCCL through ``cupy.cuda.nccl`` on CuPy device arrays; bootstraps over ``parent``.

    Needs CuPy with NCCL and a GPU (not testable on CPU-only machines: construction raises
    :class:`EngineError` there). ``parent`` (any engine) exchanges the NCCL unique id.
    """

    name = "nccl"

    def __init__(self, parent: InterEngine):
        try:
            from cupy.cuda import nccl
        except ImportError as e:
            raise EngineError("the NCCL engine needs CuPy built with NCCL (cupy.cuda.nccl); "
                              "use the MPI or torch engine instead") from e
        self._nccl, self.parent = nccl, parent
        self.rank, self.size = parent.rank, parent.size
        uid = parent.exchange(nccl.get_unique_id() if parent.rank == 0 else None)[0]
        with _failures(self.name, "init"):
            self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)

    def _args(self, arr):
        import cupy
        n = self._nccl
        kinds = {"float16": n.NCCL_FLOAT16, "float32": n.NCCL_FLOAT32,
                 "float64": n.NCCL_FLOAT64, "int32": n.NCCL_INT32, "int64": n.NCCL_INT64,
                 "int8": n.NCCL_INT8, "uint8": n.NCCL_UINT8}
        if arr.dtype.name not in kinds:
            raise DTypeError(f"NCCL engine: dtype {arr.dtype}; expected one of {list(kinds)}")
        return arr.data.ptr, kinds[arr.dtype.name], cupy.cuda.get_current_stream().ptr

    def _op(self, op):
        _check_op(op)
        n = self._nccl
        return {"sum": n.NCCL_SUM, "avg": n.NCCL_SUM, "prod": n.NCCL_PROD, "min": n.NCCL_MIN,
                "max": n.NCCL_MAX}[op]

    def allreduce(self, buf, op):
        ptr, dt, stream = self._args(buf)
        with _failures(self.name, "allreduce"):
            self.comm.allReduce(ptr, ptr, buf.size, dt, self._op(op), stream)
        _finish_avg(buf, op, self.size)

    def allgather(self, src, dst):
        ptr, dt, stream = self._args(src)
        with _failures(self.name, "allgather"):
            self.comm.allGather(ptr, dst.data.ptr, src.size, dt, stream)

    def reduce_scatter(self, src, dst, op):
        ptr, dt, stream = self._args(src)
        with _failures(self.name, "reduce_scatter"):
            self.comm.reduceScatter(ptr, dst.data.ptr, dst.size, dt, self._op(op), stream)
        _finish_avg(dst, op, self.size)

    def broadcast(self, buf, root):
        ptr, dt, stream = self._args(buf)
        with _failures(self.name, "broadcast"):
            self.comm.bcast(ptr, buf.size, dt, root, stream)

    def alltoall(self, src, dst):
        raise EngineError("the NCCL engine has no alltoall here; use the MPI or torch engine")

    def barrier(self):
        self.parent.barrier()

    def exchange(self, obj):
        return self.parent.exchange(obj)

    def split(self, ranks):
        return NCCLEngine(self.parent.split(ranks))


def default_engine(group=None) -> InterEngine:
    """The engine the launcher provides: ``group`` (a torch ProcessGroup) if given, else an
    initialized torch.distributed default group, else MPI under mpirun/srun, else loopback.

    Examples
    --------
    >>> default_engine().name in ("loopback", "mpi", "torch")
    True
    """
    from ..bootstrap import detect
    if group is not None:
        return TorchEngine(group)
    with contextlib.suppress(ImportError):
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return TorchEngine()
    if detect() == "mpi":
        return MPIEngine()
    return LoopbackEngine()


# -- helpers ---------------------------------------------------------------------------------------
def _check_op(op: str) -> None:
    if op not in OPS:
        raise ArgumentError(f"op={op!r}: expected one of {', '.join(OPS)}")


def _finish_avg(buf, op: str, size: int) -> None:
    if op != "avg":
        return
    if buf.dtype.kind != "f":
        raise DTypeError(f"op='avg' on {buf.dtype}: expected a floating dtype")
    buf /= size


def _raw(arr: np.ndarray) -> np.ndarray:
    """Bytes of ``arr``: data movement needs no MPI datatype (float16, bfloat16 included)."""
    return arr.view(np.uint8)


@contextlib.contextmanager
def _reducible(arr: np.ndarray):
    """``arr`` itself, or for float16 (no MPI type) a float32 copy written back afterwards."""
    if arr.dtype == np.uint16:   # how collectx views bfloat16 storage
        raise DTypeError("MPI has no bfloat16 reductions; use the torch engine for bfloat16")
    if arr.dtype != np.float16:
        yield arr
        return
    wide = arr.astype(np.float32)
    yield wide
    arr[...] = wide


@contextlib.contextmanager
def _failures(engine: str, what: str):
    """Library errors (a dead peer's closed socket, an MPI error class) as EngineError."""
    try:
        yield
    except (ArgumentError, DTypeError, EngineError):
        raise
    except (RuntimeError, OSError, ValueError) as e:
        raise EngineError(f"{engine} engine: {what} failed: {e}; a peer host or rank has "
                          "probably died or left (check the other ranks' logs)") from e
    except Exception as e:   # mpi4py raises MPI.Exception, not a RuntimeError
        if type(e).__module__.startswith("mpi4py"):
            raise EngineError(f"{engine} engine: {what} failed: {e}") from e
        raise

