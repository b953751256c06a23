"""The Communicator: NCCL / torch.distributed-style collectives among the ranks of one host.

>>> import numpy as np, collectx
>>> with collectx.init(0, 1) as comm:          # a world of one rank
...     x = np.arange(4, dtype=np.float32)
...     comm.allreduce(x) is x, x.tolist(), comm.allgather(x).shape
(True, [0.0, 1.0, 2.0, 3.0], (4,))
"""

from __future__ import annotations

import importlib
import weakref
from typing import Callable

import numpy as np

from ..config import get_config
from ..errors import ArgumentError, DTypeError
from .arrays import as_array, check_rank, check_world, empty_like_shape, op_code
from .arrays import DTYPE_CODES, OP_CODES
from .bootstrap import sweep_rendezvous, timeout_s
from .engine import Engine
from .heap import Heap
from .peer_use import DISJOINT, IN_AT_UNIT, OUT_AT_UNIT, OVERLAP, SAME
from .store import HashStore, Store, as_store, next_key_prefix
from .window import Window, sweep_stale
from .work import Worker

_HEAP_DTYPES = [np.dtype(n) for n in DTYPE_CODES if n != "bfloat16"]
_FAST_DTYPES = frozenset(_HEAP_DTYPES)
_OP_NAMES = {code: name for name, code in OP_CODES.items()}
# The compiled fast call of the last signature of: in-place allreduce, allreduce(x, out=),
# allgather(x, out=), reduce_scatter(x, out=), alltoall(x, out=), broadcast, reduce.
_FAST_SLOTS = ("_fast", "_fast_allreduce", "_fast_allgather", "_fast_reduce_scatter",
               "_fast_alltoall", "_fast_broadcast", "_fast_reduce")


def _heap_fix(window: Window) -> str:
    """What to do when a ``comm.empty`` array does not fit the window's heap."""
    if window.fitted_to_shm:
        return (f"the window was cut to {window.heap_bytes} bytes to fit /dev/shm; give the "
                f"machine more shared memory (e.g. docker run --shm-size=1g) or free arrays "
                f"from empty()")
    return "raise COLLECTX_WINDOW_BYTES or free arrays from empty()"


