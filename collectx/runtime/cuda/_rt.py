"""The CUDA runtime entry points of libcollectx (native/cuda/window.cu) as small Python calls.

Pointers, streams and events travel as plain ints (CuPy and torch hand out ints too). Every
failure raises :class:`~collectx.errors.CudaError` carrying the CUDA runtime's own text; a library
built without CUDA objects raises :class:`~collectx.errors.CudaUnavailable` on first use.

>>> try:
...     n = device_count()
... except CudaUnavailable:
...     n = 0
>>> n >= 0
True
"""

from __future__ import annotations

import functools

from ...errors import ArgumentError, CudaError, CudaUnavailable, NativeUnavailable
from .._lib import native

IPC_HANDLE_BYTES = 64
_FIRST_SYMBOL = "cx_cuda_exec_launch"


@functools.lru_cache(maxsize=1)
def _loaded():
    try:
        ffi, lib = native()
    except NativeUnavailable as e:
        raise CudaUnavailable(f"libcollectx could not be loaded ({e}); expected a build with "
                              f"CUDA objects") from e
    try:
        getattr(lib, _FIRST_SYMBOL)
    except AttributeError:
        raise CudaUnavailable(
            "this libcollectx was built without CUDA objects (build_info cuda_objects=0); "
            "expected the CUDA executor; rebuild where nvcc is on PATH with COLLECTX_CUDA=ON "
            "(pip install . or the cmake dev build)") from None
    return ffi, lib


def lib():
    """``(ffi, lib)`` with the CUDA entry points present (raises CudaUnavailable otherwise)."""
    return _loaded()


def last_error() -> str:
    """What the CUDA runtime said about this thread's last failed call."""
    ffi, lib_ = _loaded()
    buf = ffi.new("char[]", 256)
    lib_.cx_cuda_last_error(buf, len(buf))
    return ffi.string(buf).decode(errors="replace")


def check(rc: int, what: str) -> int:
    """Raise CudaError (ArgumentError for CX_ERR_ARG) for a failed status; else return rc."""
    if rc >= 0:
        return rc
    text = last_error()
    if rc == -3:
        raise ArgumentError(f"{what}: the library refused its arguments ({text})")
    raise CudaError(f"{what} failed with status {rc}: {text}; expected a working CUDA driver and "
                    f"device (check nvidia-smi and CUDA_VISIBLE_DEVICES)", code=rc)


def device_count() -> int:
    """CUDA devices this process sees; 0 when there is no driver or device (never raises
    CudaError; raises CudaUnavailable without CUDA objects)."""
    ffi, lib_ = _loaded()
    n = ffi.new("int*")
    return int(n[0]) if lib_.cx_cuda_device_count(n) == 0 else 0


def set_device(device: int) -> None:
    check(_loaded()[1].cx_cuda_set_device(int(device)), f"cudaSetDevice({device})")


def get_device() -> int:
    ffi, lib_ = _loaded()
    d = ffi.new("int*")
    check(lib_.cx_cuda_get_device(d), "cudaGetDevice")
    return int(d[0])


def preload_kernels() -> None:
    """Load every collectx kernel into the current device's context before the first collective.

    Under lazy module loading a kernel's first launch may wait for its context to go idle; ranks
    that share a context (threads of one process) would then wait on each other forever."""
    check(_loaded()[1].cx_cuda_preload(), "cudaFuncGetAttributes (loading collectx's kernels)")


def pci_bus_id(device: int) -> str:
    """The device's PCI bus id ("0000:07:00.0"): ranks with equal ids share one GPU."""
    ffi, lib_ = _loaded()
    buf = ffi.new("char[]", 32)
    check(lib_.cx_cuda_device_pci_bus_id(int(device), buf, len(buf)), "cudaDeviceGetPCIBusId")
    return ffi.string(buf).decode().lower()


def sm_count(device: int) -> int:
    """The device's streaming multiprocessors."""
    ffi, lib_ = _loaded()
    n = ffi.new("int*")
    check(lib_.cx_cuda_device_sms(int(device), n), "cudaDeviceGetAttribute")
    return int(n[0])


def enable_peer_access(peer: int) -> bool:
    """Enable access to ``peer``'s memory from the current device; False when impossible."""
    ffi, lib_ = _loaded()
    can = ffi.new("int*")
    check(lib_.cx_cuda_can_access_peer(get_device(), int(peer), can), "cudaDeviceCanAccessPeer")
    if not can[0]:
        return False
    check(lib_.cx_cuda_enable_peer_access(int(peer)), "cudaDeviceEnablePeerAccess")
    return True


def malloc(nbytes: int) -> int:
    ffi, lib_ = _loaded()
    p = ffi.new("void**")
    check(lib_.cx_cuda_malloc(p, int(nbytes)), f"cudaMalloc({nbytes})")
    return int(ffi.cast("uintptr_t", p[0]))


def free(ptr: int) -> None:
    check(_loaded()[1].cx_cuda_free(_vp(ptr)), "cudaFree")


def host_alloc(nbytes: int) -> int:
    ffi, lib_ = _loaded()
    p = ffi.new("void**")
    check(lib_.cx_cuda_host_alloc(p, int(nbytes)), f"cudaHostAlloc({nbytes})")
    return int(ffi.cast("uintptr_t", p[0]))


