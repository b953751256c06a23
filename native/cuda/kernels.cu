// CUDA copy and n-ary reduce kernels over the same functors as the CPU (cx_ops.h).
//
// Each kernel is a grid-stride loop. When dst and every source are 16-byte aligned, threads move
// whole 16-byte packs (uint4 loads/stores, 16/sizeof(T) elements each) and a second launch handles
// the tail that does not fill a pack; otherwise a scalar loop handles every element. Sources
// travel by value in a kernel parameter (at most CX_MAX_CUDA_SRCS pointers), so a launch needs no
// device allocation and no host-device copy. Everything is queued on the caller's stream.
#include <cuda_runtime.h>
#include <stdint.h>

#include "collectx.h"
#include "cx_ops.h"

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 1024;  // enough to fill an H100 (132 SMs x 2048 threads)

struct SrcPtrs {
  const void* p[CX_MAX_CUDA_SRCS];
};

unsigned blocks_for(size_t work) {
  size_t b = (work + kThreads - 1) / kThreads;
  return (unsigned)(b < kMaxBlocks ? (b == 0 ? 1 : b) : kMaxBlocks);
}

__device__ __forceinline__ size_t grid_start() { return blockIdx.x * (size_t)blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t grid_stride() { return (size_t)gridDim.x * blockDim.x; }

template <class T, class Op>
__global__ void reduce_scalar(T* dst, SrcPtrs srcs, int k, size_t first, size_t n) {
  for (size_t i = first + grid_start(); i < n; i += grid_stride()) {
    auto acc = cx_load(static_cast<const T*>(srcs.p[0])[i]);
    for (int s = 1; s < k; s++) acc = Op::apply(acc, cx_load(static_cast<const T*>(srcs.p[s])[i]));
    dst[i] = cx_store<T>(acc);
  }
}

template <class T, class Op>
__global__ void reduce_packs(T* dst, SrcPtrs srcs, int k, size_t npacks) {
  constexpr int V = sizeof(uint4) / sizeof(T);
  typedef typename cx_compute<T>::type C;
  for (size_t p = grid_start(); p < npacks; p += grid_stride()) {
    // memcpy between the pack and T lanes, not pointer casts: reading a uint4 through T* breaks
    // strict aliasing; nvcc keeps these copies in registers.
    T e[V];
    uint4 in = static_cast<const uint4*>(srcs.p[0])[p];
    memcpy(e, &in, sizeof in);
    C acc[V];
#pragma unroll
    for (int v = 0; v < V; v++) acc[v] = cx_load(e[v]);
    for (int s = 1; s < k; s++) {
      in = static_cast<const uint4*>(srcs.p[s])[p];
      memcpy(e, &in, sizeof in);
#pragma unroll
      for (int v = 0; v < V; v++) acc[v] = Op::apply(acc[v], cx_load(e[v]));
    }
    T o[V];
#pragma unroll
    for (int v = 0; v < V; v++) o[v] = cx_store<T>(acc[v]);
    uint4 out;
    memcpy(&out, o, sizeof out);
    static_cast<uint4*>(static_cast<void*>(dst))[p] = out;
  }
}

__global__ void copy_packs(uint4* dst, const uint4* src, size_t npacks) {
  for (size_t p = grid_start(); p < npacks; p += grid_stride()) dst[p] = src[p];
}

__global__ void copy_bytes(uint8_t* dst, const uint8_t* src, size_t first, size_t nbytes) {
  for (size_t i = first + grid_start(); i < nbytes; i += grid_stride()) dst[i] = src[i];
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int launch_status() { return cudaGetLastError() == cudaSuccess ? CX_OK : CX_ERR_CUDA; }

int copy_on(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0 || dst == src) return CX_OK;
  size_t done = 0;
  if (aligned16(dst) && aligned16(src)) {
    size_t npacks = nbytes / sizeof(uint4);
    if (npacks) copy_packs<<<blocks_for(npacks), kThreads, 0, stream>>>(
        static_cast<uint4*>(dst), static_cast<const uint4*>(src), npacks);
    done = npacks * sizeof(uint4);
  }
  if (done < nbytes) copy_bytes<<<blocks_for(nbytes - done), kThreads, 0, stream>>>(
      static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), done, nbytes);
  return launch_status();
}

