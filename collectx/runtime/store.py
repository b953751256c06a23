"""Rendezvous stores: a tiny key/value interface the ranks use to find each other's windows.

Three implementations, one interface (``set``, ``get``, ``wait``):

* :class:`HashStore` -- in one process (threads as ranks, tests);
* :class:`FileStore` -- a directory shared by the ranks of one host (the collectx launcher's
  rendezvous directory); values are written to a temporary file and renamed into place, so a
  reader sees a whole value or nothing;
* :class:`TorchStore` -- wraps a ``torch.distributed.Store`` (torchrun's TCPStore, a PrefixStore
  handed to a process-group backend).

>>> s = HashStore()
>>> s.set("a", b"1")
>>> s.get("a")
b'1'
"""

from __future__ import annotations

import abc
import os
import secrets
import threading
import time
from datetime import timedelta

from ..errors import ArgumentError, Timeout

DEFAULT_TIMEOUT_S = 300.0


class Store(abc.ABC):
    """Key/value rendezvous: ``set`` publishes, ``get`` waits for a key and returns its value."""

    @abc.abstractmethod
    def set(self, key: str, value: bytes | str) -> None:
        """Publish ``value`` under ``key`` (overwrites)."""

    @abc.abstractmethod
    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for it to appear."""

    def check(self, key: str) -> bool:
        """Whether ``key`` exists now (does not wait)."""
        try:
            self.get(key, 0.0)
        except Timeout:
            return False
        return True

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Wait until every key exists (raises :class:`~collectx.errors.Timeout`)."""
        deadline = time.monotonic() + _timeout(timeout)
        for key in keys:
            self.get(key, max(0.0, deadline - time.monotonic()))


def _timeout(timeout: float | None) -> float:
    return DEFAULT_TIMEOUT_S if timeout is None else float(timeout)


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _missing(key: str, timeout: float, where: str) -> Timeout:
    return Timeout(f"rendezvous key {key!r} did not appear in {where} within {timeout:.1f} s; "
                   f"expected every rank to start and reach init(); check that all ranks run "
                   f"and share the same rendezvous, or raise COLLECTX_TIMEOUT")


class HashStore(Store):
    """An in-process store (threads as ranks).

    >>> s = HashStore()
    >>> try:
    ...     s.wait(["x"], timeout=0.01)
    ... except TimeoutError as e:
    ...     print(type(e).__name__)
    Timeout
    """

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: bytes | str) -> None:
        with self._cond:
            self._data[key] = _as_bytes(value)
            self._cond.notify_all()

    def check(self, key: str) -> bool:
        with self._cond:
            return key in self._data

    def get(self, key: str, timeout: float | None = None) -> bytes:
        t = _timeout(timeout)
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._data, timeout=t):
                raise _missing(key, t, "a HashStore")
            return self._data[key]


class FileStore(Store):
    """A store in a directory: one file per key, written atomically (temp file + rename).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     FileStore(d).set("rank/0", "hello")
    ...     FileStore(d).get("rank/0")
    b'hello'
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise ArgumentError(f"FileStore directory {self.path!r} does not exist; expected "
                                f"the rendezvous directory shared by all ranks (COLLECTX_RDZV_DIR)")

    def _file(self, key: str) -> str:
        if not key or key.startswith(".") or "\0" in key:
            raise ArgumentError(f"store key {key!r}: expected a non-empty name not starting "
                                f"with '.'")
        return os.path.join(self.path, key.replace("/", "%"))

    def set(self, key: str, value: bytes | str) -> None:
        final = self._file(key)
        tmp = os.path.join(self.path, f".tmp-{os.getpid()}-{secrets.token_hex(4)}")
        with open(tmp, "wb") as f:
            f.write(_as_bytes(value))
        os.replace(tmp, final)

    def check(self, key: str) -> bool:
        return os.path.exists(self._file(key))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        t = _timeout(timeout)
        final = self._file(key)
        deadline = time.monotonic() + t
        pause = 0.0002
        while True:
            try:
                with open(final, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise _missing(key, t, f"FileStore {self.path!r}") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.02)


class TorchStore(Store):
    """Wraps a ``torch.distributed.Store`` (TCPStore, FileStore, PrefixStore)."""

    def __init__(self, store) -> None:
        self.store = store

    def set(self, key: str, value: bytes | str) -> None:
        self.store.set(key, _as_bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        t = _timeout(timeout)
        try:
            self.store.wait([key], timedelta(seconds=t))
        except RuntimeError as e:  # torch raises DistStoreError (a RuntimeError) on timeout
            raise _missing(key, t, "the torch.distributed store") from e
        return bytes(self.store.get(key))

    def check(self, key: str) -> bool:
        return bool(self.store.check([key]))


def as_store(store) -> Store:
    """A collectx :class:`Store` for ``store`` (already one, or a torch.distributed Store)."""
    if isinstance(store, Store):
        return store
    if all(hasattr(store, m) for m in ("set", "get", "wait")):
        return TorchStore(store)
    raise ArgumentError(f"store={store!r}: expected a collectx.runtime.Store or a "
                        f"torch.distributed.Store")


def next_key_prefix(kind: str, store: Store, rank: int) -> str:
    """The store key prefix of the next communicator ``rank`` creates on ``store``.

    Counted in the store itself, one counter per rank and kind, so every rank's k-th
    communicator on a store gets the same prefix whether ranks are processes or threads sharing
    it, and whichever object wraps it. A process group that torch builds again over the same
    store (``destroy_process_group``, then ``init_process_group``) so gets new keys, instead of
    reading the last group's: the names of segments unlinked long ago.

    >>> s = HashStore()
    >>> next_key_prefix("comm", s, 0), next_key_prefix("comm", s, 1), next_key_prefix("comm", s, 0)
    ('collectx/comm0', 'collectx/comm0', 'collectx/comm1')
    """
    key = f"collectx/made/{kind}/{rank}"
    made = int(store.get(key)) if store.check(key) else 0
    store.set(key, str(made + 1))
    return f"collectx/{kind}{made}"
