// CUDA executor: the GPU interpreter of the schedule IR, the same flat plan (cx_exec_plan) the
// CPU executor runs (native/src/executor.cpp), over IPC-mapped windows (layout cx_cuda_exec.h).
//
// How it works. A call is cut into tiles exactly as on the CPU. Per tile (epoch e), all queued on
// the caller's stream with no host wait:
//   1. stage: cudaMemcpyAsync of this tile of the user's input into my staging set e%2 (skipped
//      when no peer reads my input: the kernel then reads the user's buffer in place);
//   2. one interpreter kernel, one thread block per lane of my rank. Thread 0 of block 0 writes
//      my call descriptor (tile 0) and publishes ready=e; thread 0 of every block waits until
//      every peer's ready >= e and, on tile 0, compares the descriptors. Then each block walks its
//      lane: thread 0 waits for the instruction's deps (epoch-stamped flags of any rank, read
//      with system-scope acquire loads over IPC-mapped memory), __syncthreads, the whole block
//      copies / reduces (16-byte packs once every pointer is aligned), __syncthreads, thread 0
//      publishes the lane flag with a system-scope release store. Block 0 finally waits for the
//      instructions that write my output (fin_deps);
//   3. copy the tile out of my staging set into the user's output, then scale (avg).
//
// Cross-epoch safety is the CPU executor's argument, with stream order standing in for program
// order: kernel e starts only after kernel e-1 and its copy-out finished, so ready=e still means
// "done with e-1"; with the double buffer nobody writes set e%2 before everyone left e-2.
//
// Waits are bounded: a spin polls with __nanosleep back-off, and every few hundred polls checks
// the deadline (the GPU's global nanosecond timer), the abort word of the rank waited on, and my
// own status word (another block of mine failed). A failure is written to my window's status
// record (first writer wins) and, unless it is a per-call condition (mismatch, aborted call),
// to my abort word so peers stop too; the stream copies the record to pinned host memory.
//
// Several ranks may share one GPU (ranks as processes, or threads on separate streams): the
// grid is at most 32 blocks, so the kernels of all ranks fit on the device at once.
#include <cuda/atomic>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "collectx.h"
#include "cx_chunk.h"
#include "cx_cuda_exec.h"
#include "cx_ops.h"

