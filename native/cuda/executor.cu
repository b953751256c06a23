// CUDA executor: the GPU interpreter of the schedule IR, the same flat plan (cx_exec_plan) the
// CPU executor runs (native/src/executor.cpp), over IPC-mapped windows (layout cx_cuda_exec.h).
//
// How it works. A call is cut into tiles exactly as on the CPU, and each tile into channels: every
// lane of my rank runs on `channels` thread blocks, each over its own contiguous share of the
// tile with lane flags of its own (NCCL's channels). Per tile (epoch e), all queued on the
// caller's stream with no host wait:
//   1. stage (staged calls only): cudaMemcpyAsync of this tile of the user's input into my
//      staging set e%2 (skipped when no peer reads my input);
//   2. one interpreter kernel, lanes x channels blocks. Thread 0 of block 0 writes my call
//      descriptor (tile 0), for a direct call where my user's buffers are, and publishes
//      ready=e; thread 0 of every block waits until every peer's ready >= e and, on tile 0,
//      compares the descriptors. Then each block walks its lane over its share: thread 0 waits
//      for the instruction's deps (epoch-stamped flags of its channel on any rank, read with
//      system-scope acquire loads), __syncthreads, the whole block copies / reduces (several
//      16-byte packs per thread in flight) and writes the pushed copies that follow in the lane
//      from the same registers, __syncthreads, thread 0 publishes the lane flag with a
//      system-scope release store. The last block to finish counts the call's epochs and
//      sequence number on the device (so a CUDA graph's replays are new calls);
//   3. staged calls: copy the tile out of my staging set into the user's output; then scale.
//
// Direct calls (ranks of one process: threads on one GPU, or GPUs with peer access) stage
// nothing: the kernel reads every rank's input and writes every rank's output where the users
// keep them, so a call without scratch is one tile and one launch. Since peers use my user's
// buffers, the last of my blocks waits for every peer's `done` before my kernel returns, and
// writes the call's status straight into the pinned host record.
//
// Cross-epoch safety of staged calls is the CPU executor's argument, with stream order standing
// in for program order: kernel e starts only after kernel e-1 and its copy-out finished, so
// ready=e still means "done with e-1"; with the double buffer nobody writes set e%2 before
// everyone left e-2. A direct call's done barrier ends every tile with every rank out of it.
//
// Waits are bounded: a spin polls with __nanosleep back-off, and every few hundred polls checks
// the deadline (the GPU's global nanosecond timer), the abort word of the rank waited on, and my
// own status word (another block of mine failed). A failure is written to my window's status
// record (first writer wins) and, unless it is a per-call condition (mismatch, aborted call),
// to my abort word so peers stop too.
//
// The interpreter itself (waits, descriptor checks, pieces, copy/reduce, lane walk, the way out)
// lives in interp.inc and is compiled twice: for the device (namespace gpu, the kernel) and for
// the host (namespace host, cx_cuda_exec_emulate: one CPU thread per block), so the CPU tests run
// the kernel's own logic over host-memory windows.
//
// Blocks wait on blocks of other ranks, so all must be resident at once: the engine gives each
// rank at most its share of the GPU's SMs, one 512-thread block per SM (runtime/cuda/geometry.py).
#include <cuda/atomic>
#include <cuda_runtime.h>
#include <stdint.h>

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "collectx.h"
#include "cx_chunk.h"
#include "cx_cuda_exec.h"
#include "cx_instr.h"
#include "cx_ops.h"

