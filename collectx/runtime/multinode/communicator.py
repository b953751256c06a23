"""The hierarchical communicator: shared memory inside a host, an engine between hosts.

Same API as :class:`~collectx.runtime.Communicator`. With ``H`` hosts of ``L`` consecutive ranks
each (rank = host * L + local), the stages are (the runtime twin of
:mod:`collectx.planner.hierarchical`):

* allreduce: intra-host reduce_scatter -> allreduce of each shard along its rail (the ranks with
  the same local index on every host) -> intra-host allgather;
* reduce_scatter: blocks regrouped by local index -> intra-host reduce_scatter -> engine
  reduce_scatter along the rail;
* allgather: engine allgather along the rail -> intra-host allgather -> blocks to rank order;
* broadcast: engine broadcast along the root's rail -> intra-host broadcast.

Hosts of different sizes or interleaved ranks take simpler paths (reduce to a host leader,
engine among leaders, broadcast back; or the engine over all ranks). alltoall uses the engine.
Intra-host failures raise what the CPU communicator raises (PeerFailure, Timeout); engine
failures raise EngineError.
"""

from __future__ import annotations

import shutil
import socket

import numpy as np

from ...config import get_config
from ...errors import ArgumentError, DTypeError
from ..arrays import DTYPE_CODES, as_array, check_rank, empty_like_shape, op_code
from ..bootstrap import rendezvous_dir
from ..communicator import Communicator
from ..store import FileStore
from ..work import Worker
from .engines import InterEngine
from .hosts import HostLayout, discover