def host_free(ptr: int) -> None:
    check(_loaded()[1].cx_cuda_host_free(_vp(ptr)), "cudaFreeHost")


def memset(ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
    check(_loaded()[1].cx_cuda_memset(_vp(ptr), int(value), int(nbytes), _vp(stream)),
          "cudaMemsetAsync")


def memcpy(dst: int, src: int, nbytes: int, stream: int = 0) -> None:
    """Queue a copy on ``stream`` (direction inferred: D2D, H2D or D2H)."""
    check(_loaded()[1].cx_cuda_memcpy(_vp(dst), _vp(src), int(nbytes), _vp(stream)),
          "cudaMemcpyAsync")


def ipc_handle(base: int) -> bytes:
    """The 64-byte CUDA IPC handle of a cudaMalloc'd allocation base."""
    ffi, lib_ = _loaded()
    h = ffi.new("unsigned char[]", IPC_HANDLE_BYTES)
    check(lib_.cx_cuda_ipc_get_handle(_vp(base), h), "cudaIpcGetMemHandle")
    return bytes(ffi.buffer(h))


def ipc_open(handle: bytes) -> int:
    """Map a peer's allocation (lazy peer access); returns its base address in this process."""
    if len(handle) != IPC_HANDLE_BYTES:
        raise ArgumentError(f"CUDA IPC handle of {len(handle)} bytes; expected "
                            f"{IPC_HANDLE_BYTES}")
    ffi, lib_ = _loaded()
    p = ffi.new("void**")
    check(lib_.cx_cuda_ipc_open(ffi.from_buffer(handle), p), "cudaIpcOpenMemHandle")
    return int(ffi.cast("uintptr_t", p[0]))


def ipc_close(base: int) -> None:
    check(_loaded()[1].cx_cuda_ipc_close(_vp(base)), "cudaIpcCloseMemHandle")


def pointer_base(ptr: int) -> tuple[int, int, int]:
    """``(allocation base, allocation size, device)`` of a device pointer."""
    ffi, lib_ = _loaded()
    base, size, dev = ffi.new("void**"), ffi.new("size_t*"), ffi.new("int*")
    check(lib_.cx_cuda_pointer_base(_vp(ptr), base, size, dev), "cuMemGetAddressRange")
    return int(ffi.cast("uintptr_t", base[0])), int(size[0]), int(dev[0])


def stream_create() -> int:
    ffi, lib_ = _loaded()
    s = ffi.new("void**")
    check(lib_.cx_cuda_stream_create(s), "cudaStreamCreateWithFlags")
    return int(ffi.cast("uintptr_t", s[0]))


def stream_destroy(stream: int) -> None:
    check(_loaded()[1].cx_cuda_stream_destroy(_vp(stream)), "cudaStreamDestroy")


def stream_synchronize(stream: int) -> None:
    check(_loaded()[1].cx_cuda_stream_synchronize(_vp(stream)), "cudaStreamSynchronize")


class Event:
    """A CUDA event without timing (cheapest to record and wait on); ``interprocess`` ones can
    be shared with :meth:`ipc_handle`."""

    def __init__(self, interprocess: bool = False, *, handle: int | None = None):
        ffi, lib_ = _loaded()
        if handle is None:
            e = ffi.new("void**")
            check(lib_.cx_cuda_event_create(e, int(interprocess)), "cudaEventCreateWithFlags")
            handle = int(ffi.cast("uintptr_t", e[0]))
        self.handle = handle

    @classmethod
    def from_ipc(cls, handle: bytes) -> "Event":
        ffi, lib_ = _loaded()
        e = ffi.new("void**")
        check(lib_.cx_cuda_ipc_open_event_handle(ffi.from_buffer(handle), e),
              "cudaIpcOpenEventHandle")
        return cls(handle=int(ffi.cast("uintptr_t", e[0])))

    def ipc_handle(self) -> bytes:
        ffi, lib_ = _loaded()
        h = ffi.new("unsigned char[]", IPC_HANDLE_BYTES)
        check(lib_.cx_cuda_ipc_get_event_handle(_vp(self.handle), h), "cudaIpcGetEventHandle")
        return bytes(ffi.buffer(h))

    def record(self, stream: int) -> None:
        check(_loaded()[1].cx_cuda_event_record(_vp(self.handle), _vp(stream)), "cudaEventRecord")

    def make_wait(self, stream: int) -> None:
        """``stream`` waits (on the device) until this event's work is done."""
        check(_loaded()[1].cx_cuda_stream_wait_event(_vp(stream), _vp(self.handle)),
              "cudaStreamWaitEvent")

    def query(self) -> bool:
        """True once the recorded work is done (no host wait)."""
        return check(_loaded()[1].cx_cuda_event_query(_vp(self.handle)), "cudaEventQuery") == 0

    def synchronize(self) -> None:
        check(_loaded()[1].cx_cuda_event_synchronize(_vp(self.handle)), "cudaEventSynchronize")

    def destroy(self) -> None:
        if self.handle:
            check(_loaded()[1].cx_cuda_event_destroy(_vp(self.handle)), "cudaEventDestroy")
            self.handle = 0


def _vp(value: int):
    return _loaded()[0].cast("void*", int(value or 0))