namespace {

constexpr int kDefaultThreads = 512;
constexpr unsigned kCheckEvery = 256;  // polls between deadline / abort checks
// 16-byte packs per thread in flight per source: fewer for 1-byte types, whose 16 values per
// pack would otherwise spill the accumulators out of the registers.
template <class T> constexpr int kUnroll = sizeof(T) == 1 ? 2 : 4;
constexpr int kGroup = 2;              // sources loaded together before they are added up

// Everything a kernel needs, by value (well under the 4 KiB parameter limit).
struct KArgs {
  const int* words;            // packed plan on the device
  int nranks, rank, nchunks, nlanes, nfin;
  int off_lane, off_instrs, off_srcs, off_deps, off_fin;
  char* const* win;            // [nranks] window bases mapped here
  long long slot_off[3];       // byte offset of the input/output/scratch slot in a set
  long long set_bytes;         // bytes of one staging set
  long long set_off;           // staged calls: byte offset of the set the host staged into
  long long tile_count, count, tile_off, tile_len;
  const char* user_in;         // when in_private: the user's input (whole message)
  char* user_out;              // when out_private: the user's output
  int wait_fin;                // 1: each channel waits for fin_deps (a staged call's output)
  int first;                   // tile 0: write and compare call descriptors
  int nchannels, lane_stride;  // blocks per lane; flags per channel
  int direct;                  // ranks use each other's user buffers in place (one process)
  int last;                    // the call's last tile: a direct call reports its status then
  cx_cuda_exec_status* status_host;  // pinned (mapped) host record of the call, or NULL
  int tile;                    // index of this tile in the call
  unsigned long long desc[CX_CUDA_DESC_COMPARED];  // [0], the sequence number, is the device's
  long long timeout_ns;
};

template <int N> struct raw_of;
template <> struct raw_of<1> { typedef unsigned char type; };
template <> struct raw_of<2> { typedef unsigned short type; };
template <> struct raw_of<4> { typedef unsigned int type; };
template <> struct raw_of<8> { typedef unsigned long long type; };

// A block's view of a call (interp.inc, channel_of): its share of every tile (elements
// [off, off + len) of it), its first lane flag, the call's epoch and sequence number as the
// device counts them, and the staging set's byte offset.
struct Chan {
  long long off, len;
  int flag0;
  unsigned long long epoch, seq;
  long long set_off;
};

struct Piece {
  char* addr[CX_CUDA_MAX_SRCS + 1];  // [0] destination, then sources
  char* push[CX_CUDA_MAX_PUSH];      // the pushed copies' destinations
  long long len;
  long long head;  // leading elements done one by one before the 16-byte packs
  int nsrc, npush;
  int packed;      // 1: every pointer is equally misaligned, so packs start at `head`
};

// Per-block scratch: __shared__ on the GPU, a local of the block's thread in the emulation.
struct Shared {
  Piece piece;
  Chan chan;
  int rc;
  int bad;
  int npush;
};

// The interpreter as device code (see interp.inc for the platform contract).
namespace gpu {
#define CX_FN __device__ __forceinline__
#define CX_TID threadIdx.x
#define CX_NTHREADS blockDim.x
#define CX_SYNC() __syncthreads()
#define CX_LOAD_ACQ(p) \
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*(p)).load(cuda::memory_order_acquire)
#define CX_STORE_REL(p, v) \
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*(p)).store((v), cuda::memory_order_release)
#define CX_FENCE() __threadfence_system()
#define CX_CAS(p, c, v) atomicCAS((p), (c), (v))
#define CX_ADD(p, v) atomicAdd((p), (v))
#define CX_NOW() gpu_ns()
#define CX_NAP(polls) \
  do { if ((polls) > 64) __nanosleep((polls) > 4096 ? 2000 : 200); } while (0)
#define CX_LDCG(p) __ldcg(p)
__device__ __forceinline__ uint64_t gpu_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#include "interp.inc"  // undefines the CX_* platform macros at its end
}  // namespace gpu

// The same interpreter as host code, for cx_cuda_exec_emulate: one CPU thread per block and one
// "thread" per block, so the barriers are no-ops and every loop runs whole in that thread.
namespace host {
#define CX_FN inline
#define CX_TID 0
#define CX_NTHREADS 1
#define CX_SYNC() ((void)0)
#define CX_LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define CX_STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define CX_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define CX_CAS(p, c, v) host_cas((p), (c), (v))
#define CX_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_ACQ_REL)
#define CX_NOW() host_ns()
#define CX_NAP(polls) do { if ((polls) > 64) sched_yield(); } while (0)
#define CX_LDCG(p) (*(p))
inline int host_cas(int* p, int expected, int desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;  // the old value, like atomicCAS
}
inline uint64_t host_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}
#include "interp.inc"  // undefines the CX_* platform macros at its end
}  // namespace host