class HierarchicalCommunicator:
    """Collectives over hosts: a CPU :class:`Communicator` per host plus an inter-host engine.

    Parameters
    ----------
    engine : InterEngine
        The world's engine (see :func:`~.engines.default_engine`); it also bootstraps.
    hosts : str, optional
        ``COLLECTX_HOSTS``-style pseudo-hosts ("2,2"); default the config's, else host names.
    timeout : float, optional
        Seconds before an intra-host collective raises Timeout (default COLLECTX_TIMEOUT).
    """

    def __init__(self, engine: InterEngine, *, hosts: str | None = None,
                 timeout: float | None = None, config=None):
        cfg = config or get_config()
        self.engine = engine
        self.rank, self.size = engine.rank, engine.size
        self.layout: HostLayout = discover(engine, hosts if hosts is not None else cfg.hosts)
        self.local = _host_communicator(engine, self.layout, timeout, cfg)
        lay = self.layout
        self.regular = lay.regular and len(lay.hosts) > 1
        # Every rank joins every split in the same order (split is collective).
        self.rail = engine.split(lay.rail()) if self.regular else None
        leaders = tuple(h[0] for h in lay.hosts)
        self.leaders = engine.split(leaders if lay.local_rank == 0 else (self.rank,))
        self._worker: Worker | None = None
        self._scratch: dict[str, np.ndarray] = {}

    # -- collectives ------------------------------------------------------------------------------
    def allreduce(self, x, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` over all ranks; result in ``out`` (default: in place in ``x``)."""
        return self._run(lambda: self._allreduce(x, x if out is None else out, op), async_op)

    def reduce_scatter(self, x, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` (``size * n`` elements) and leave block ``rank`` (``n``) in ``out``."""
        return self._run(lambda: self._reduce_scatter(x, out, op), async_op)

    def allgather(self, x, out=None, async_op: bool = False):
        """Gather every rank's ``x`` into ``out`` (``size * len(x)``, rank-major)."""
        return self._run(lambda: self._allgather(x, out), async_op)

    def broadcast(self, x, root: int = 0, async_op: bool = False):
        """Copy root's ``x`` into every rank's ``x`` (in place)."""
        return self._run(lambda: self._broadcast(x, root), async_op)

    def reduce(self, x, root: int = 0, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` onto ``root``: into ``out`` there (default: in place in ``x``)."""
        def go():
            r = self._check_root(root)
            src, _ = as_array(x, "x")
            tmp = src.copy()
            self._allreduce(tmp, tmp, op)
            if self.rank != r:
                return None
            res = x if out is None else out
            as_array(res, "out", writable=True)[0][...] = tmp
            return res
        return self._run(go, async_op)

    def alltoall(self, x, out=None, async_op: bool = False):
        """Block ``j`` of rank ``i``'s ``x`` lands in block ``i`` of rank ``j``'s ``out``."""
        def go():
            src, dt = self._input(x)
            if src.size % self.size:
                raise ArgumentError(f"alltoall input has {src.size} elements; expected a "
                                    f"multiple of the world size {self.size}")
            res = empty_like_shape(x, src.size, src, dt) if out is None else out
            self.engine.alltoall(src, self._output(res, src.size, src.dtype))
            return res
        return self._run(go, async_op)

    def barrier(self, async_op: bool = False):
        """Return once every rank of every host has entered the barrier."""
        def go():
            self.local.barrier()
            self.engine.barrier()
        return self._run(go, async_op)

    # -- stages -----------------------------------------------------------------------------------
    def _allreduce(self, x, res, op):
        src, dt = self._input(x)
        dst = self._output(res, src.size, src.dtype)
        inner = self._inner_op(op, dt)
        L = self.layout.local_size
        if not np.shares_memory(src, dst):
            dst[...] = src
        if src.size == 0:
            return res
        if self.regular:
            m = -(-dst.size // L) * L        # pad to whole shards; pads never reach the result
            work = dst if m == dst.size else self._buffer("pad", m, dst.dtype)
            if work is not dst:
                work[:dst.size] = dst
                work[dst.size:] = 0
            shard = self._buffer("shard", m // L, dst.dtype)
            self.local.reduce_scatter(work, out=shard, op=inner)
            self.rail.allreduce(shard, inner)
            self.local.allgather(shard, out=work)
            if work is not dst:
                dst[...] = work[:dst.size]
        else:
            self.local.reduce(dst, root=0, op=inner)
            if self.layout.local_rank == 0:
                self.leaders.allreduce(dst, inner)
            self.local.broadcast(dst, root=0)
        if op == "avg":
            dst /= self.size
        return res

    def _reduce_scatter(self, x, out, op):
        src, dt = self._input(x)
        if src.size % self.size:
            raise ArgumentError(f"reduce_scatter input has {src.size} elements; expected a "
                                f"multiple of the world size {self.size}")
        n = src.size // self.size
        res = empty_like_shape(x, n, src, dt) if out is None else out
        dst = self._output(res, n, src.dtype)
        inner = self._inner_op(op, dt)
        if n and self.regular:
            H, L = len(self.layout.hosts), self.layout.local_size
            by_local = src.reshape(H, L, n).transpose(1, 0, 2).reshape(-1)  # [local][host]
            part = self._buffer("part", H * n, src.dtype)
            self.local.reduce_scatter(np.ascontiguousarray(by_local), out=part, op=inner)
            self.rail.reduce_scatter(part, dst, inner)
        elif n:
            self.engine.reduce_scatter(np.ascontiguousarray(src), dst, inner)
        if op == "avg" and n:
            dst /= self.size
        return res

    def _allgather(self, x, out):
        src, dt = self._input(x)
        n = src.size
        res = empty_like_shape(x, n * self.size, src, dt) if out is None else out
        dst = self._output(res, n * self.size, src.dtype)
        if n and self.regular:
            H, L = len(self.layout.hosts), self.layout.local_size
            part = self._buffer("part", H * n, src.dtype)
            self.rail.allgather(np.ascontiguousarray(src), part)
            tmp = self._buffer("gathered", L * H * n, src.dtype)
            self.local.allgather(part, out=tmp)
            dst.reshape(H, L, n)[...] = tmp.reshape(L, H, n).transpose(1, 0, 2)
        elif n:
            self.engine.allgather(np.ascontiguousarray(src), dst)
        return res

    def _broadcast(self, x, root):
        root = self._check_root(root)
        buf, dt = as_array(x, "x", writable=True)
        self._check_dtype(dt)
        if buf.size and self.regular:
            host, local = divmod(root, self.layout.local_size)
            if self.layout.local_rank == local:
                self.rail.broadcast(buf, host)
            self.local.broadcast(buf, root=local)
        elif buf.size:
            self.engine.broadcast(buf, root)
        return x

    # -- plumbing ---------------------------------------------------------------------------------
    def _run(self, fn, async_op: bool):
        if async_op:
            if self._worker is None:
                self._worker = Worker(f"collectx-hier-rank{self.rank}")
            return self._worker.submit(fn)
        if self._worker is not None and self._worker.busy:
            self._worker.drain()
        return fn()

    def _buffer(self, slot: str, n: int, dtype) -> np.ndarray:
        """A staging array reused call after call (fresh pages would fault in every call);
        calls run one at a time (async ones in order on one worker), so a slot is never shared.
        """
        buf = self._scratch.get(slot)
        if buf is None or buf.dtype != dtype or buf.size < n:
            buf = self._scratch[slot] = np.zeros(max(n, 1), dtype)
        return buf[:n]

    def _input(self, x):
        arr, dt = as_array(x, "x")
        self._check_dtype(dt)
        return arr, dt

    def _output(self, out, n: int, dtype):
        arr, _ = as_array(out, "out", writable=True)
        if arr.dtype != dtype:
            raise DTypeError(f"out has dtype {arr.dtype}, input {dtype}; expected the same")
        if arr.size != n:
            raise ArgumentError(f"out has {arr.size} elements; expected {n}")
        return arr

    def _check_dtype(self, dt: int) -> None:
        if dt == DTYPE_CODES["bfloat16"] and self.engine.name == "mpi":
            raise DTypeError("bfloat16 with the MPI engine: MPI has no bfloat16; use a "
                             "torch.distributed group (collectx.multinode.init(group=...))")

    def _inner_op(self, op: str, dt: int) -> str:
        op_code(op)
        if op == "avg" and dt not in (DTYPE_CODES["float16"], DTYPE_CODES["float32"],
                                      DTYPE_CODES["float64"]):
            raise DTypeError("op='avg' needs a floating dtype; use 'sum' and divide")
        return "sum" if op == "avg" else op     # divide once, after every stage

    def _check_root(self, root) -> int:
        return check_rank(root, self.size)

    def close(self) -> None:
        """Finish queued work, unmap the host's windows, release the engine's sub-groups."""
        if self._worker is not None:
            self._worker.drain()
            self._worker.stop()
            self._worker = None
        self.local.close()
        for sub in (self.rail, self.leaders):
            if sub is not None and sub is not self.engine:
                sub.close()

    def __enter__(self) -> "HierarchicalCommunicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        lay = self.layout
        return (f"HierarchicalCommunicator(rank={self.rank}, size={self.size}, host={lay.host}"
                f"/{len(lay.hosts)}, local_rank={lay.local_rank}, engine={self.engine.name})")


def _host_communicator(engine: InterEngine, layout: HostLayout, timeout, cfg) -> Communicator:
    """The host's CPU communicator; its rendezvous directory is made by the host's first rank
    and announced over the engine, so no other rendezvous service is needed."""
    path = rendezvous_dir("host") if layout.local_rank == 0 else None
    paths, names = zip(*engine.exchange((path, socket.gethostname())))
    # Pseudo-hosts (COLLECTX_HOSTS) may share one machine: its CPUs serve all of their ranks.
    machine = names.count(names[engine.rank])
    mine = paths[layout.hosts[layout.host][0]]
    # The directory outlives the rendezvous: the host's first rank shares plans through it.
    release = (lambda: shutil.rmtree(path, ignore_errors=True)) if path is not None else None
    try:
        comm = Communicator(layout.local_rank, layout.local_size, FileStore(mine),
                            timeout=timeout, config=cfg, machine_ranks=machine,
                            on_close=release)
        engine.barrier()          # every rank of every host has mapped its host's windows
    except BaseException:
        if release is not None:
            release()
        raise
    return comm
