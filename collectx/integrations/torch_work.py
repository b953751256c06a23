"""Work objects and the serial runner behind the collectx torch.distributed backend.

How it works: every process group owns one :class:`SerialRunner`. Collectives must run in the same
order on every rank, so the runner executes them one at a time, in call order, on one background
thread; ``async_op=True`` returns as soon as the call is queued and the collective overlaps with
whatever the Python thread does next (the native kernels release the GIL). A blocking call that
finds nothing queued runs inline on the caller's thread, which saves the thread hand-off for the
small synchronous collectives typical of Python code.

Each submitted call yields a :class:`CollectxWork` (a ``torch.distributed.Work``) whose
``get_future()`` is a ``torch.futures.Future`` completed with the output tensors, as DDP's reducer
and communication hooks expect.
"""

from __future__ import annotations

import datetime
import queue
import threading
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch.futures import Future

from ..errors import ArgumentError, CommError, DTypeError, Timeout

# Raised by a collective's argument checks before any byte moves, and on every rank alike (the
# ranks run one program): the group stays usable, as the Communicator does (gloo, NCCL too).
REFUSED = (ArgumentError, DTypeError)


# ``torch.distributed.Work`` is public in recent 2.x; older releases only export ``_Work``.
_WorkBase = getattr(dist, "Work", None) or dist._Work


# Completion of every work in the process: waiters block on it, _finish notifies it. One
# condition for all (held for a few instructions, never while a callback runs): waiting on a
# shared condition costs less than creating an Event per collective, and waiters are few.
_STATE = threading.Condition()


class CollectxWork(_WorkBase):
    """A collective in flight: ``wait()``, ``is_completed()`` and ``get_future()``.

    ``wait()`` raises the collective's error (a ``RuntimeError`` subclass from
    :mod:`collectx.errors`), so torch code that catches ``RuntimeError`` keeps working.

    Notes
    -----
    The torch ``Future`` is created on first use: only DDP-style callers ask for it, and creating
    one costs about as much as the rest of a small collective's Python. Exactly one of
    :meth:`_finish` and :meth:`get_future` settles it, decided under ``_STATE``.
    """

    def __init__(self, outputs: Sequence[torch.Tensor]):
        super().__init__()
        self._outputs = outputs if type(outputs) is list else list(outputs)
        self._future: Future | None = None
        self._finished = False
        self._error: BaseException | None = None

    # -- completion, called by the runner ---------------------------------------------------
    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        with _STATE:
            self._finished = True
            future = self._future
            _STATE.notify_all()
        # Future callbacks (DDP comm hooks) run here, on the runner thread, after the data landed.
        if future is not None:
            self._settle(future)

    def _settle(self, future: Future) -> None:
        if self._error is None:
            future.set_result(self._outputs)
        else:
            future.set_exception(self._error)

    # -- the torch.distributed.Work interface -------------------------------------------------
    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._finished:
            seconds = _seconds(timeout)
            with _STATE:
                finished = _STATE.wait_for(self.is_completed, seconds)
            if not finished:
                raise Timeout(f"collectx work did not complete within {seconds:.1f} s passed to "
                              f"wait(); expected it to finish in time. Raise the timeout, or "
                              f"check that every rank called the same collectives in the same "
                              f"order")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._finished

    def is_success(self) -> bool:
        return self._finished and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Future:
        with _STATE:
            future, created = self._future, self._future is None
            if created:
                future = self._future = Future()
            settle = created and self._finished   # _finish ran before the future existed
        if settle:
            self._settle(future)
        return future


def _seconds(timeout) -> float | None:
    """A torch timeout (timedelta, possibly the 'unset' sentinel <= 0) as seconds or None."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    return seconds if seconds > 0 else None


class SerialRunner:
    """Runs one process group's collectives one at a time, in the order they were submitted.

    After a collective fails, the communicator's state across ranks is unknown (a peer may be
    dead), so every later call fails fast with the first error instead of hanging.
    """

    def __init__(self, name: str):
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._closed = False

    def submit(self, run: Callable[[], None], outputs: Sequence[torch.Tensor],
               async_op: bool) -> CollectxWork:
        """Queue ``run`` (or run it now when blocking and idle); return its Work."""
        with self._lock:
            self._check_usable()
            inline = not async_op and self._pending == 0
            work = CollectxWork(outputs)
            if not inline:
                self._pending += 1
                self._start_thread()
                self._queue.put((run, work))
        if inline:
            self._execute(run, work, inline=True)
        return work

    def close(self, wait: bool = True) -> None:
        """Stop taking work; with ``wait``, finish what is queued and stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _check_usable(self) -> None:
        if self._closed:
            raise CommError(f"process group {self._name} was shut down; expected a live group. "
                            f"Create a new one with torch.distributed.new_group or "
                            f"init_process_group")
        if self._failure is not None:
            raise CommError(f"process group {self._name} is unusable after an earlier collective "
                            f"failed ({self._failure}); destroy it and create a new one") \
                from self._failure

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"collectx-{self._name}",
                                            daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            run, work = item
            self._execute(run, work)
            with self._lock:
                self._pending -= 1

    def _execute(self, run: Callable[[], None], work: CollectxWork,
                 inline: bool = False) -> None:
        if self._failure is not None:
            work._finish(CommError(f"process group {self._name} skipped this collective: an "
                                   f"earlier one failed ({self._failure})"))
            return
        try:
            run()
        except BaseException as error:  # noqa: BLE001 -- handed to wait()/the future, not lost
            if not isinstance(error, REFUSED):
                self._failure = error
            work._finish(error)
            return
        if inline:
            # Not yet handed to the caller: nobody can wait on it or hold its future, so it
            # completes without taking the shared condition (a third of a small call's Python).
            work._finished = True
            return
        work._finish()