namespace {

constexpr int kDefaultThreads = 512;
constexpr unsigned kCheckEvery = 256;  // polls between deadline / abort checks

// Everything a kernel needs, by value (well under the 4 KiB parameter limit).
struct KArgs {
  const int* words;            // packed plan on the device
  int nranks, rank, nchunks, nlanes, nfin;
  int off_lane, off_instrs, off_srcs, off_deps, off_fin;
  char* const* win;            // [nranks] window bases mapped here
  long long slot_off[3];       // byte offset of the input/output/scratch slot in a set
  long long set_off;           // byte offset of set e%2 after the control block
  long long tile_count, count, tile_off, tile_len;
  const char* user_in;         // when in_private: the user's input (whole message)
  char* user_out;              // when out_private: the user's output
  int wait_fin;                // 1: block 0 waits for fin_deps (this rank has an output)
  int first;                   // tile 0: write and compare call descriptors
  unsigned long long epoch, seq;
  unsigned long long desc[CX_CUDA_DESC_COMPARED];
  long long timeout_ns;
};

__device__ __forceinline__ cx_cuda_ctl* ctl_of(const KArgs& a, int r) {
  return reinterpret_cast<cx_cuda_ctl*>(a.win[r]);
}

__device__ __forceinline__ uint64_t load_acquire(uint64_t* p) {
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}

__device__ __forceinline__ void store_release(uint64_t* p, uint64_t v) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Records the first failure of this call in my status words (thread 0 of a block only).
// Returns status so callers can `return fail(...)`.
__device__ int fail(const KArgs& a, int status, int rank, int lane, int index) {
  cx_cuda_ctl* me = ctl_of(a, a.rank);
  if (atomicCAS(&me->status[0], 0, status) == 0) {
    me->status[1] = rank;
    me->status[2] = lane;
    me->status[3] = index;
    // Timeouts and dead peers leave ranks out of step: tell every peer to stop waiting on us.
    if (status == CX_EXEC_TIMEOUT || status == CX_EXEC_PEER_DEAD)
      store_release(&me->abort_word, CX_CUDA_ABORT_FATAL | uint64_t(a.rank));
    __threadfence_system();
  }
  return status;
}

// Spins until *word >= want. `peer` is the rank whose word it is (its abort word is watched).
__device__ int wait_word(const KArgs& a, uint64_t* word, uint64_t want, int peer, int lane,
                         int index, uint64_t deadline) {
  volatile int32_t* my_status = &ctl_of(a, a.rank)->status[0];
  for (unsigned polls = 1;; ++polls) {
    if (load_acquire(word) >= want) return CX_EXEC_OK;
    if (polls % kCheckEvery == 0) {
      if (*my_status != 0) return *my_status;  // another block of mine failed: stop quietly
      uint64_t ab = load_acquire(&ctl_of(a, peer)->abort_word);
      if ((ab & CX_CUDA_ABORT_FATAL) || ab == a.seq + 1)
        return fail(a, CX_EXEC_ABORTED, peer, lane, index);
      if (global_ns() > deadline) return fail(a, CX_EXEC_TIMEOUT, peer, lane, index);
    }
    if (polls > 64) __nanosleep(polls > 4096 ? 2000 : 200);
  }
}

__device__ int wait_deps(const KArgs& a, const int* deps, int n, int lane, int index,
                         uint64_t deadline) {
  for (int d = 0; d < n; ++d) {
    const int* dep = deps + 3 * d;
    uint64_t want = (a.epoch << 32) | uint64_t(dep[2] + 1);
    uint64_t* flag = &ctl_of(a, dep[0])->lane_flag[dep[1]][0];
    if (int rc = wait_word(a, flag, want, dep[0], lane, index, deadline)) return rc;
  }
  return CX_EXEC_OK;
}

// Thread 0 of each block: block 0 publishes (descriptor, ready); all wait for every peer's
// ready and, on tile 0, compare descriptors -- every block checks, so all stop on a mismatch.
__device__ int enter_tile(const KArgs& a, uint64_t deadline) {
  cx_cuda_ctl* me = ctl_of(a, a.rank);
  int slot = int(a.seq & 1);
  if (blockIdx.x == 0) {
    if (a.first)
      for (int i = 0; i < CX_CUDA_DESC_COMPARED; ++i) me->desc[slot][i] = a.desc[i];
    __threadfence_system();
    store_release(&me->ready, a.epoch);
  }
  for (int i = 1; i < a.nranks; ++i) {
    int r = (a.rank + i) % a.nranks;
    if (int rc = wait_word(a, &ctl_of(a, r)->ready, a.epoch, r, -1, -1, deadline)) return rc;
  }
  if (!a.first) return CX_EXEC_OK;
  for (int r = 0; r < a.nranks; ++r) {
    if (r == a.rank) continue;  // mine equals a.desc (and block 0 may not have written it yet)
    volatile uint64_t* d = ctl_of(a, r)->desc[slot];
    if (d[1] == CX_CUDA_ABORTED_CALL) return fail(a, CX_EXEC_ABORTED, r, -1, -1);
    for (int i = 0; i < CX_CUDA_DESC_COMPARED; ++i)
      if (d[i] != a.desc[i]) return fail(a, CX_EXEC_MISMATCH, r, -1, -1);
  }
  return CX_EXEC_OK;
}

// Device address of element `elem` (within a unit) of unit `unit` of rank r's buffer b.
__device__ __forceinline__ char* buf_addr(const KArgs& a, int r, int b, long long unit,
                                          long long elem, int es) {
  if (r == a.rank && b == 0 && a.user_in)
    return const_cast<char*>(a.user_in) + (unit * a.count + a.tile_off + elem) * es;
  if (r == a.rank && b == 1 && a.user_out)
    return a.user_out + (unit * a.count + a.tile_off + elem) * es;
  return a.win[r] + CX_CUDA_CTL_BYTES + a.set_off + a.slot_off[b] + (unit * a.tile_count + elem) * es;
}

template <int N> struct raw_of;
template <> struct raw_of<1> { typedef unsigned char type; };
template <> struct raw_of<2> { typedef unsigned short type; };
template <> struct raw_of<4> { typedef unsigned int type; };
template <> struct raw_of<8> { typedef unsigned long long type; };

// Loads bypass L1 (__ldcg): a peer may have rewritten a line this SM read earlier in the tile.
template <class T> __device__ __forceinline__ T load_elem(const T* p) {
  typedef typename raw_of<sizeof(T)>::type R;
  R bits = __ldcg(reinterpret_cast<const R*>(p));
  T v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

struct Piece {
  char* addr[CX_CUDA_MAX_SRCS + 1];  // [0] destination, then sources
  long long len;
  long long head;  // leading elements done one by one before the 16-byte packs
  int nsrc;
  int packed;      // 1: every pointer is equally misaligned, so packs start at `head`
};

// Elements [lo, hi) one by one, block-strided.
template <class T, class Op>
__device__ void block_scalar(const Piece& p, bool copy, long long lo, long long hi) {
  typedef typename cx_compute<T>::type C;
  T* dst = reinterpret_cast<T*>(p.addr[0]);
  for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    T first = load_elem(reinterpret_cast<const T*>(p.addr[1]) + i);
    if (copy) {
      dst[i] = first;
      continue;
    }
    C acc = cx_load(first);
    for (int s = 2; s <= p.nsrc; s++)
      acc = Op::apply(acc, cx_load(load_elem(reinterpret_cast<const T*>(p.addr[s]) + i)));
    dst[i] = cx_store<T>(acc);
  }
}

// The whole block: dst = src0 op src1 op ... (or a copy) over len elements. Chunk boundaries
// rarely fall on 16 bytes, but every ref of a piece usually sits at the same offset within its
// slot, so after a short scalar head all pointers are aligned together and move in uint4 packs.
template <class T, class Op>
__device__ void block_apply(const Piece& p, bool copy) {
  typedef typename cx_compute<T>::type C;
  constexpr int V = sizeof(uint4) / sizeof(T);
  const long long head = p.packed ? min(p.head, p.len) : p.len;
  const long long npacks = (p.len - head) / V;
  block_scalar<T, Op>(p, copy, 0, head);
  for (long long i = threadIdx.x; i < npacks; i += blockDim.x) {
    uint4 in = __ldcg(reinterpret_cast<const uint4*>(p.addr[1] + head * sizeof(T)) + i);
    if (!copy) {
      const T* e = reinterpret_cast<const T*>(&in);
      C acc[V];
#pragma unroll
      for (int v = 0; v < V; v++) acc[v] = cx_load(e[v]);
      for (int s = 2; s <= p.nsrc; s++) {
        uint4 more = __ldcg(reinterpret_cast<const uint4*>(p.addr[s] + head * sizeof(T)) + i);
        const T* m = reinterpret_cast<const T*>(&more);
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] = Op::apply(acc[v], cx_load(m[v]));
      }
      T* o = reinterpret_cast<T*>(&in);
#pragma unroll
      for (int v = 0; v < V; v++) o[v] = cx_store<T>(acc[v]);
    }
    reinterpret_cast<uint4*>(p.addr[0] + head * sizeof(T))[i] = in;
  }
  block_scalar<T, Op>(p, copy, head + npacks * V, p.len);
}

