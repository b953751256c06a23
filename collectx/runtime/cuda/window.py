"""CUDA windows: one device allocation per rank, mapped by every rank through CUDA IPC.

Layout of a rank's allocation (native/include/cx_cuda_exec.h)::

    [0, ctl)                  control block: ready epoch, abort word, call descriptors, status
                              record, one epoch-stamped flag per lane (128-byte lines)
    [ctl, ctl + set)          staging set 0: input | output | scratch slots of one tile
    [ctl + set, ctl + 2set)   staging set 1 (tiles alternate sets)

Rendezvous goes through the same store as the CPU windows: each rank publishes its pid, device,
PCI bus id, base address and 64-byte IPC handle. Peers in another process open the handle once
per (process, device) -- :data:`_OPENED` holds the mapping for all its users, because CUDA
refuses to open one handle twice in a context. A peer in this very process (ranks as threads)
is used through its pointer: a process cannot open its own handles. Ranks on one GPU work the
same way as ranks on several; on several GPUs in one process, peer access is enabled explicitly
(IPC mappings enable it lazily by themselves).
"""

from __future__ import annotations

import json
import os
import threading

from ...errors import ArgumentError, CommError
from ..segment import set_bytes_for
from . import _rt


class _Holders:
    """Resources of this process shared by several ranks: made by the first, released by the
    last (under one lock for every table)."""

    _lock = threading.Lock()

    def __init__(self, release):
        self._release = release
        self._held: dict = {}           # key -> [resource, holders]

    def hold(self, key, make):
        """The resource under ``key`` (``make()`` builds it the first time), held once more."""
        with self._lock:
            hit = self._held.get(key)
            if hit is None:
                hit = self._held[key] = [make(), 0]
            hit[1] += 1
            return hit[0]

    def drop(self, key) -> None:
        """One holder fewer; the last one releases the resource."""
        with self._lock:
            hit = self._held.get(key)
            if hit is None:
                return
            hit[1] -= 1
            if hit[1]:
                return
            del self._held[key]
        self._release(hit[0])


# Peers' windows opened through IPC, by (device, handle): CUDA refuses to open one handle twice
# in a context, so ranks of one process share the mapping.
_OPENED = _Holders(lambda base: _rt.ipc_close(base))
# Window allocations of this process, by base: its owner and every rank of this process that
# maps it hold it. A rank that closes early must not free memory a peer's kernel may still read
# (ranks as threads see each other's windows directly; cudaFree under a running kernel faults).
_LOCAL = _Holders(lambda base: _rt.free(base))


def ctl_bytes() -> int:
    """Bytes of the control block at the start of every window (from the library)."""
    ffi, lib = _rt.lib()
    n = ffi.new("long long*")
    _rt.check(lib.cx_cuda_ctl_bytes(n), "cx_cuda_ctl_bytes")
    return int(n[0])