class Communicator:
    """``size`` ranks exchanging data through shared-memory windows and planned schedules.

    Collectives take numpy arrays, torch CPU tensors, or DLPack / buffer-protocol objects, all
    C-contiguous. Every rank must make the same calls in the same order (checked: ranks that
    disagree raise :class:`~collectx.errors.CollectiveMismatch`). ``async_op=True`` returns a
    :class:`~collectx.runtime.work.Work`; async calls run in order on a background thread.
    ``machine_ranks`` (default ``size``) counts the ranks of all communicators sharing this
    machine, as pseudo-hosts do; when they outnumber the CPUs, waits yield sooner.
    """

    def __init__(self, rank: int, size: int, store: Store, *, topology=None,
                 timeout: float | None = None, config=None, machine_ranks: int | None = None,
                 on_close: Callable[[], None] | None = None):
        cfg = config or get_config()
        rank, size = self.rank, self.size = check_world(rank, size)   # numpy's as ints
        self.timeout = timeout_s(timeout, cfg)
        sweep_stale()
        sweep_rendezvous()   # directories of rendezvous whose creator died before closing
        _warm_planner()
        store = as_store(store)
        prefix = next_key_prefix("comm", store, rank)
        self.store_prefix = prefix    # this communicator's keys in the store, unique to it
        self._window = Window(rank, size, store, prefix, cfg.window_bytes, self.timeout,
                              machine_ranks, cma=cfg.cma)
        self._engine = Engine(self._window, cfg, topology, self.timeout, store=store,
                              key_prefix=prefix)
        self._heap = Heap(self._window.heap_bytes, _heap_fix(self._window))
        self._worker: Worker | None = None
        self._drop_fast()
        self._finalizer = weakref.finalize(self, _release, self._window, on_close)

    # -- collectives --------------------------------------------------------------------------
    def allreduce(self, x, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` over all ranks; result in ``out`` (default: in place in ``x``)."""
        if not async_op:
            if out is None:
                if self._fast(x, None, op):  # same signature as the last in-place call
                    return x
                if type(x) is np.ndarray and op in OP_CODES:
                    return self._allreduce_in_place(x, op)
            elif self._fast_allreduce(x, out, op):  # same signature as the last call with out
                return out

        def prepare():
            src, dt = self._input(x)
            res = x if out is None else out
            dst = self._output(res, src.size, dt, "out")
            return ("allreduce", src, dst, src.size, dt, self._op(op), 0, res)
        return self._submit(prepare, async_op, None if out is None else "_fast_allreduce")

    def reduce_scatter(self, x, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` (``size * n`` elements) and leave block ``rank`` (``n``) in ``out``."""
        if not async_op and self._fast_reduce_scatter(x, out, op):
            return out

        def prepare():
            src, dt = self._input(x)
            if src.size % self.size:
                raise ArgumentError(f"reduce_scatter input has {src.size} elements; expected a "
                                    f"multiple of the world size {self.size}")
            n = src.size // self.size
            res = empty_like_shape(x, n, src, dt) if out is None else out
            return ("reduce_scatter", src, self._output(res, n, dt, "out"), n, dt,
                    self._op(op), 0, res)
        return self._submit(prepare, async_op, None if out is None else "_fast_reduce_scatter")

    def allgather(self, x, out=None, async_op: bool = False):
        """Gather every rank's ``x`` into ``out`` (``size * len(x)``, rank-major)."""
        if not async_op and self._fast_allgather(x, out, None):
            return out

        def prepare():
            src, dt = self._input(x)
            res = empty_like_shape(x, src.size * self.size, src, dt) if out is None else out
            return ("allgather", src, self._output(res, src.size * self.size, dt, "out"),
                    src.size, dt, 0, 0, res)
        return self._submit(prepare, async_op, None if out is None else "_fast_allgather")

    def alltoall(self, x, out=None, async_op: bool = False):
        """Block ``j`` of rank ``i``'s ``x`` lands in block ``i`` of rank ``j``'s ``out``."""
        if not async_op and self._fast_alltoall(x, out, None):
            return out

        def prepare():
            src, dt = self._input(x)
            if src.size % self.size:
                raise ArgumentError(f"alltoall input has {src.size} elements; expected a "
                                    f"multiple of the world size {self.size}")
            res = empty_like_shape(x, src.size, src, dt) if out is None else out
            return ("alltoall", src, self._output(res, src.size, dt, "out"),
                    src.size // self.size, dt, 0, 0, res)
        return self._submit(prepare, async_op, None if out is None else "_fast_alltoall")

    def broadcast(self, x, root: int = 0, async_op: bool = False):
        """Copy root's ``x`` into every rank's ``x`` (in place)."""
        if not async_op and self._fast_broadcast(x, None, None, root):
            return x

        def prepare():
            r = self._root(root)
            buf, dt = as_array(x, "x", writable=True)
            return ("broadcast", buf if self.rank == r else None, buf, buf.size, dt, 0, r, x)
        return self._submit(prepare, async_op, "_fast_broadcast")

    def reduce(self, x, root: int = 0, out=None, op: str = "sum", async_op: bool = False):
        """Reduce ``x`` onto ``root``: into ``out`` there (default: in place in ``x``)."""
        if not async_op and self._fast_reduce(x, out, op, root):
            return (x if out is None else out) if self.rank == root else None

        def prepare():
            r = self._root(root)
            src, dt = self._input(x)
            res = (x if out is None else out) if self.rank == r else None
            dst = None if res is None else self._output(res, src.size, dt, "out")
            return ("reduce", src, dst, src.size, dt, self._op(op), r, res)
        return self._submit(prepare, async_op, "_fast_reduce")

    def send(self, x, dst: int) -> None:
        """Send ``x`` to rank ``dst`` (returns once ``x`` may be reused)."""
        arr, _ = as_array(x, "x")
        dst = self._peer(dst, "dst")
        self._drain()
        self._engine.p2p(True, dst, arr)

    def recv(self, x, src: int):
        """Receive into ``x`` from rank ``src`` (sizes must match the send); returns ``x``."""
        arr, _ = as_array(x, "x", writable=True)
        src = self._peer(src, "src")
        self._drain()
        self._engine.p2p(False, src, arr)
        return x

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """An uninitialised array in this rank's shared window: collectives on it skip staging.

        Peers read (and for some schedules write) such arrays in place, so a collective with
        an ``empty`` array as input or output copies nothing between the user and the window.
        The memory returns to the window heap when the array is garbage collected.

        >>> import collectx
        >>> with collectx.init() as comm:
        ...     x = comm.empty((2, 3), "float32")
        ...     x[:] = 1
        ...     float(comm.allreduce(x).sum())
        6.0
        """
        dt = np.dtype(dtype)
        if dt not in _HEAP_DTYPES:
            names = ", ".join(map(str, _HEAP_DTYPES))
            raise DTypeError(f"empty(dtype={dt}): expected one of {names}")
        n = int(np.prod(shape, dtype=np.int64))
        off = self._heap.alloc(n * dt.itemsize)
        view = self._window.heap_view(off, n * dt.itemsize)
        arr = np.frombuffer(view, dtype=dt, count=n).reshape(shape)
        weakref.finalize(arr, self._heap.free, off)
        return arr

    def _heap_offset(self, arr) -> int:
        if arr is None:
            return -1
        off = arr.__array_interface__["data"][0] - self._window.heap_address
        return off if 0 <= off and off + arr.nbytes <= self._window.heap_bytes else -1

    def _peer(self, peer, what: str) -> int:
        return check_rank(peer, self.size, what, other_than=self.rank)

    def _drain(self) -> None:
        if self._worker is not None and self._worker.busy:
            self._worker.drain()

    def barrier(self, async_op: bool = False):
        """Return once every rank has entered the barrier."""
        return self._submit(lambda: ("barrier", None, None, 0, 1, 0, 0, None), async_op)

    # -- plumbing -------------------------------------------------------------------------------
    def _allreduce_in_place(self, x: np.ndarray, op_name: str):
        """allreduce(x) of a numpy array, synchronous and in place: the common small-message
        call, without the closures and the overlap test of the general path (about 2 us less).

        Once it ran, later calls of the same signature (dtype, size, op) go through a compiled
        fast call (Engine.fast_call) that skips all of this; the fast call declines (and
        this path runs again) for anything else.
        """
        try:
            src, dt = as_array(x, "x", writable=True)
        except (ArgumentError, DTypeError) as e:
            self._engine.abort_call(str(e))
            raise
        if self._worker is not None and self._worker.busy:
            self._worker.drain()
        heap = self._heap_offset(src) if self._heap.used else -1
        op = OP_CODES[op_name]
        self._engine.run("allreduce", src, src, src.size, dt, src.itemsize, op, 0, SAME, heap,
                         heap)
        self._arm("_fast", "allreduce", src, src, dt, op, 0, SAME)
        return x

    def _submit(self, prepare, async_op: bool, fast_slot: str | None = None):
        """Checks and runs (or queues) one collective. ``fast_slot``: the attribute that caches
        this method's compiled fast call, armed after a successful synchronous run of arrays
        outside the heap in a layout it can take (the fast call then declines other layouts
        and whatever else comes)."""
        try:
            coll, src, dst, count, dt, op, root, res = prepare()
        except (ArgumentError, DTypeError) as e:
            self._engine.abort_call(str(e))
            raise
        overlap = _overlap(src, dst)
        itemsize = (src if src is not None else dst).itemsize if count or src is not None else 1
        in_heap = out_heap = -1
        if self._heap.used:  # zero copy for arrays from empty() (see engine.input_heap)
            in_heap, out_heap = self._heap_offset(src), self._heap_offset(dst)

        def go():
            self._engine.run(coll, src, dst, count, dt, itemsize, op, root, overlap, in_heap,
                             out_heap)
            return res
        if async_op:
            self._drop_fast()  # queued work must run first: the checked path drains it
            if self._worker is None:
                self._worker = Worker(f"collectx-comm-rank{self.rank}")
            return self._worker.submit(go)
        self._drain()
        result = go()
        if fast_slot is not None and overlap != OVERLAP:
            self._arm(fast_slot, coll, src, dst, dt, op, root, overlap)
        return result

    def _arm(self, slot: str, coll: str, src, dst, dt: int, op: int, root: int,
             overlap: int) -> None:
        """Caches the fast call of the call that just ran (its signature and layout) in
        ``slot``."""
        x = dst if src is None else src   # the caller's x: a broadcast receiver's is the output
        if x.dtype in _FAST_DTYPES:  # not a bfloat16 view: its dtype object is the caller's
            op_name = None if coll in ("allgather", "alltoall", "broadcast") else _OP_NAMES[op]
            fast = self._engine.fast_call(coll, x, dt, op_name, op, overlap,
                                          _layout(src, dst, overlap), root)
            setattr(self, slot, fast or _decline)

    def _drop_fast(self) -> None:
        """Every method takes the checked path until its next successful synchronous call."""
        for slot in _FAST_SLOTS:
            setattr(self, slot, _decline)

    def _input(self, x):
        return as_array(x, "x")

    def _output(self, out, n: int, dt: int, what: str):
        arr, code = as_array(out, what, writable=True)
        if code != dt:
            raise DTypeError(f"{what} has dtype code {code}, input {dt}; expected the same dtype")
        if arr.size != n:
            raise ArgumentError(f"{what} has {arr.size} elements; expected {n}")
        return arr

    def _op(self, op: str) -> int:
        return op_code(op)

    def _root(self, root) -> int:
        return check_rank(root, self.size)

    def close(self) -> None:
        """Finish queued work and unmap the windows. Idempotent."""
        if self._worker is not None:
            self._worker.drain()
            self._worker.stop()
            self._worker = None
        self._drop_fast()
        self._engine.detach()
        self._finalizer()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size})"


