"""Asynchronous work: a per-communicator background thread that runs collectives in call order.

The native executor releases the GIL (cffi does so for every call in ABI mode), so a collective
running on the worker truly overlaps the caller's Python.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from ..errors import Timeout


class Work:
    """Handle of an ``async_op=True`` collective (torch.distributed style).

    >>> w = Work.completed(42)
    >>> w.is_completed(), w.wait(), w.result()
    (True, True, 42)
    """

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    @classmethod
    def completed(cls, value: Any = None) -> "Work":
        w = cls()
        w._finish(value, None)
        return w

    def _finish(self, value: Any, error: BaseException | None) -> None:
        self._value, self._error = value, error
        self._done.set()

    def is_completed(self) -> bool:
        """True once the collective finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raise the collective's error. Returns True.

        Raises :class:`~collectx.errors.Timeout` if ``timeout`` seconds pass first.
        """
        if not self._done.wait(timeout):
            raise Timeout(f"Work.wait: the collective did not finish within {timeout} s; "
                          f"expected it to complete (peers may still be arriving); wait longer")
        if self._error is not None:
            raise self._error
        return True

    def result(self) -> Any:
        """The collective's output (waits for it first)."""
        self.wait()
        return self._value


class Worker:
    """One daemon thread running submitted closures strictly in order."""

    def __init__(self, name: str) -> None:
        self._q: queue.Queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def submit(self, fn: Callable[[], Any]) -> Work:
        work = Work()
        with self._lock:
            self._pending += 1
        self._q.put((fn, work))
        return work

    def drain(self) -> None:
        """Wait until every submitted closure has run."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0)

    def stop(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while (item := self._q.get()) is not None:
            fn, work = item
            try:
                work._finish(fn(), None)
            except BaseException as e:  # handed to the waiter, who re-raises it
                work._finish(None, e)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