// 512 threads x at most 128 registers: every block of every rank sharing a GPU stays resident.
template <class T, class Op>
__global__ void __launch_bounds__(kDefaultThreads) interpret(KArgs a) {
  __shared__ Shared sh;
  gpu::run_block<T, Op>(a, int(blockIdx.x), sh);
}

template <class T>
__global__ void scale_kernel(T* x, long long n, double factor, long long divisor) {
  typedef typename cx_compute<T>::type C;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    // In 64 bits: the divisor (the world size) may not fit the element type (int8, 200 ranks).
    if constexpr (std::is_integral<C>::value) x[i] = cx_store<T>(C((long long)cx_load(x[i]) / divisor));
    else x[i] = cx_store<T>(C(cx_load(x[i]) * C(factor)));
  }
}

// The GPU: copies and kernels queued on the caller's stream.
struct GpuBackend {
  cudaStream_t stream;
  int threads;
  int copy(void* dst, const void* src, size_t n) {
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream) == cudaSuccess
               ? CX_OK : CX_ERR_CUDA;
  }
  int alloc(void** p, size_t n) {
    return cudaMallocAsync(p, std::max<size_t>(n, 1), stream) == cudaSuccess ? CX_OK : CX_ERR_CUDA;
  }
  int release(void* p) { return cudaFreeAsync(p, stream) == cudaSuccess ? CX_OK : CX_ERR_CUDA; }
  template <class T, class Op> int tile(const KArgs& k) {
    interpret<T, Op><<<std::max(k.nlanes, 1) * k.nchannels, threads, 0, stream>>>(k);
    return cudaGetLastError() == cudaSuccess ? CX_OK : CX_ERR_CUDA;
  }
  template <class T> int scale(T* x, long long n, double factor, long long divisor) {
    unsigned blocks = unsigned(std::min<long long>(1024, (n + 255) / 256));
    if (blocks) scale_kernel<T><<<blocks, 256, 0, stream>>>(x, n, factor, divisor);
    return cudaGetLastError() == cudaSuccess ? CX_OK : CX_ERR_CUDA;
  }
};

// The CPU emulation: the same steps on host memory, one std::thread per block per tile.
struct HostBackend {
  int copy(void* dst, const void* src, size_t n) {
    memcpy(dst, src, n);
    return CX_OK;
  }
  int alloc(void** p, size_t n) {
    *p = malloc(std::max<size_t>(n, 1));
    return *p ? CX_OK : CX_ERR_ARG;
  }
  int release(void* p) {
    free(p);
    return CX_OK;
  }
  template <class T, class Op> int tile(const KArgs& k) {
    std::vector<std::thread> blocks;
    for (int b = 0; b < std::max(k.nlanes, 1) * k.nchannels; ++b)
      blocks.emplace_back([&k, b] {
        Shared sh;
        host::run_block<T, Op>(k, b, sh);
      });
    for (auto& t : blocks) t.join();
    return CX_OK;
  }
  template <class T> int scale(T* x, long long n, double factor, long long divisor) {
    typedef typename cx_compute<T>::type C;
    for (long long i = 0; i < n; ++i) {
      if constexpr (std::is_integral<C>::value) x[i] = cx_store<T>(C((long long)cx_load(x[i]) / divisor));
      else x[i] = cx_store<T>(C(cx_load(x[i]) * C(factor)));
    }
    return CX_OK;
  }
};

// One call: the tile loop of cx_exec_run (stage in, interpret, copy out, scale) on a backend.
template <class B>
struct Launch {
  const cx_cuda_exec_args* args;
  const int* h;  // packed-plan header
  B backend;
  KArgs k;
  int es;