def _decline(x, out, op, root=0) -> bool:
    """The fast call when there is none: always take the checked path."""
    return False


def _layout(src, dst, overlap: int) -> str:
    """The FastCall layout of a call the checked path ran with ``src``/``dst`` (None where the
    call has no input or output on this rank) sharing memory as ``overlap`` says.

    >>> x = np.zeros(4, np.float32)
    >>> _layout(x, x, SAME), _layout(None, x, DISJOINT), _layout(x[2:], x, _overlap(x[2:], x))
    ('same', 'out_only', 'in_at')
    """
    if src is None:
        return "out_only"
    if dst is None:
        return "in_only"
    if overlap >= OUT_AT_UNIT:
        return "out_at"
    if overlap >= IN_AT_UNIT:
        return "in_at"
    return "same" if overlap == SAME else "disjoint"


def _overlap(src, dst) -> int:
    """How ``src`` and ``dst`` (contiguous) share memory, as :mod:`.peer_use` codes it:
    DISJOINT (or a side missing), SAME, IN_AT_UNIT + u / OUT_AT_UNIT + u when one is the u-th
    of equal blocks of the other (NCCL's in-place allgather and reduce_scatter), else OVERLAP.

    >>> x = np.zeros(12, np.float32)
    >>> _overlap(x, x), _overlap(x[4:8], x) - IN_AT_UNIT, _overlap(x[:5], x[2:7])
    (1, 1, 2)
    """
    if src is None or dst is None:
        return DISJOINT
    if src is dst:
        return SAME
    if not np.may_share_memory(src, dst):
        return DISJOINT
    a, b = (v.__array_interface__["data"][0] for v in (src, dst))
    if a == b and src.nbytes == dst.nbytes:
        return SAME
    small, big, base = (src, dst, IN_AT_UNIT) if src.nbytes < dst.nbytes else \
        (dst, src, OUT_AT_UNIT)
    offset = (a - b) if small is src else (b - a)
    if small.nbytes and big.nbytes % small.nbytes == 0 and 0 <= offset < big.nbytes \
            and offset % small.nbytes == 0:
        return base + offset // small.nbytes
    return OVERLAP


def _warm_planner() -> None:
    """Import the planner now, before the rendezvous, so that its one-time cost (scipy: about a
    second, more on a busy machine) is paid at init, overlapping the other ranks' start-up,
    and not inside the first collective where peers would wait for it."""
    importlib.import_module("collectx.planner")


def _release(window: Window, on_close: Callable[[], None] | None) -> None:
    window.close()
    if on_close is not None:    # the rendezvous's cleanup: its store shared plans until now
        on_close()


def single_process_store() -> Store:
    """The store of a world of one rank."""
    return HashStore()
