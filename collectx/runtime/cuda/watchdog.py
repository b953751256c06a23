"""Stops a rank's kernels when a peer process dies.

A kernel waiting for a peer cannot see pids: without help, a survivor would spin until
``COLLECTX_TIMEOUT``. While calls are queued, a thread of the engine looks at the peers' pids
every :data:`PERIOD_S`. When one is gone it writes ``PEER_DEAD`` and the dead rank into this
rank's status record in the window, which every spinning block checks every few hundred polls
(so they stop, and the call's record reports :class:`~collectx.PeerFailure`), and raises this
rank's abort word, so that peers waiting on this rank stop too. The writes go through a stream
of the window's own, which runs beside the spinning kernel. Ranks of one process die together,
so they need no watchdog.
"""

from __future__ import annotations

import threading

from ..engine import EXEC_STATUS
from ..window import _alive
from . import _rt

PERIOD_S = 0.5            # between looks at the peers' pids: a death is seen within a second
STATUS_OFFSET = 384       # cx_cuda_ctl.status: int32 status, rank, lane, index
ABORT_OFFSET = 128        # cx_cuda_ctl.abort_word
ABORT_FATAL = 1 << 63     # CX_CUDA_ABORT_FATAL


def death_words(dead: int, me: int) -> tuple[list[int], list[int]]:
    """The status record (PEER_DEAD, dead rank, lane -1, index -1) as two uint64 words, and the
    abort word, that :class:`Watchdog` writes into rank ``me``'s control block.

    >>> status, abort = death_words(3, 1)
    >>> [hex(w) for w in status], hex(abort[0])
    (['0x300000002', '0xffffffffffffffff'], '0x8000000000000001')
    """
    status = (EXEC_STATUS["PEER_DEAD"] & 0xFFFFFFFF) | (dead << 32)
    return [status, (1 << 64) - 1], [ABORT_FATAL | me]


class Watchdog:
    """Watches ``window``'s peers in other processes while ``busy()`` says calls are queued."""

    def __init__(self, window, busy):
        self.window, self.busy = window, busy
        self.dead: int | None = None        # the first rank seen dead
        me = window.peers[window.rank]["pid"]
        self._watched = [(r, int(p["pid"])) for r, p in enumerate(window.peers)
                         if int(p["pid"]) != me]
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        if self._watched and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="collectx-cuda-watchdog",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        _rt.set_device(self.window.device)   # the current device is per thread
        while not self._stop.wait(PERIOD_S):
            if self.busy():
                self.look()

    def look(self) -> int | None:
        """Checks the peers once; on a death, stops this rank's kernels. The dead rank, if any.

        Once a peer is dead it writes again at every look while calls are queued: a staged call
        queued behind the stopped one clears the status record as it starts."""
        if self.dead is None:
            self.dead = next((rank for rank, pid in self._watched if not _alive(pid)), None)
        if self.dead is not None:
            status, abort = death_words(self.dead, self.window.rank)
            self.window.write_words(self.window.rank, STATUS_OFFSET, status)
            self.window.write_words(self.window.rank, ABORT_OFFSET, abort)
        return self.dead

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