// One instruction, in pieces that stay inside one unit of every ref (units are not adjacent in
// the tiled layout) -- the CPU executor's run_instr, with thread s resolving ref s.
template <class T, class Op>
__device__ int run_instr(const KArgs& a, const int* in, Piece& p, int* bad) {
  const long long nch = a.nchunks, n = in[4];
  const int nsrc = in[6];
  const int* srcs = a.words + a.off_srcs + 4 * in[5];
  for (long long k = 0; k < n;) {
    long long m = n - k;
    for (int s = 0; s <= nsrc; ++s) {
      const int* ref = s == 0 ? in + 1 : srcs + 4 * (s - 1);
      m = min(m, nch - (ref[2] + k) % nch);
    }
    if (threadIdx.x == 0) *bad = 0;
    __syncthreads();
    for (int s = threadIdx.x; s <= nsrc; s += blockDim.x) {
      const int* ref = s == 0 ? in + 1 : srcs + 4 * (s - 1);
      long long j = ref[2] + k, unit = j / nch, i = j % nch;
      long long lo = cx_chunk_span(i, nch, a.tile_len).offset;
      long long hi = cx_chunk_span(i + m - 1, nch, a.tile_len).offset +
                     cx_chunk_span(i + m - 1, nch, a.tile_len).length;
      p.addr[s] = buf_addr(a, ref[0], ref[1], unit, lo, int(sizeof(T)));
      if (s == 0) p.len = hi - lo;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      p.nsrc = nsrc;
      unsigned mis = unsigned(reinterpret_cast<uintptr_t>(p.addr[0]) & 15u);
      p.packed = mis % sizeof(T) == 0;
      for (int s = 1; s <= nsrc; ++s)
        p.packed &= unsigned(reinterpret_cast<uintptr_t>(p.addr[s]) & 15u) == mis;
      p.head = ((16u - mis) & 15u) / sizeof(T);
      for (int s = 1; s <= nsrc; ++s) {  // refs of unequal element length: malformed plan
        const int* ref = srcs + 4 * (s - 1);
        long long i = (ref[2] + k) % nch;
        long long len = cx_range_span(i, m, nch, a.tile_len).length;
        if (len != p.len) *bad |= 1;
      }
    }
    __syncthreads();
    if (*bad & 1) return CX_EXEC_BADARG;
    if (p.len > 0) block_apply<T, Op>(p, in[0] == 0);
    __syncthreads();
    k += m;
  }
  return CX_EXEC_OK;
}

