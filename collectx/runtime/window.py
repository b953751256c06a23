"""Shared-memory windows: one POSIX shm segment per rank, mapped by every rank of the communicator.

Layout of a rank's segment (the byte offsets are the ``cx_ctl`` struct of cx_executor.h)::

    [0, C)                    control block (C = 16 KiB): pid, ready epoch, abort word, call
                              descriptors, one epoch-stamped flag per lane (each hot word on
                              its own cache line)
    [C, C + set)              staging set 0: input | output | scratch slots of one tile
    [C + set, C + 2set)       staging set 1 (tiles alternate sets: double buffering)
    [C + 2set, heap)          point-to-point area: per-peer counters, then a slot per peer
    [heap, end)               heap of 2set bytes: Communicator.empty arrays, which collectives
                              use in place (peers read them directly: zero copy)

One segment per rank (not one shared one) so each rank creates, sizes and first-touches its own
memory, and a rank's window is named after its creator's pid. Segments are created in /dev/shm
with ``O_CREAT | O_EXCL`` and mode 0600 under an unguessable name
(``collectx-<pid>-<random hex>``), published through the rendezvous store, and unlinked by their
creator as soon as every rank has mapped them, so nothing can leak after that point even on
SIGKILL. A crash before that point leaves a named segment: :func:`sweep_stale` (run at every
init and by the launcher) removes segments whose creator pid is gone.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets

import numpy as np

from ..errors import CommError
from ..log import logger, mib
from ._lib import native
from .peer_reads import close_to_peers, open_to_peers
from .segment import (CTL_BYTES, Layout, fit_window_bytes, hold, release,
                      shm_free, unbacked_bytes)
from .store import Store

SHM_DIR = "/dev/shm"
PREFIX = "collectx-"
MAGIC = 0x636F6C6C65637478          # "collectx"
ABORT_FATAL = 1 << 63                # abort word bit: the communicator is unusable
ABORT_CLOSED = 1 << 62               # abort word bit: the rank closed it, makes no more calls
ABORTED_CALL = 0xFFFF                # descriptor collective code of a call aborted by its rank
# word indices (uint64) into the control block, matching cx_ctl
W_MAGIC, W_PID, W_BASE, W_READY, W_ABORT, W_DESC, W_FLAGS = 0, 1, 2, 8, 16, 32, 128
DESC_WORDS = 10
_NAME = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+$")


def sweep_stale(shm_dir: str = SHM_DIR, pids: set[int] | None = None) -> list[str]:
    """Remove collectx segments whose creator process is gone (or, given ``pids``, is in it).

    Returns the names removed. Segments of live processes are never touched.

    >>> sweep_stale(pids=set())
    []
    """
    removed = []
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return removed
    for name in names:
        m = _NAME.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        if (pids is not None and pid not in pids) or (pids is None and _alive(pid)):
            continue
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except (FileNotFoundError, PermissionError):
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create_segment(total: int) -> tuple[str, mmap.mmap, int]:
    """A new segment of ``total`` bytes: its name, its mapping and its open descriptor."""
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(12)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, total)
        return name, mmap.mmap(fd, total), fd
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise


def _map_segment(name: str, total: int) -> mmap.mmap:
    if not _NAME.match(name):
        raise CommError(f"rendezvous published segment name {name!r}; expected "
                        f"'{PREFIX}<pid>-<hex>' (is another program using this store?)")
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        if os.fstat(fd).st_size != total:
            raise CommError(f"segment {name} has {os.fstat(fd).st_size} bytes, expected {total}")
        return mmap.mmap(fd, total)
    finally:
        os.close(fd)


def oversubscribed(machine_ranks: int, cpus: int | None = None) -> bool:
    """Whether the ranks on this machine outnumber its CPUs (then a rank waited for is often
    queued behind the waiter, and every wait costs a context switch).

    >>> oversubscribed(2, cpus=2), oversubscribed(4, cpus=2)
    (False, True)
    """
    return machine_ranks > ((os.cpu_count() or 1) if cpus is None else cpus)


# How long a wait busy-polls before it sleeps on its futex doorbell when every rank has a CPU.
# By time, not by polls: a poll's `pause` takes 10 ns on one Xeon and 40+ on others. A peer that
# publishes while we sleep must wake us, which on a VM costs tens of microseconds (waking an
# idle virtual CPU); waits of 50-150 us are common from 1 MiB up. 2-rank 1 MiB broadcast, two
# runs each: 112 / 140 us spinning 20 us, 72 / 92 us spinning 200 us, 83 / 75 us spinning 1 ms.
SPIN_NS = 200_000


def spin_polls(machine_ranks: int, cpus: int | None = None) -> tuple[int, int]:
    """(polls, nanoseconds) a wait spins before it yields or sleeps: for SPIN_NS when every
    rank on the machine has a CPU, 50 polls when they outnumber the CPUs (the peer waited for
    is then often queued on ours).

    >>> spin_polls(2, cpus=2), spin_polls(4, cpus=2)
    ((0, 200000), (50, 0))
    """
    return (50, 0) if oversubscribed(machine_ranks, cpus) else (0, SPIN_NS)


class Window:
    """Every rank's segment mapped in this process, plus the native view of them.

    ``ctl[r]`` is rank r's control block as a uint64 numpy array; ``native`` is the
    ``cx_exec_window`` struct the executor takes. ``machine_ranks`` counts the ranks of every
    communicator sharing this machine (default ``size``): it sets how long waits spin. ``cma``
    tells whether every rank can read every peer's memory across processes (asked for with
    ``cma=True`` and probed at setup, see :meth:`_probe_cma`).
    """

    def __init__(self, rank: int, size: int, store: Store, prefix: str, window_bytes: int,
                 timeout: float, machine_ranks: int | None = None, cma: bool = True):
        self.rank, self.size = rank, size
        self.machine_ranks = size if machine_ranks is None else machine_ranks
        self._maps: list[mmap.mmap | None] = [None] * size
        self._name = self._fd = None
        self.cma = False
        # Before the rendezvous: a peer probes this process as soon as every rank has mapped
        self._opened = cma and size > 1 and open_to_peers()
        try:
            self._rendezvous(store, prefix, window_bytes, timeout)
            if size > 1:
                self.cma = self._probe_cma(store, prefix, timeout, cma)
            if self._opened and not self.cma:
                self._close_to_peers()
        except BaseException:
            self.close()
            raise
        self._log_setup(window_bytes, cma)

    def _log_setup(self, requested: int, cma_wanted: bool) -> None:
        if self.rank == 0 and self.fitted_to_shm:
            logger.warning("rank 0/%d: shared windows cut from %s to %s per rank to fit "
                           "/dev/shm (comm.empty arrays: up to %s); give the machine more "
                           "shared memory (e.g. docker run --shm-size=1g) for larger ones",
                           self.size, mib(requested), mib(2 * self.set_bytes),
                           mib(self.heap_bytes))
        if self.rank == 0 and cma_wanted and self.size > 1 and not self.cma:
            logger.warning("rank 0/%d: ranks may not read each other's memory across processes "
                           "(a ptrace policy or a seccomp filter forbids process_vm_readv); "
                           "large buffers go through staged copies, slower from 256 KiB up "
                           "(docs/runtime.md)", self.size)
        route = ("" if self.size == 1 else ", peers read large buffers across processes"
                 if self.cma else ", peers read large buffers from staged copies")
        logger.info("rank %d/%d: window %s (heap %s)%s%s", self.rank, self.size,
                    mib(2 * self.set_bytes), mib(self.heap_bytes), route,
                    ", Yama ptrace_scope 1 lifted for them" if self._opened else "")

    def _rendezvous(self, store, prefix, window_bytes, timeout):
        # Rank 0 decides the size so every rank computes the same tile layout, and fits it to
        # the room in /dev/shm first (segment.py); where even the smallest does not fit, every
        # rank raises the same error at once instead of waiting for segments never made.
        store.set(f"{prefix}/unbacked/{self.rank}", f"{os.getpid()} {unbacked_bytes()}")
        if self.rank == 0:
            store.set(f"{prefix}/window_bytes", self._fitted(store, prefix, window_bytes,
                                                             timeout))
        agreed = store.get(f"{prefix}/window_bytes", timeout).decode()
        if not agreed.isdecimal():
            raise CommError(agreed)
        layout = Layout.of(int(agreed), self.size)
        self.set_bytes, self.heap_bytes = layout.set_bytes, layout.heap_bytes
        self.p2p_offset, self.heap_offset = layout.p2p_offset, layout.heap_offset
        self.p2p_slot_bytes = layout.p2p_slot_bytes
        self.fitted_to_shm = int(agreed) < window_bytes
        total = layout.total
        self._name, self._maps[self.rank], self._fd = _create_segment(total)
        hold(self._fd)
        self._init_ctl(self._maps[self.rank])
        store.set(f"{prefix}/seg/{self.rank}", self._name)
        for r in range(self.size):
            if r != self.rank:
                self._maps[r] = _map_segment(store.get(f"{prefix}/seg/{r}", timeout).decode(),
                                             total)
        store.set(f"{prefix}/mapped/{self.rank}", "1")
        store.wait([f"{prefix}/mapped/{r}" for r in range(self.size)], timeout)
        self._unlink_own()
        self._build_views()

    def _fitted(self, store: Store, prefix: str, window_bytes: int, timeout: float) -> str:
        """The window size every rank uses, or the error that stops them all."""
        free = shm_free(SHM_DIR)
        try:
            return str(fit_window_bytes(window_bytes, self.size, self.machine_ranks, free,
                                        self._promised(store, prefix, timeout) if free else 0))
        except CommError as e:
            return str(e)

    def _promised(self, store: Store, prefix: str, timeout: float) -> int:
        """What the segments every rank's process already holds may still take from
        /dev/shm (ranks that are threads of one process report the same segments once)."""
        keys = [f"{prefix}/unbacked/{r}" for r in range(self.size)]
        store.wait(keys, timeout)
        by_pid = dict(store.get(k, timeout).decode().split() for k in keys)
        return sum(int(b) for b in by_pid.values())

    def _init_ctl(self, mm: mmap.mmap) -> None:
        ctl = np.frombuffer(mm, dtype=np.uint64, count=CTL_BYTES // 8)
        ctl[W_PID] = os.getpid()
        ctl[W_BASE] = ctl.ctypes.data  # where this process maps it: what _probe_cma reads
        ctl[W_MAGIC] = MAGIC
        del ctl

    def _probe_cma(self, store: Store, prefix: str, timeout: float, wanted: bool) -> bool:
        """True when every rank read every peer's magic word across processes, at the address
        the peer mapped its own segment at (``W_BASE``); the ranks agree through the store.

        A ptrace policy (Yama's ``ptrace_scope`` 2 or 3, or 1 where :mod:`.peer_reads` could
        not lift it; a seccomp filter) or a non-Linux kernel can forbid process_vm_readv, and
        it must work between every pair before any call relies on it; where it does not, peers
        read staged copies in the window instead.
        """
        ffi, lib = native()
        ok = wanted
        word = ffi.new("unsigned long long*")
        for r in range(self.size):
            if r == self.rank or not ok:
                continue
            remote = ffi.cast("void*", int(self.ctl[r][W_BASE]))
            ok = lib.cx_exec_cma_read(self.pids[r], remote, word, 8) == 0 and word[0] == MAGIC
        store.set(f"{prefix}/cma/{self.rank}", "1" if ok else "0")
        return all(store.get(f"{prefix}/cma/{r}", timeout) == b"1" for r in range(self.size))

    def _close_to_peers(self) -> None:
        if getattr(self, "_opened", False):
            self._opened = False
            close_to_peers()

    def _unlink_own(self) -> None:
        if self._name:
            try:
                os.unlink(os.path.join(SHM_DIR, self._name))
            except FileNotFoundError:
                pass
            self._name = None

    def _build_views(self) -> None:
        ffi, _ = native()
        self.ctl = [np.frombuffer(m, dtype=np.uint64, count=CTL_BYTES // 8) for m in self._maps]
        self.pids = [int(c[W_PID]) for c in self.ctl]
        self._bufs = [ffi.from_buffer(m) for m in self._maps]
        self._ctl_ptrs = ffi.new("cx_ctl*[]", [ffi.cast("cx_ctl*", b) for b in self._bufs])
        self._data_ptrs = ffi.new("char*[]", [ffi.cast("char*", b) + CTL_BYTES
                                              for b in self._bufs])
        self.native = ffi.new("cx_exec_window*")
        self.native.nranks, self.native.rank = self.size, self.rank
        self.native.ctl, self.native.data = self._ctl_ptrs, self._data_ptrs
        self.native.set_bytes = self.set_bytes
        self.native.spin, self.native.spin_ns = spin_polls(self.machine_ranks)
        self._p2p_ptrs = ffi.new("char*[]", [ffi.cast("char*", b) + self.p2p_offset
                                             for b in self._bufs])
        self.native.p2p, self.native.p2p_slot_bytes = self._p2p_ptrs, self.p2p_slot_bytes
        self._heap_ptrs = ffi.new("char*[]", [ffi.cast("char*", b) + self.heap_offset
                                              for b in self._bufs])
        self.native.heap = self._heap_ptrs
        self.heap_address = int(ffi.cast("uintptr_t", self._heap_ptrs[self.rank]))

    def heap_view(self, offset: int, nbytes: int) -> memoryview:
        """Writable bytes of this rank's heap (what Communicator.empty hands out)."""
        start = self.heap_offset + offset
        return memoryview(self._maps[self.rank])[start:start + nbytes]

    def close(self) -> None:
        """Unmap every segment (and unlink ours if setup never got that far). Idempotent."""
        self._unlink_own()
        if self._fd is not None:
            release(self._fd)
            self._fd = None
        self._close_to_peers()
        ffi = native()[0] if hasattr(self, "_bufs") else None
        for b in getattr(self, "_bufs", ()):
            ffi.release(b)
        self._bufs, self.ctl, self.native = [], [], None
        for i, m in enumerate(self._maps):
            if m is not None:
                try:
                    m.close()
                except BufferError:  # a numpy view still exists: unmapped when it dies
                    pass
                self._maps[i] = None