  template <class T, class Op> int run() {
    const cx_cuda_exec_args* c = args;
    long long ntiles = c->count == 0 ? 1 : (c->count + c->tile_count - 1) / c->tile_count;
    if (c->copy_input && c->user_in && c->count > 0) return run_on_copy<T, Op>(ntiles);
    return run_tiles<T, Op>(ntiles);
  }

  // A direct call whose input overlaps its output: the kernel reads a copy of the input, made on
  // the stream in memory the stream allocates and frees in order.
  template <class T, class Op> int run_on_copy(long long ntiles) {
    size_t nbytes = size_t(h[CX_PK_UNITS0] * args->count) * es;
    void* copy = nullptr;
    if (int rc = backend.alloc(&copy, nbytes)) return rc;
    int rc = backend.copy(copy, args->user_in, nbytes);
    k.user_in = static_cast<const char*>(copy);
    if (rc == CX_OK) rc = run_tiles<T, Op>(ntiles);
    int freed = backend.release(copy);
    return rc != CX_OK ? rc : freed;
  }

  template <class T, class Op> int run_tiles(long long ntiles) {
    const cx_cuda_exec_args* c = args;
    for (long long t = 0; t < ntiles; ++t) {
      k.tile = int(t);
      k.first = t == 0;
      k.last = t == ntiles - 1;
      k.tile_off = t * c->tile_count;
      k.tile_len = std::min(c->tile_count, c->count - k.tile_off);
      k.set_off = c->set_bytes * (long long)((c->epoch + uint64_t(t)) & 1);
      if (int rc = stage(0, false)) return rc;
      if (int rc = backend.template tile<T, Op>(k)) return rc;
      if (int rc = stage(1, true)) return rc;
      if (c->user_out && c->scale != 1.0)
        if (int rc = scale_tile<T>()) return rc;
    }
    return CX_OK;
  }

  // Copies this tile between the user's buffer and my staging slot, unit by unit (skipped where
  // the kernel uses the user's buffer in place).
  int stage(int buf, bool out) {
    const cx_cuda_exec_args* c = args;
    const char* user = static_cast<const char*>(out ? c->user_out : c->user_in);
    if (!user || k.direct || (out ? c->out_private : c->in_private) || k.tile_len == 0)
      return CX_OK;
    char* slot = static_cast<char*>(c->self_window) + CX_CUDA_CTL_BYTES + k.set_off + k.slot_off[buf];
    size_t nbytes = size_t(k.tile_len) * es;
    for (long long u = 0; u < h[CX_PK_UNITS0 + buf]; ++u) {
      char* uptr = const_cast<char*>(user) + (u * c->count + k.tile_off) * es;
      char* sptr = slot + u * c->tile_count * es;
      if (int rc = out ? backend.copy(uptr, sptr, nbytes) : backend.copy(sptr, uptr, nbytes))
        return rc;
    }
    return CX_OK;
  }

  template <class T> int scale_tile() {
    const cx_cuda_exec_args* c = args;
    long long divisor = c->scale > 0 ? (long long)(1.0 / c->scale + 0.5) : 0;
    if (divisor < 1) divisor = 1;
    for (long long u = 0; u < h[CX_PK_UNITS1]; ++u) {
      T* x = reinterpret_cast<T*>(static_cast<char*>(c->user_out) + (u * c->count + k.tile_off) * es);
      if (int rc = backend.template scale<T>(x, k.tile_len, c->scale, divisor)) return rc;
    }
    return CX_OK;
  }
};

template <class B>
struct LaunchByDtype {
  Launch<B>* l;
  int op;
  template <class T> int run() { return cx_dispatch_op<T>(op, *l); }
};