// 512 threads x at most 128 registers: every block of every rank sharing a GPU stays resident.
template <class T, class Op>
__global__ void __launch_bounds__(kDefaultThreads) interpret(KArgs a) {
  __shared__ Piece piece;
  __shared__ int rc, bad;
  const int lane = blockIdx.x;
  const uint64_t deadline = global_ns() + uint64_t(a.timeout_ns);
  cx_cuda_ctl* me = ctl_of(a, a.rank);
  // An earlier tile of this call failed: every later tile returns at once.
  if (threadIdx.x == 0) rc = *(volatile int32_t*)&me->status[0] ? -1 : enter_tile(a, deadline);
  __syncthreads();
  if (rc) return;
  const int* lane_off = a.words + a.off_lane;
  int begin = lane < a.nlanes ? lane_off[lane] : 0, end = lane < a.nlanes ? lane_off[lane + 1] : 0;
  for (int pc = begin; pc < end; ++pc) {
    const int* in = a.words + a.off_instrs + 9 * pc;
    if (threadIdx.x == 0)
      rc = wait_deps(a, a.words + a.off_deps + 3 * in[7], in[8], lane, pc - begin, deadline);
    __syncthreads();
    if (rc) return;
    int st = run_instr<T, Op>(a, in, piece, &bad);
    __syncthreads();  // every thread's writes done (and rc read) before the flag and next wait
    if (st) {
      if (threadIdx.x == 0) fail(a, st, a.rank, lane, pc - begin);
      return;
    }
    if (threadIdx.x == 0) {
      __threadfence_system();  // the block's writes (ordered by the barrier) before the flag
      store_release(&me->lane_flag[lane][0], (a.epoch << 32) | uint64_t(pc - begin + 1));
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.wait_fin)
    wait_deps(a, a.words + a.off_fin, a.nfin, -1, -1, deadline);
}

// Floats: x *= factor; integers: x /= d (factor = 1/d), truncating (cx_scale's rule).
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

// Host side of one call: the tile loop of cx_exec_run, queued on a stream.
struct Launch {
  const cx_cuda_exec_args* args;
  cudaStream_t stream;
  KArgs k;
  int es;

  template <class T, class Op> int run() {
    const cx_cuda_exec_args* c = args;
    const int* h = c->plan->header;
    int threads = c->threads > 0 ? c->threads : kDefaultThreads;
    long long ntiles = c->count == 0 ? 1 : (c->count + c->tile_count - 1) / c->tile_count;
    for (long long t = 0; t < ntiles; ++t) {
      k.epoch = c->epoch + uint64_t(t);
      k.first = t == 0;
      k.tile_off = t * c->tile_count;
      k.tile_len = std::min(c->tile_count, c->count - k.tile_off);
      k.set_off = c->set_bytes * (long long)(k.epoch & 1);
      if (int rc = stage(0, false)) return rc;
      interpret<T, Op><<<std::max(h[CX_PK_NLANES], 1), threads, 0, stream>>>(k);
      if (cudaGetLastError() != cudaSuccess) return CX_ERR_CUDA;
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
    if (!user || (out ? c->out_private : c->in_private) || k.tile_len == 0) return CX_OK;
    char* slot = static_cast<char*>(c->self_window) + CX_CUDA_CTL_BYTES + k.set_off + k.slot_off[buf];
    size_t nbytes = size_t(k.tile_len) * es;
    for (long long u = 0; u < c->plan->header[CX_PK_UNITS0 + buf]; ++u) {
      char* uptr = const_cast<char*>(user) + (u * c->count + k.tile_off) * es;
      char* sptr = slot + u * c->tile_count * es;
      cudaError_t e = out ? cudaMemcpyAsync(uptr, sptr, nbytes, cudaMemcpyDeviceToDevice, stream)
                          : cudaMemcpyAsync(sptr, uptr, nbytes, cudaMemcpyDeviceToDevice, stream);
      if (e != cudaSuccess) return CX_ERR_CUDA;
    }
    return CX_OK;
  }

  template <class T> int scale_tile() {
    const cx_cuda_exec_args* c = args;
    long long divisor = c->scale > 0 ? (long long)(1.0 / c->scale + 0.5) : 0;
    if (divisor < 1) divisor = 1;
    unsigned blocks = unsigned(std::min<long long>(1024, (k.tile_len + 255) / 256));
    if (blocks == 0) return CX_OK;
    for (long long u = 0; u < c->plan->header[CX_PK_UNITS1]; ++u) {
      T* x = reinterpret_cast<T*>(static_cast<char*>(c->user_out) + (u * c->count + k.tile_off) * es);
      scale_kernel<T><<<blocks, 256, 0, stream>>>(x, k.tile_len, c->scale, divisor);
    }
    return cudaGetLastError() == cudaSuccess ? CX_OK : CX_ERR_CUDA;
  }
};

struct LaunchByDtype {
  Launch* l;
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
    const int* in = p->instrs + 9 * i;
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

__global__ void abort_kernel(cx_cuda_ctl* me, unsigned long long seq, unsigned long long epoch) {
  int slot = int(seq & 1);
  me->desc[slot][0] = seq;
  me->desc[slot][1] = CX_CUDA_ABORTED_CALL;
  store_release(&me->abort_word, seq + 1);
  __threadfence_system();
  store_release(&me->ready, epoch);
}

}  // namespace

extern "C" {

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
  long long sizes[5] = {plan->nlanes + 1, 9 * ninstr, 4 * nsrcs, 3 * ndeps, 3LL * plan->nfin};
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
  if (!c || !c->plan || !c->self_window || !c->d_windows || c->tile_count <= 0 || c->count < 0 ||
      c->set_bytes <= 0 || c->timeout_ns <= 0 || c->threads < 0 || c->threads > kDefaultThreads)
    return CX_ERR_ARG;
  if (c->op < 0 || c->op >= CX_NUM_OPS) return CX_ERR_OP;
  int es = int(cx_dtype_size_of(c->dtype));
  if (es == 0) return CX_ERR_DTYPE;
  const int* h = c->plan->header;
  long long units = (long long)h[CX_PK_UNITS0] + h[CX_PK_UNITS1] + h[CX_PK_UNITS2];
  if (units * c->tile_count * es > c->set_bytes) return CX_ERR_ARG;  // a tile must fit a set
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cx_cuda_ctl* me = static_cast<cx_cuda_ctl*>(c->self_window);
  if (cudaMemsetAsync(me->status, 0, sizeof me->status, s) != cudaSuccess) {
    cudaGetLastError();
    return CX_ERR_CUDA;
  }
  Launch l{c, s, {}, es};
  KArgs& k = l.k;
  k.words = c->plan->d_words;
  k.nranks = h[CX_PK_NRANKS], k.rank = h[CX_PK_RANK], k.nchunks = h[CX_PK_NCHUNKS];
  k.nlanes = h[CX_PK_NLANES], k.nfin = h[CX_PK_NFIN];
  k.off_lane = h[CX_PK_OFF_LANE], k.off_instrs = h[CX_PK_OFF_INSTRS];
  k.off_srcs = h[CX_PK_OFF_SRCS], k.off_deps = h[CX_PK_OFF_DEPS], k.off_fin = h[CX_PK_OFF_FIN];
  k.win = reinterpret_cast<char* const*>(c->d_windows);
  long long tb = c->tile_count * es;
  k.slot_off[0] = 0, k.slot_off[1] = h[CX_PK_UNITS0] * tb;
  k.slot_off[2] = (long long)(h[CX_PK_UNITS0] + h[CX_PK_UNITS1]) * tb;
  k.tile_count = c->tile_count, k.count = c->count;
  k.user_in = c->in_private ? static_cast<const char*>(c->user_in) : nullptr;
  k.user_out = c->out_private ? static_cast<char*>(c->user_out) : nullptr;
  k.wait_fin = c->user_out != nullptr;
  k.seq = c->seq;
  unsigned long long desc[CX_CUDA_DESC_COMPARED] = {c->seq, (unsigned long long)c->coll,
                                                    (unsigned long long)c->dtype,
                                                    (unsigned long long)c->op,
                                                    (unsigned long long)c->count,
                                                    (unsigned long long)c->root};
  std::copy(desc, desc + CX_CUDA_DESC_COMPARED, k.desc);
  k.timeout_ns = c->timeout_ns;
  LaunchByDtype by_dtype{&l, c->op};
  int rc = cx_dispatch_dtype(c->dtype, by_dtype);
  if (rc == CX_OK && c->status_host &&
      cudaMemcpyAsync(c->status_host, me->status, sizeof me->status, cudaMemcpyDeviceToHost, s) !=
          cudaSuccess)
    rc = CX_ERR_CUDA;
  if (rc != CX_OK) cudaGetLastError();
  return rc;
}

int cx_cuda_exec_abort(void* self_window, unsigned long long seq, unsigned long long epoch,
                       void* stream) {
  if (!self_window) return CX_ERR_ARG;
  abort_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<cx_cuda_ctl*>(self_window), seq, epoch);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? CX_OK : CX_ERR_CUDA;
}

}  // extern "C"
