// CUDA runtime entry points for collectx/runtime/cuda: devices, memory, CUDA IPC, streams and
// events, each a thin extern "C" wrapper returning a cx_status.
//
// Why wrappers rather than CuPy or torch: the communicator must work with either framework (or
// none), and CUDA IPC handles and events must come from the same runtime that launches the
// executor kernel. Every failure records "call: CUDA error text" for cx_cuda_last_error and
// clears the runtime's sticky error, so a machine without a driver or device gets a status and a
// message, never an abort.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "collectx.h"

namespace {

thread_local char g_last_error[256] = "no CUDA error";

int fail(cudaError_t e, const char* call) {
  snprintf(g_last_error, sizeof g_last_error, "%s: %s (%s)", call, cudaGetErrorString(e),
           cudaGetErrorName(e));
  cudaGetLastError();  // clear the error so the next call starts clean
  return e == cudaErrorMemoryAllocation ? CX_ERR_NOMEM : CX_ERR_CUDA;
}

int check(cudaError_t e, const char* call) { return e == cudaSuccess ? CX_OK : fail(e, call); }

int bad_arg(const char* call) {
  snprintf(g_last_error, sizeof g_last_error, "%s: null or invalid argument", call);
  return CX_ERR_ARG;
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

extern "C" {

int cx_cuda_last_error(char* buf, size_t len) {
  if (!buf || len == 0) return CX_ERR_ARG;
  snprintf(buf, len, "%s", g_last_error);
  return CX_OK;
}

int cx_cuda_device_count(int* count) {
  if (!count) return bad_arg("cudaGetDeviceCount");
  *count = 0;
  return check(cudaGetDeviceCount(count), "cudaGetDeviceCount");
}

int cx_cuda_set_device(int device) { return check(cudaSetDevice(device), "cudaSetDevice"); }

int cx_cuda_get_device(int* device) {
  if (!device) return bad_arg("cudaGetDevice");
  return check(cudaGetDevice(device), "cudaGetDevice");
}

int cx_cuda_device_synchronize(void) {
  return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

int cx_cuda_device_pci_bus_id(int device, char* buf, int len) {
  if (!buf || len < 13) return bad_arg("cudaDeviceGetPCIBusId");
  return check(cudaDeviceGetPCIBusId(buf, len, device), "cudaDeviceGetPCIBusId");
}

int cx_cuda_device_sms(int device, int* count) {
  if (!count) return bad_arg("cudaDeviceGetAttribute");
  *count = 0;
  return check(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
}

int cx_cuda_can_access_peer(int device, int peer, int* can) {
  if (!can) return bad_arg("cudaDeviceCanAccessPeer");
  *can = 0;
  return check(cudaDeviceCanAccessPeer(can, device, peer), "cudaDeviceCanAccessPeer");
}

int cx_cuda_enable_peer_access(int peer) {
  cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return CX_OK;
  }
  return check(e, "cudaDeviceEnablePeerAccess");
}

int cx_cuda_malloc(void** ptr, size_t nbytes) {
  if (!ptr) return bad_arg("cudaMalloc");
  *ptr = nullptr;
  return check(cudaMalloc(ptr, nbytes), "cudaMalloc");
}

int cx_cuda_free(void* ptr) { return check(cudaFree(ptr), "cudaFree"); }

int cx_cuda_host_alloc(void** ptr, size_t nbytes) {
  if (!ptr) return bad_arg("cudaHostAlloc");
  *ptr = nullptr;
  return check(cudaHostAlloc(ptr, nbytes, cudaHostAllocPortable), "cudaHostAlloc");
}

int cx_cuda_host_free(void* ptr) { return check(cudaFreeHost(ptr), "cudaFreeHost"); }

int cx_cuda_memset(void* ptr, int value, size_t nbytes, void* stream) {
  if (nbytes == 0) return CX_OK;
  if (!ptr) return bad_arg("cudaMemsetAsync");
  return check(cudaMemsetAsync(ptr, value, nbytes, as_stream(stream)), "cudaMemsetAsync");
}

int cx_cuda_memcpy(void* dst, const void* src, size_t nbytes, void* stream) {
  if (nbytes == 0 || dst == src) return CX_OK;
  if (!dst || !src) return bad_arg("cudaMemcpyAsync");
  return check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, as_stream(stream)),
               "cudaMemcpyAsync");
}

int cx_cuda_ipc_get_handle(void* base, unsigned char* handle64) {
  static_assert(sizeof(cudaIpcMemHandle_t) == 64, "CUDA IPC handles are 64 bytes");
  if (!base || !handle64) return bad_arg("cudaIpcGetMemHandle");
  cudaIpcMemHandle_t h;
  if (int rc = check(cudaIpcGetMemHandle(&h, base), "cudaIpcGetMemHandle")) return rc;
  memcpy(handle64, &h, sizeof h);
  return CX_OK;
}

int cx_cuda_ipc_open(const unsigned char* handle64, void** base) {
  if (!handle64 || !base) return bad_arg("cudaIpcOpenMemHandle");
  cudaIpcMemHandle_t h;
  memcpy(&h, handle64, sizeof h);
  *base = nullptr;
  return check(cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess),
               "cudaIpcOpenMemHandle");
}

int cx_cuda_ipc_close(void* base) {
  return check(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
}

// cudaPointerGetAttributes gives the device; the allocation range comes from the driver's
// cuMemGetAddressRange, reached through the runtime's versioned entry-point lookup so the library needs
// no link against libcuda (absent on build machines).
typedef int (*cx_get_range_fn)(unsigned long long*, size_t*, unsigned long long);

int cx_cuda_pointer_base(const void* ptr, void** base, size_t* size, int* device) {
  if (!ptr || !base || !size || !device) return bad_arg("cuMemGetAddressRange");
  cudaPointerAttributes attr;
  if (int rc = check(cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes")) return rc;
  if (attr.type != cudaMemoryTypeDevice) return bad_arg("cudaPointerGetAttributes (not device memory)");
  *device = attr.device;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  // 12000: ask for the CUDA 12 ABI of the symbol (cuMemGetAddressRange_v2, 64-bit sizes).
  if (int rc = check(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                      cudaEnableDefault, &found),
                     "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)"))
    return rc;
  if (!fn || found != cudaDriverEntryPointSuccess) return bad_arg("cuMemGetAddressRange (missing)");
  unsigned long long b = 0;
  int drc = reinterpret_cast<cx_get_range_fn>(fn)(&b, size, (unsigned long long)ptr);
  if (drc != 0) {
    snprintf(g_last_error, sizeof g_last_error, "cuMemGetAddressRange: driver error %d", drc);
    return CX_ERR_CUDA;
  }
  *base = reinterpret_cast<void*>(b);
  return CX_OK;
}

int cx_cuda_stream_create(void** stream) {
  if (!stream) return bad_arg("cudaStreamCreateWithFlags");
  *stream = nullptr;
  cudaStream_t s;
  // Non-blocking: collectives must not serialize against the legacy default stream.
  if (int rc = check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                     "cudaStreamCreateWithFlags"))
    return rc;
  *stream = s;
  return CX_OK;
}

int cx_cuda_stream_destroy(void* stream) {
  return check(cudaStreamDestroy(as_stream(stream)), "cudaStreamDestroy");
}

int cx_cuda_stream_synchronize(void* stream) {
  return check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
}

int cx_cuda_event_create(void** event, int interprocess) {
  if (!event) return bad_arg("cudaEventCreateWithFlags");
  *event = nullptr;
  unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0u);
  cudaEvent_t e;
  if (int rc = check(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags")) return rc;
  *event = e;
  return CX_OK;
}

int cx_cuda_event_destroy(void* event) {
  return check(cudaEventDestroy(as_event(event)), "cudaEventDestroy");
}

int cx_cuda_event_record(void* event, void* stream) {
  if (!event) return bad_arg("cudaEventRecord");
  return check(cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord");
}

int cx_cuda_stream_wait_event(void* stream, void* event) {
  if (!event) return bad_arg("cudaStreamWaitEvent");
  return check(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0), "cudaStreamWaitEvent");
}

int cx_cuda_event_query(void* event) {
  if (!event) return bad_arg("cudaEventQuery");
  cudaError_t e = cudaEventQuery(as_event(event));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return 1;
  }
  return check(e, "cudaEventQuery");
}

int cx_cuda_event_synchronize(void* event) {
  if (!event) return bad_arg("cudaEventSynchronize");
  return check(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize");
}

int cx_cuda_ipc_get_event_handle(void* event, unsigned char* handle64) {
  static_assert(sizeof(cudaIpcEventHandle_t) == 64, "CUDA IPC event handles are 64 bytes");
  if (!event || !handle64) return bad_arg("cudaIpcGetEventHandle");
  cudaIpcEventHandle_t h;
  if (int rc = check(cudaIpcGetEventHandle(&h, as_event(event)), "cudaIpcGetEventHandle"))
    return rc;
  memcpy(handle64, &h, sizeof h);
  return CX_OK;
}

int cx_cuda_ipc_open_event_handle(const unsigned char* handle64, void** event) {
  if (!handle64 || !event) return bad_arg("cudaIpcOpenEventHandle");
  cudaIpcEventHandle_t h;
  memcpy(&h, handle64, sizeof h);
  cudaEvent_t e;
  *event = nullptr;
  if (int rc = check(cudaIpcOpenEventHandle(&e, h), "cudaIpcOpenEventHandle")) return rc;
  *event = e;
  return CX_OK;
}

}  // extern "C"
