"""Handles of queued CUDA collectives, and the caller's "current stream".

>>> current_stream(object())  # neither torch nor CuPy: the legacy default stream
0
"""

from __future__ import annotations

import sys

from . import _rt


def current_stream(like) -> int:
    """The stream the caller works on now, judged by the framework of ``like``: torch's
    current stream, CuPy's current stream, else the legacy default stream (handle 0)."""
    mod = type(like).__module__
    if mod.startswith("torch") and "torch" in sys.modules:
        import torch
        return int(torch.cuda.current_stream(like.device).cuda_stream)
    if mod.startswith("cupy") and "cupy" in sys.modules:
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    return 0


class CudaWork:
    """An ``async_op=True`` CUDA collective (torch.distributed style, stream semantics).

    ``wait()`` orders the caller's current stream after the collective on the device and returns
    without blocking the host; ``is_completed()`` asks the event; ``synchronize()`` blocks the
    host and raises the kernel's failure, if any.
    """

    def __init__(self, event: _rt.Event, engine, result, stream: int):
        self._event, self._engine, self._result, self._stream = event, engine, result, stream

    def is_completed(self) -> bool:
        """True once the collective's work on the device is done."""
        return self._event.handle == 0 or self._event.query()

    def wait(self, timeout: float | None = None) -> bool:
        """Make the current stream wait for the collective (device side); returns True.

        Failures of calls already finished are raised here. ``timeout`` is accepted for
        torch compatibility; the kernel's own deadline (``COLLECTX_TIMEOUT``) bounds the wait.
        """
        if self._event.handle:
            stream = current_stream(self._result) if self._result is not None else self._stream
            self._event.make_wait(stream)
        self._engine.poll(block=False)
        return True

    def synchronize(self) -> None:
        """Block the host until the collective finished; raise its failure."""
        if self._event.handle:
            self._event.synchronize()
        self._engine.poll(block=False)

    def result(self):
        """The collective's output (the stream waits for it first)."""
        self.wait()
        return self._result