// Structural checks of a flat plan: everything the kernel indexes stays in range.
int check_plan(const cx_exec_plan* p, long long* nsrcs, long long* ndeps) {
  if (!p || p->nranks < 1 || p->nranks > CX_CUDA_MAX_RANKS || p->rank < 0 ||
      p->rank >= p->nranks || p->nchunks < 1 || p->nlanes < 0 || p->nlanes > CX_CUDA_MAX_LANES ||
      p->nfin < 0 || !p->lane_off || (p->nfin && !p->fin_deps))
    return CX_ERR_ARG;
  long long ninstr = p->lane_off[p->nlanes];
  *nsrcs = *ndeps = 0;
  for (int l = 0; l < p->nlanes; ++l)
    if (p->lane_off[l] > p->lane_off[l + 1] || p->lane_off[0] != 0) return CX_ERR_ARG;
  auto ref_ok = [p](const int* r) {
    return r[0] >= 0 && r[0] < p->nranks && r[1] >= 0 && r[1] <= 2 && r[2] >= 0 && r[3] >= 0;
  };
  auto dep_ok = [p](const int* d) {
    return d[0] >= 0 && d[0] < p->nranks && d[1] >= 0 && d[1] < CX_CUDA_MAX_LANES && d[2] >= 0;
  };
  for (long long i = 0; i < ninstr; ++i) {
    const int* in = p->instrs + CX_IN_WORDS * i;
    if ((in[0] != 0 && in[0] != 1) || !ref_ok(in + 1) || in[6] < 1 ||
        in[6] > CX_CUDA_MAX_SRCS || in[5] < 0 || in[7] < 0 || in[8] < 0)
      return CX_ERR_ARG;
    for (int s = 0; s < in[6]; ++s)
      if (!ref_ok(p->srcs + 4 * (in[5] + s))) return CX_ERR_ARG;
    for (int d = 0; d < in[8]; ++d)
      if (!dep_ok(p->deps + 3 * (in[7] + d))) return CX_ERR_ARG;
    *nsrcs = std::max<long long>(*nsrcs, in[5] + in[6]);
    *ndeps = std::max<long long>(*ndeps, in[7] + in[8]);
  }
  for (int f = 0; f < p->nfin; ++f)
    if (!dep_ok(p->fin_deps + 3 * f)) return CX_ERR_ARG;
  return CX_OK;
}

// Rejects the call after this rank's last: its sequence number and epoch from the device's
// counters, as the call's own kernel would have taken them.
__global__ void abort_kernel(cx_cuda_ctl* me) {
  unsigned long long seq = me->calls_done, epoch = me->epochs_used + 1;
  int slot = int(seq & 1);
  me->desc[slot][0] = seq;
  me->desc[slot][1] = CX_CUDA_ABORTED_CALL;
  typedef cuda::atomic_ref<uint64_t, cuda::thread_scope_system> ref;
  ref(me->abort_word).store(seq + 1, cuda::memory_order_release);
  __threadfence_system();
  ref(me->ready).store(epoch, cuda::memory_order_release);
}

// Channels and flags per channel of a call (0 means the default).
int channels_of(const cx_cuda_exec_args* c) { return c->channels > 0 ? c->channels : 1; }
int lane_stride_of(const cx_cuda_exec_args* c) {
  return c->lane_stride > 0 ? c->lane_stride : CX_CUDA_MAX_LANES;  // the same on every rank
}

// Argument checks shared by the launch and the emulation; sets the element size.
int check_call(const cx_cuda_exec_args* c, const int* h, int* es) {
  if (!c->self_window || !c->d_windows || c->tile_count <= 0 || c->count < 0 ||
      c->set_bytes <= 0 || c->timeout_ns <= 0 || c->threads < 0 || c->threads > kDefaultThreads ||
      c->channels < 0 || c->lane_stride < 0 || (c->copy_input && !c->direct))
    return CX_ERR_ARG;
  if (h[CX_PK_NLANES] > lane_stride_of(c) ||
      (long long)channels_of(c) * lane_stride_of(c) > CX_CUDA_MAX_FLAGS)
    return CX_ERR_ARG;
  if (c->op < 0 || c->op >= CX_NUM_OPS) return CX_ERR_OP;
  *es = int(cx_dtype_size_of(c->dtype));
  if (*es == 0) return CX_ERR_DTYPE;
  // A tile's slots must fit a set: all three staged, the scratch alone in a direct call.
  long long units = c->direct ? (long long)h[CX_PK_UNITS2]
                              : (long long)h[CX_PK_UNITS0] + h[CX_PK_UNITS1] + h[CX_PK_UNITS2];
  if (units * c->tile_count * *es > c->set_bytes) return CX_ERR_ARG;
  return CX_OK;
}