struct CudaReduce {
  void* dst;
  SrcPtrs srcs;
  bool aligned;
  int k;
  size_t n;
  cudaStream_t stream;
  template <class T, class Op> int run() {
    T* d = static_cast<T*>(dst);
    constexpr size_t V = sizeof(uint4) / sizeof(T);
    size_t npacks = aligned ? n / V : 0;
    if (npacks) reduce_packs<T, Op><<<blocks_for(npacks), kThreads, 0, stream>>>(d, srcs, k, npacks);
    size_t done = npacks * V;
    if (done < n) reduce_scalar<T, Op><<<blocks_for(n - done), kThreads, 0, stream>>>(
        d, srcs, k, done, n);
    return launch_status();
  }
};

struct CudaReduceByDtype {
  CudaReduce call;
  int op;
  template <class T> int run() { return cx_dispatch_op<T>(op, call); }
};

// Forces every instantiation of these kernels to load now. Under CUDA's lazy module loading
// (the default since 12.2) a kernel's first launch may wait for the whole context to go idle;
// if a peer rank's executor kernel in this context is spinning on this rank, that wait never
// ends. Asking for a kernel's attributes loads it.
struct LoadReduce {
  template <class T, class Op> int run() {
    cudaFuncAttributes a;
    bool ok = cudaFuncGetAttributes(&a, reduce_packs<T, Op>) == cudaSuccess &&
              cudaFuncGetAttributes(&a, reduce_scalar<T, Op>) == cudaSuccess;
    return ok ? CX_OK : CX_ERR_CUDA;
  }
};

struct LoadReduceByDtype {
  template <class T> int run() {
    return cx_for_each_op<T>(LoadReduce{});
  }
};

}  // namespace

// Shared with executor.cu's cx_cuda_preload (not part of the C API).
int cx_cuda_kernels_preload() {
  cudaFuncAttributes a;
  if (cudaFuncGetAttributes(&a, copy_packs) != cudaSuccess ||
      cudaFuncGetAttributes(&a, copy_bytes) != cudaSuccess)
    return CX_ERR_CUDA;
  LoadReduceByDtype by_dtype;
  for (int d = 0; d < CX_NUM_DTYPES; d++)
    if (int rc = cx_dispatch_dtype(d, by_dtype)) return rc;
  return CX_OK;
}

extern "C" {

int cx_cuda_available(void) {
  int count = 0;
  // Static cudart loads the driver lazily: without one this returns an error, never aborts.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return count;
}

int cx_cuda_copy(void* dst, const void* src, size_t nbytes, void* stream) {
  if (nbytes != 0 && (!dst || !src)) return CX_ERR_ARG;
  return copy_on(dst, src, nbytes, static_cast<cudaStream_t>(stream));
}

int cx_cuda_reduce(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op,
                   void* stream) {
  size_t size = cx_dtype_size_of(dtype);
  if (size == 0) return CX_ERR_DTYPE;
  if (op < 0 || op >= CX_NUM_OPS) return CX_ERR_OP;
  if (k < 1 || k > CX_MAX_CUDA_SRCS || !srcs) return CX_ERR_ARG;
  if (n == 0) return CX_OK;
  if (!dst) return CX_ERR_ARG;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (k == 1) return copy_on(dst, srcs[0], n * size, s);
  CudaReduce call{dst, {}, aligned16(dst), k, n, s};
  for (int i = 0; i < k; i++) {
    if (!srcs[i] || (i > 0 && srcs[i] == dst)) return CX_ERR_ARG;
    call.srcs.p[i] = srcs[i];
    call.aligned = call.aligned && aligned16(srcs[i]);
  }
  CudaReduceByDtype by_dtype{call, op};
  return cx_dispatch_dtype(dtype, by_dtype);
}

}  // extern "C"