class CudaWindow:
    """Every rank's CUDA window, mapped in this process.

    ``bases[r]`` is rank r's window base here; ``d_windows`` a device array of those bases (the
    kernel's view); ``self_base`` this rank's own allocation.
    """

    def __init__(self, rank: int, size: int, store, prefix: str, window_bytes: int,
                 timeout: float, device: int):
        self.rank, self.size, self.device = rank, size, device
        self.self_base = self.d_windows = 0
        self.bases: list[int] = []
        self._opened: list[bytes] = []
        self._held: list[int] = []  # in-process peers' windows this rank keeps alive
        self._stream = 0            # read_words' stream, made on first use
        self._write_stream = 0      # write_words' (the watchdog's thread), likewise
        try:
            self._rendezvous(store, prefix, window_bytes, timeout)
        except BaseException:
            self.close()
            raise

    def _rendezvous(self, store, prefix, window_bytes, timeout) -> None:
        if self.rank == 0:  # rank 0 decides the size so every rank computes the same tiles
            store.set(f"{prefix}/window_bytes", str(int(window_bytes)))
        self.set_bytes = set_bytes_for(int(store.get(f"{prefix}/window_bytes", timeout)))
        self.ctl_bytes = ctl_bytes()
        _rt.set_device(self.device)
        base = _rt.malloc(self.ctl_bytes + 2 * self.set_bytes)
        self.self_base = _LOCAL.hold(base, lambda: base)
        _rt.memset(self.self_base, 0, self.ctl_bytes)
        _rt.stream_synchronize(0)  # zeroed flags before any peer can look at them
        me = {"pid": os.getpid(), "device": self.device, "bus": _rt.pci_bus_id(self.device),
              "sms": _rt.sm_count(self.device), "base": self.self_base,
              "handle": _rt.ipc_handle(self.self_base).hex()}
        store.set(f"{prefix}/cuda/{self.rank}", json.dumps(me))
        self.peers = [json.loads(store.get(f"{prefix}/cuda/{r}", timeout))
                      for r in range(self.size)]
        self.bases = [self._map(r, p) for r, p in enumerate(self.peers)]
        self.shared_gpu = len({p["bus"] for p in self.peers}) < self.size
        _check_hardware_queues(self.rank, self.peers)
        self._upload_bases()
        store.set(f"{prefix}/cuda_mapped/{self.rank}", "1")
        store.wait([f"{prefix}/cuda_mapped/{r}" for r in range(self.size)], timeout)

    def _map(self, r: int, peer: dict) -> int:
        if r == self.rank:
            return self.self_base
        if peer["pid"] == os.getpid():  # a rank in this process: its pointer is valid here
            if peer["device"] != self.device and not _rt.enable_peer_access(peer["device"]):
                raise CommError(f"rank {self.rank} (GPU {self.device}) cannot access rank {r}'s "
                                f"GPU {peer['device']}; expected peer access between GPUs of "
                                f"one process; run one process per GPU instead")
            # Held until this rank closes: a peer that returns early (or never calls) frees its
            # window only once nobody's kernel can still poll it.
            base = int(peer["base"])
            self._held.append(_LOCAL.hold(base, lambda: base))
            return self._held[-1]
        handle = bytes.fromhex(peer["handle"])
        base = _OPENED.hold((self.device, handle), lambda: _rt.ipc_open(handle))
        self._opened.append(handle)
        return base

    def _upload_bases(self) -> None:
        ffi, _ = _rt.lib()
        table = ffi.new("unsigned long long[]", self.bases)
        self.d_windows = _rt.malloc(8 * self.size)
        _rt.memcpy(self.d_windows, int(ffi.cast("uintptr_t", table)), 8 * self.size)
        _rt.stream_synchronize(0)

    def read_words(self, rank: int, offset: int, nwords: int) -> list[int]:
        """uint64 words of rank's control block: a synchronous device-to-host copy on a
        non-blocking stream of this window's own, which never waits for kernels queued on
        other streams (the default stream would: a kernel that waits for this very rank, in
        this process or on this GPU, would then never let the copy run)."""
        ffi, _ = _rt.lib()
        if not self._stream:
            self._stream = _rt.stream_create()
        out = ffi.new("unsigned long long[]", nwords)
        _rt.memcpy(int(ffi.cast("uintptr_t", out)), self.bases[rank] + offset, 8 * nwords,
                   self._stream)
        _rt.stream_synchronize(self._stream)
        return [int(v) for v in out]

    def write_words(self, rank: int, offset: int, words: list[int]) -> None:
        """Writes uint64 words into rank's control block, synchronously, on a non-blocking
        stream of its own: it runs beside a kernel that spins on other streams."""
        ffi, _ = _rt.lib()
        if not self._write_stream:
            self._write_stream = _rt.stream_create()
        data = ffi.new("unsigned long long[]", [w & (1 << 64) - 1 for w in words])
        _rt.memcpy(self.bases[rank] + offset, int(ffi.cast("uintptr_t", data)), 8 * len(words),
                   self._write_stream)
        _rt.stream_synchronize(self._write_stream)

    def close(self) -> None:
        """Unmap the peers' windows and free this rank's (once no rank of this process that
        mapped it still holds it). Idempotent."""
        for name in ("_stream", "_write_stream"):
            if getattr(self, name):
                stream = getattr(self, name)
                setattr(self, name, 0)
                _rt.stream_destroy(stream)
        for handle in self._opened:
            _OPENED.drop((self.device, handle))
        self._opened = []
        held, self._held = self._held, []
        for base in held:
            _LOCAL.drop(base)
        if self.d_windows:
            ptr, self.d_windows = self.d_windows, 0
            _rt.free(ptr)
        if self.self_base:
            ptr, self.self_base = self.self_base, 0
            _LOCAL.drop(ptr)
        self.bases = []


def hardware_queues() -> int:
    """CUDA's hardware work queues per device (CUDA_DEVICE_MAX_CONNECTIONS, default 8)."""
    try:
        return max(1, int(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "8")))
    except ValueError:
        return 8


def _check_hardware_queues(rank: int, peers: list[dict]) -> None:
    """Refuses more same-process ranks on one GPU than half its hardware queues.

    Each such rank drives two streams (the caller's and its communicator's). Streams beyond the
    queue count share queues, and a kernel queued behind a peer's spinning kernel never starts:
    every rank of the call would wait until its timeout (seen with 8 ranks and the default 8)."""
    me = peers[rank]
    sharing = sum(1 for p in peers if p["pid"] == me["pid"] and p["bus"] == me["bus"])
    if sharing > 1 and 2 * sharing > hardware_queues():
        raise ArgumentError(
            f"{sharing} ranks of this process share GPU {me['device']}, but CUDA gives it "
            f"{hardware_queues()} hardware queues (CUDA_DEVICE_MAX_CONNECTIONS); ranks whose "
            f"streams share a queue deadlock. Expected at most half that many ranks per GPU and "
            f"process: set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts, or run ranks as "
            f"processes")