// The kernel's view of one call (tile fields are set per tile by Launch::run).
KArgs make_kargs(const cx_cuda_exec_args* c, const int* h, const int* words, int es) {
  KArgs k{};
  k.words = words;
  k.nranks = h[CX_PK_NRANKS], k.rank = h[CX_PK_RANK], k.nchunks = h[CX_PK_NCHUNKS];
  k.nlanes = h[CX_PK_NLANES], k.nfin = h[CX_PK_NFIN];
  k.off_lane = h[CX_PK_OFF_LANE], k.off_instrs = h[CX_PK_OFF_INSTRS];
  k.off_srcs = h[CX_PK_OFF_SRCS], k.off_deps = h[CX_PK_OFF_DEPS], k.off_fin = h[CX_PK_OFF_FIN];
  k.win = reinterpret_cast<char* const*>(c->d_windows);
  long long tb = c->direct ? 0 : c->tile_count * es;  // direct: the scratch slot alone
  k.slot_off[0] = 0, k.slot_off[1] = h[CX_PK_UNITS0] * tb;
  k.slot_off[2] = (long long)(h[CX_PK_UNITS0] + h[CX_PK_UNITS1]) * tb;
  k.tile_count = c->tile_count, k.count = c->count;
  k.direct = c->direct != 0;
  k.nchannels = channels_of(c), k.lane_stride = lane_stride_of(c);
  k.user_in = c->direct || c->in_private ? static_cast<const char*>(c->user_in) : nullptr;
  k.user_out = c->direct || c->out_private ? static_cast<char*>(c->user_out) : nullptr;
  k.wait_fin = c->user_out != nullptr && !c->direct;  // a direct call waits in leave (done)
  k.status_host = c->status_host;
  k.set_bytes = c->set_bytes;
  unsigned long long desc[CX_CUDA_DESC_COMPARED] = {
      c->seq, (unsigned long long)c->coll, (unsigned long long)c->dtype,
      (unsigned long long)c->op, (unsigned long long)c->count, (unsigned long long)c->root};
  std::copy(desc, desc + CX_CUDA_DESC_COMPARED, k.desc);
  k.timeout_ns = c->timeout_ns;
  return k;
}

// Loads every executor kernel now: see cx_cuda_kernels_preload in kernels.cu for why.
struct LoadInterpret {
  template <class T, class Op> int run() {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, interpret<T, Op>) == cudaSuccess ? CX_OK : CX_ERR_CUDA;
  }
};

struct LoadExecByDtype {
  template <class T> int run() {
    if (int rc = cx_for_each_op<T>(LoadInterpret{})) return rc;
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, scale_kernel<T>) == cudaSuccess ? CX_OK : CX_ERR_CUDA;
  }
};

}  // namespace

int cx_cuda_kernels_preload();

