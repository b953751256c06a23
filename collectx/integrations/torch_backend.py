"""collectx as a torch.distributed backend: a pure-Python ``ProcessGroup`` over a Communicator.

``import collectx.torch`` calls :func:`register`, after which
``torch.distributed.init_process_group("collectx")`` (torchrun's env://, ``file://``, ``tcp://``)
builds a :class:`CollectxProcessGroup`. Rendezvous goes through the store torch hands the creator,
so no extra ports or files are needed.

Each method translates torch's argument shapes (lists of tensors, split sizes, options objects)
into calls on the collectx Communicator, and runs them through a :class:`SerialRunner` so that
``async_op=True`` overlaps with Python and completion is reported through a torch Future.
"""

from __future__ import annotations

import datetime
import inspect

import torch.distributed as dist

from .. import errors
from .torch_collectives import Collectives
from .torch_p2p import StoreP2P
from .torch_work import SerialRunner

BACKEND_NAME = "collectx"


def _make_communicator(store, rank: int, size: int, timeout: datetime.timedelta | None,
                       device: str = "cpu"):
    """A collectx Communicator for ``device`` ("cpu" or "cuda:N"), rendezvousing through
    torch's ``store``."""
    import collectx
    kwargs = {"store": store}
    params = inspect.signature(collectx.init).parameters
    if _explicit_timeout(timeout) and "timeout" in params:
        kwargs["timeout"] = timeout.total_seconds()
    if device != "cpu":
        if not collectx.cuda_available() or "device" not in params:
            raise errors.NativeUnavailable(
                f"a {device} tensor reached the collectx backend, but this collectx build has no "
                f"CUDA communicator; expected cpu tensors. Build collectx with CUDA "
                f"(COLLECTX_CUDA=ON and nvcc), or use 'cpu:collectx,cuda:nccl' as the backend")
        kwargs["device"] = device
    return collectx.init(rank, size, **kwargs)


def _explicit_timeout(timeout) -> bool:
    """Whether the user chose ``timeout``: torch passes its 30-minute default otherwise.

    With torch's default, ``COLLECTX_TIMEOUT`` (5 minutes unless set) decides how long a
    collective may wait for a dead or diverged peer, so failures surface in minutes, not half an
    hour.
    """
    if timeout is None or timeout.total_seconds() <= 0:
        return False
    try:
        from torch.distributed.constants import default_pg_timeout
    except ImportError:     # moved or renamed in some release: treat every value as chosen
        return True
    return timeout != default_pg_timeout


class CollectxProcessGroup(Collectives, dist.ProcessGroup):
    """A torch ``ProcessGroup`` whose collectives run on collectx.

    Parameters
    ----------
    store : torch.distributed.Store
        The group's store, as handed to the backend creator (a ``PrefixStore`` per group).
    rank, size : int
        This process's rank in the group and the group size.
    timeout : datetime.timedelta, optional
        Collective timeout; forwarded to the communicator when it accepts one.

    Notes
    -----
    Collectives run in call order on one background thread per group; a blocking call that finds
    nothing queued runs inline. CUDA tensors use a second communicator created on the first CUDA
    collective (every rank must reach it, as with any collective).
    """

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta | None = None):
        dist.ProcessGroup.__init__(self, rank, size)
        self._store = store
        self._timeout = timeout
        self._comms = {"cpu": _make_communicator(store, rank, size, timeout)}
        self._runner = SerialRunner(f"{BACKEND_NAME}:{rank}/{size}")
        self._store_p2p: StoreP2P | None = None

    def getBackendName(self) -> str:  # noqa: N802 -- torch's name
        return BACKEND_NAME

    # A C++ ProcessGroup keeps its name in its backends; a Python one has none, so torch 2.13+
    # asks these (trampoline) methods instead. Functional collectives, FSDP2 and DTensor look the
    # group up by this name.
    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return getattr(self, "_group_desc", "")

    @property
    def group_rank(self) -> int:
        return dist.ProcessGroup.rank(self)

    @property
    def group_size(self) -> int:
        return dist.ProcessGroup.size(self)

    def communicator(self, device: str = "cpu"):
        """The collectx Communicator behind this group for ``device`` (to call it directly)."""
        return self._comm(device)

    def _comm(self, device: str):
        if device not in self._comms:
            # Created on first use: the store prefix keeps its keys apart from the cpu one's.
            store = dist.PrefixStore(f"{device}/", self._store)
            self._comms[device] = _make_communicator(store, self.group_rank, self.group_size,
                                                     self._timeout, device)
        return self._comms[device]

    def _p2p(self, device: str):
        """The send/recv channel: buffered messages through the group's store.

        The Communicator's native send blocks once about 1 MiB is in flight to a peer, and this
        group runs its calls one at a time, so the common symmetric exchange (both ranks isend,
        then irecv, as ``batch_isend_irecv`` does) would deadlock on large tensors. The store
        channel never blocks a send, which is what torch's isend semantics promise.
        """
        if device != "cpu":
            raise errors.ArgumentError(f"send/recv of {device} tensors is not supported by the "
                                       f"collectx backend; expected cpu tensors")
        if self._store_p2p is None:
            seconds = getattr(self._comm(device), "timeout", None) or 300.0
            # under the CPU communicator's prefix: a group torch builds again over the same
            # store must not receive a message the last one sent and never received
            self._store_p2p = StoreP2P(self._store, self.group_rank, seconds,
                                       self._comms["cpu"].store_prefix)
        return self._store_p2p

    def _submit(self, run, outputs, opts):
        return self._runner.submit(run, outputs, bool(getattr(opts, "asyncOp", True)))

    def shutdown(self) -> None:
        """Finish queued work and release the communicators."""
        self._runner.close()
        for comm in self._comms.values():
            close = getattr(comm, "close", None)
            if close is not None:
                close()
        self._comms.clear()

    def abort(self) -> None:
        """Refuse new work at once. Communicators stay mapped: a collective may still be using
        them on the runner thread, and the process is expected to exit or rebuild the group."""
        self._runner.close(wait=False)


def create_process_group(store, rank: int, size: int, timeout=None) -> CollectxProcessGroup:
    """Backend creator for ``torch.distributed.Backend.register_backend``."""
    return CollectxProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Register the ``"collectx"`` backend with torch.distributed (idempotent).

    >>> import torch.distributed as dist
    >>> register()
    >>> dist.is_backend_available("collectx")
    True
    """
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    # devices must be a list: some 2.x releases iterate a plain string character by character.
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=["cpu", "cuda"])