extern "C" {

int cx_cuda_preload(void) {
  cudaFuncAttributes a;
  int rc = cudaFuncGetAttributes(&a, abort_kernel) == cudaSuccess ? CX_OK : CX_ERR_CUDA;
  LoadExecByDtype by_dtype;
  for (int d = 0; rc == CX_OK && d < CX_NUM_DTYPES; d++) rc = cx_dispatch_dtype(d, by_dtype);
  if (rc == CX_OK) rc = cx_cuda_kernels_preload();
  if (rc != CX_OK) cudaGetLastError();
  return rc;
}

int cx_cuda_ctl_bytes(long long* nbytes) {
  if (!nbytes) return CX_ERR_ARG;
  *nbytes = CX_CUDA_CTL_BYTES;
  return CX_OK;
}

int cx_cuda_exec_ntiles(long long count, long long tile_count, long long* ntiles) {
  if (!ntiles || count < 0 || tile_count <= 0) return CX_ERR_ARG;
  *ntiles = count == 0 ? 1 : (count + tile_count - 1) / tile_count;
  return CX_OK;
}

int cx_cuda_plan_pack(const cx_exec_plan* plan, int* out, long long cap, long long* needed) {
  long long nsrcs = 0, ndeps = 0;
  if (!needed) return CX_ERR_ARG;
  if (int rc = check_plan(plan, &nsrcs, &ndeps)) return rc;
  long long ninstr = plan->lane_off[plan->nlanes];
  long long sizes[5] = {plan->nlanes + 1, CX_IN_WORDS * ninstr, 4 * nsrcs, 3 * ndeps,
                        3LL * plan->nfin};
  const int* arrays[5] = {plan->lane_off, plan->instrs, plan->srcs, plan->deps, plan->fin_deps};
  long long total = CX_CUDA_PLAN_HEADER;
  for (long long s : sizes) total += s;
  *needed = total;
  if (total > 0x7fffffff) return CX_ERR_ARG;
  if (!out || cap < total) return cap == 0 && !out ? CX_OK : CX_ERR_ARG;
  int h[CX_CUDA_PLAN_HEADER] = {plan->nranks, plan->rank, plan->nchunks, plan->nlanes,
                                int(ninstr), int(nsrcs), int(ndeps), plan->nfin,
                                plan->units[0], plan->units[1], plan->units[2]};
  long long off = CX_CUDA_PLAN_HEADER;
  for (int i = 0; i < 5; ++i) {
    h[CX_PK_OFF_LANE + i] = int(off);
    std::copy(arrays[i], arrays[i] + sizes[i], out + off);
    off += sizes[i];
  }
  std::copy(h, h + CX_CUDA_PLAN_HEADER, out);
  return CX_OK;
}

int cx_cuda_plan_upload(const cx_exec_plan* plan, cx_cuda_plan** out) {
  if (!out) return CX_ERR_ARG;
  *out = nullptr;
  long long n = 0;
  if (int rc = cx_cuda_plan_pack(plan, nullptr, 0, &n)) return rc;
  std::vector<int> words(size_t(n), 0);
  if (int rc = cx_cuda_plan_pack(plan, words.data(), n, &n)) return rc;
  cx_cuda_plan* p = new cx_cuda_plan();
  p->nwords = n;
  if (cudaMalloc(&p->d_words, size_t(n) * sizeof(int)) != cudaSuccess ||
      cudaMemcpy(p->d_words, words.data(), size_t(n) * sizeof(int), cudaMemcpyHostToDevice) !=
          cudaSuccess) {
    cudaGetLastError();
    cudaFree(p->d_words);
    delete p;
    return CX_ERR_CUDA;
  }
  std::copy(words.begin(), words.begin() + CX_CUDA_PLAN_HEADER, p->header);
  *out = p;
  return CX_OK;
}

int cx_cuda_plan_free(cx_cuda_plan* plan) {
  if (!plan) return CX_OK;
  cudaError_t e = cudaFree(plan->d_words);
  delete plan;
  return e == cudaSuccess ? CX_OK : CX_ERR_CUDA;
}

int cx_cuda_exec_launch(const cx_cuda_exec_args* c, void* stream) {
  if (!c || !c->plan) return CX_ERR_ARG;
  const int* h = c->plan->header;
  int es = 0;
  if (int rc = check_call(c, h, &es)) return rc;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess ||
      (current != c->device && cudaSetDevice(c->device) != cudaSuccess)) {
    cudaGetLastError();
    return CX_ERR_CUDA;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cx_cuda_ctl* me = static_cast<cx_cuda_ctl*>(c->self_window);
  // Captured into a graph, the call runs at every replay: only a direct call can, since its
  // kernels take epochs and sets from the device's counters, where a staged call's copies were
  // aimed at the set of the epoch the host counted at capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) {
    cudaGetLastError();
    return CX_ERR_CUDA;
  }
  cx_cuda_exec_args* out = const_cast<cx_cuda_exec_args*>(c);
  out->captured = capture == cudaStreamCaptureStatusActive;
  if (c->captured && !c->direct) return CX_ERR_ARG;
  cx_cuda_exec_status* status_host = c->captured ? c->capture_status : c->status_host;
  // A direct call's last block writes the status record straight into status_host (pinned host
  // memory is mapped for the device), and its status stays 0 unless it fails: two stream
  // operations fewer per call. A staged call's tiles are separate launches, so the stream clears
  // the status before them and copies it out after them.
  if (!c->direct && cudaMemsetAsync(me->status, 0, sizeof me->status, s) != cudaSuccess) {
    cudaGetLastError();
    return CX_ERR_CUDA;
  }
  Launch<GpuBackend> l{c, h, {s, c->threads > 0 ? c->threads : kDefaultThreads},
                       make_kargs(c, h, c->plan->d_words, es), es};
  l.k.status_host = status_host;
  LaunchByDtype<GpuBackend> by_dtype{&l, c->op};
  int rc = cx_dispatch_dtype(c->dtype, by_dtype);
  if (rc == CX_OK && c->status_host && !c->direct &&
      cudaMemcpyAsync(c->status_host, me->status, sizeof me->status, cudaMemcpyDeviceToHost, s) !=
          cudaSuccess)
    rc = CX_ERR_CUDA;
  if (rc == CX_OK && c->done_event && !c->captured &&
      cudaEventRecord(static_cast<cudaEvent_t>(c->done_event), s) != cudaSuccess)
    rc = CX_ERR_CUDA;
  if (rc != CX_OK) cudaGetLastError();
  return rc;
}

int cx_cuda_exec_poll(void* event, void* stream, int* state) {
  if (!state) return CX_ERR_ARG;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess) {
    cudaGetLastError();
    return CX_ERR_CUDA;
  }
  if (capture == cudaStreamCaptureStatusActive || !event) {
    *state = capture == cudaStreamCaptureStatusActive ? 2 : 0;
    return CX_OK;
  }
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e != cudaSuccess && e != cudaErrorNotReady) {
    cudaGetLastError();
    return CX_ERR_CUDA;
  }
  *state = e == cudaSuccess ? 0 : 1;
  return CX_OK;
}

int cx_cuda_exec_emulate(const cx_exec_plan* plan, const cx_cuda_exec_args* c) {
  long long n = 0;
  if (!c) return CX_ERR_ARG;
  if (int rc = cx_cuda_plan_pack(plan, nullptr, 0, &n)) return rc;
  std::vector<int> words(size_t(n), 0);
  if (int rc = cx_cuda_plan_pack(plan, words.data(), n, &n)) return rc;
  int es = 0;
  if (int rc = check_call(c, words.data(), &es)) return rc;
  cx_cuda_ctl* me = static_cast<cx_cuda_ctl*>(c->self_window);
  memset(me->status, 0, sizeof me->status);
  Launch<HostBackend> l{c, words.data(), {}, make_kargs(c, words.data(), words.data(), es), es};
  LaunchByDtype<HostBackend> by_dtype{&l, c->op};
  int rc = cx_dispatch_dtype(c->dtype, by_dtype);
  if (rc == CX_OK && c->status_host) memcpy(c->status_host, me->status, sizeof me->status);
  return rc;
}

int cx_cuda_exec_abort(void* self_window, unsigned long long seq, unsigned long long epoch,
                       void* stream) {
  if (!self_window) return CX_ERR_ARG;
  (void)seq, (void)epoch;  // the device counts them (abort_kernel)
  abort_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<cx_cuda_ctl*>(self_window));
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? CX_OK : CX_ERR_CUDA;
}

}  // extern "C"
