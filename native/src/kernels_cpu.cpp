// CPU copy / n-ary reduce / scale kernels.
//
// How it works: one template per job (reduce, scale) over dtype T and functor Op, compiled three
// times by GCC function multiversioning (target_clones: AVX-512F, AVX2, baseline SSE2); the
// loader's ifunc resolver picks the best clone for the CPU once, so the build stays portable
// (no -march=native) while simple loops still auto-vectorize at full width. The hot loops are
// always_inline helpers so they are compiled inside each clone with that clone's ISA.
//
// k-ary reductions walk the arrays in blocks that fit in L1: the first pass combines src0 with
// up to seven more sources into the block's accumulator (so k <= 8 is ONE pass: k read streams
// and one write, against 3(k-1) streams for a chain of binary adds), further sources are folded
// into it seven at a time while it is still cached, and the result is written once. Native
// types (integers, float32/64) accumulate in dst itself; float16/bfloat16 accumulate in a
// float32 block on the stack and round once at the end.
// The order is left to right: ((src0 op src1) op src2) op ..., matching a numpy chain.
#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cx_kernels.h"
#include "cx_ops.h"

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
#define CX_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CX_CLONES
#endif
#define CX_INLINE static inline __attribute__((always_inline))

namespace {

// Accumulator block: 8 KiB keeps the block plus one line per source well inside a 32 KiB L1 and
// makes the float32 accumulator for 16-bit types a small stack array.
constexpr size_t kBlockBytes = 8192;
// Sources folded per pass over a block: each pass streams up to this many inputs at once, so a
// k-ary reduction makes ceil((k-1)/7) passes over its (cached) accumulator instead of k-1.
// Seven extra inputs plus the accumulator and the output are 9 streams, which the L1 (8-way)
// and the hardware prefetchers still follow (perf/kernels.py: about 2x chained numpy at k = 8).
constexpr int kFanIn = 7;

// cx_load/cx_store extended to the float32 accumulator (identity there).
CX_INLINE float widen(float x) { return x; }
template <class T> CX_INLINE typename cx_compute<T>::type widen(T x) { return cx_load(x); }
template <class Out, class C> CX_INLINE Out narrow(C x) {
  if constexpr (std::is_same<Out, C>::value) return x;
  else return cx_store<Out>(x);
}

// ---- one pass over a block (restrict: callers guarantee distinct pointers) ----------------
// out[i] = ((in[i] op s0[i]) op s1[i]) ... computed in the compute type, converted once.
template <class Op, class Out, class In, class... S>
CX_INLINE void pass(Out* __restrict out, const In* __restrict in, size_t m,
                    const S* __restrict... s) {
  for (size_t i = 0; i < m; i++) {
    auto x = widen(in[i]);
    ((x = Op::apply(x, widen(s[i]))), ...);
    out[i] = narrow<Out>(x);
  }
}

// io[i] = ((io[i] op s0[i]) op s1[i]) ...: the in-place form (io is both accumulator and output).
template <class Op, class IO, class... S>
CX_INLINE void pass_in_place(IO* __restrict io, size_t m, const S* __restrict... s) {
  for (size_t i = 0; i < m; i++) {
    auto x = widen(io[i]);
    ((x = Op::apply(x, widen(s[i]))), ...);
    io[i] = narrow<IO>(x);
  }
}

// One pass with G sources s[0..G) at element offset off; in == nullptr means in place on out.
template <class Op, class Out, class In, class T, size_t... I>
CX_INLINE void pass_fixed(Out* out, const In* in, size_t m, const T* const* s, size_t off,
                          std::index_sequence<I...>) {
  if (in == nullptr) pass_in_place<Op>(out, m, (s[I] + off)...);
  else pass<Op>(out, in, m, (s[I] + off)...);
}

// Folds g (1..kFanIn) sources s[0..g) at element offset off into one pass. The switch turns the
// run-time count into a compile-time one, so each loop keeps its sources in registers.
template <class Op, class Out, class In, class T>
CX_INLINE void pass_group(Out* out, const In* in, size_t m, const T* const* s, int g, size_t off) {
  static_assert(kFanIn == 7, "pass_group has one case per source count");
  switch (g) {
    case 1: return pass_fixed<Op>(out, in, m, s, off, std::make_index_sequence<1>{});
    case 2: return pass_fixed<Op>(out, in, m, s, off, std::make_index_sequence<2>{});
    case 3: return pass_fixed<Op>(out, in, m, s, off, std::make_index_sequence<3>{});
    case 4: return pass_fixed<Op>(out, in, m, s, off, std::make_index_sequence<4>{});
    case 5: return pass_fixed<Op>(out, in, m, s, off, std::make_index_sequence<5>{});
    case 6: return pass_fixed<Op>(out, in, m, s, off, std::make_index_sequence<6>{});
    default: return pass_fixed<Op>(out, in, m, s, off, std::make_index_sequence<7>{});
  }
}

// ---- whole-array kernels, one clone per ISA ------------------------------------------------
// Types computed natively: dst itself is the accumulator of each block. The first pass reads
// srcs[0] (or dst itself when dst == srcs[0]); later passes fold kFanIn sources at a time.
template <class T, class Op>
CX_CLONES void reduce_native(T* dst, const T* const* srcs, int k, size_t n) {
  const size_t block = kBlockBytes / sizeof(T);
  const bool in_place = dst == srcs[0];
  for (size_t off = 0; off < n; off += block) {
    size_t m = std::min(block, n - off);
    T* d = dst + off;
    int g = std::min(kFanIn, k - 1);
    pass_group<Op>(d, in_place ? nullptr : srcs[0] + off, m, srcs + 1, g, off);
    for (int s = 1 + g; s < k; s += kFanIn)
      pass_group<Op>(d, (const T*)nullptr, m, srcs + s, std::min(kFanIn, k - s), off);
  }
}

// Above this many bytes of traffic (k inputs + the output) a reduction cannot stay in the L3, and
// the output goes out with non-temporal stores: a normal store first reads each destination line
// (write-allocate), 10 streams of traffic for k = 8 where 9 suffice, and evicts the inputs.
// Measured on a Zen EPYC VM at 4-64 MiB per input, k = 8 float32: 1.9-2.0x a chain of binary
// adds with streaming stores against 1.65-1.8x without (staging the block in L1 and streaming
// it from there gained nothing, so the stores come straight from registers).
constexpr size_t kStreamingBytes = 24u << 20;

#if defined(__x86_64__) && defined(__GNUC__)
#define CX_HAVE_STREAMING 1
// Floating sum/prod only: for them GCC's vector arithmetic is exactly the scalar arithmetic,
// element by element and in the same order, so results equal reduce_native's bit for bit.
template <class T, class Op> struct streams_ok {
  static const bool value = std::is_floating_point<T>::value &&
                            (std::is_same<Op, cx_op_sum>::value || std::is_same<Op, cx_op_prod>::value);
};

// Written out rather than Op::apply: a 32-byte vector through a non-AVX function's ABI.
template <class Op, class V>
__attribute__((target("avx2"), always_inline)) inline V combine(V a, V b) {
  if constexpr (std::is_same<Op, cx_op_sum>::value) return a + b;
  else return a * b;
}

// Asks for the two cache lines one step of reduce_streaming reads from a source, kPrefetchBytes
// ahead. With eight sources the hardware prefetchers alone keep too few misses in flight: on a
// Xeon VM (inputs in its large L3), k = 8 float32 ran 1.63x a chain of binary adds at 16 MiB per
// input without this and 2.02x with it; 1.52x -> 1.68x at 64 MiB, 1.89x -> 1.95x at 4 MiB
// (perf/read_ceiling.cpp, "reduce" against "reduce+pf"). 8-16 KiB ahead was no better, and
// prefetching whole blocks ahead in the cached (non-streaming) path made it slower.
constexpr size_t kPrefetchBytes = 1024;
template <class T> CX_INLINE void prefetch_step(const T* p) {
  const char* c = reinterpret_cast<const char*>(p) + kPrefetchBytes;
  _mm_prefetch(c, _MM_HINT_T0);
  _mm_prefetch(c + 64, _MM_HINT_T0);
}

// 2..8 sources, dst aligned to sizeof(T); AVX2 only (the caller checks the CPU).
template <class T, class Op>
__attribute__((target("avx2"))) void reduce_streaming(T* dst, const T* const* srcs, int k,
                                                      size_t n) {
  typedef T V __attribute__((vector_size(32)));
  constexpr size_t L = 32 / sizeof(T);
  size_t head = std::min(n, ((32 - (uintptr_t(dst) & 31)) & 31) / sizeof(T));
  reduce_native<T, Op>(dst, srcs, k, head);  // scalar up to the first 32-byte boundary
  size_t i = head;
  // U vectors (two cache lines) per source per step: each step asks the memory system for two
  // whole lines of every input and writes two whole lines, which kept more misses in flight
  // than one vector per step (perf/kernels.py, k = 8 at 4-64 MiB: about 10% more bandwidth).
  constexpr int U = 4;
  for (; i + U * L <= n; i += U * L) {
    V acc[U], x;
    for (int j = 0; j < k; j++) prefetch_step(srcs[j] + i);
#pragma GCC unroll 4
    for (int u = 0; u < U; u++) memcpy(&acc[u], srcs[0] + i + u * L, sizeof x);
    for (int j = 1; j < k; j++) {
#pragma GCC unroll 4
      for (int u = 0; u < U; u++) {
        memcpy(&x, srcs[j] + i + u * L, sizeof x);
        acc[u] = combine<Op>(acc[u], x);
      }
    }
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + u * L),
                          reinterpret_cast<__m256i&>(acc[u]));
  }
  for (; i + L <= n; i += L) {
    V acc, x;
    memcpy(&acc, srcs[0] + i, sizeof acc);
    for (int j = 1; j < k; j++) {
      memcpy(&x, srcs[j] + i, sizeof x);
      acc = combine<Op>(acc, x);
    }
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i&>(acc));
  }
  _mm_sfence();  // non-temporal stores are weakly ordered: visible before we return
  if (i < n) {
    const T* tail[8];
    for (int j = 0; j < k; j++) tail[j] = srcs[j] + i;
    reduce_native<T, Op>(dst + i, tail, k, n - i);
  }
}

template <class T, class Op>
bool use_streaming(T* dst, int k, size_t n) {
  if constexpr (!streams_ok<T, Op>::value) {
    return false;
  } else {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    return avx2 && k >= 2 && k <= 8 && uintptr_t(dst) % sizeof(T) == 0 &&
           n * sizeof(T) * size_t(k + 1) > kStreamingBytes;
  }
}
#endif

// 16-bit floats: accumulate in float32 and round once. Up to 1 + kFanIn sources go straight
// from the inputs to dst in one pass; more use a float32 block on the stack, and the last pass
// rounds into dst. dst may be srcs[0]: each block of srcs[0] is read before it is written.
template <class T, class Op>
CX_CLONES void reduce_widened(T* dst, const T* const* srcs, int k, size_t n) {
  constexpr size_t block = kBlockBytes / sizeof(float);
  alignas(64) float acc[block];
  const bool in_place = dst == srcs[0];
  for (size_t off = 0; off < n; off += block) {
    size_t m = std::min(block, n - off);
    T* d = dst + off;
    if (k - 1 <= kFanIn) {
      pass_group<Op>(d, in_place ? nullptr : srcs[0] + off, m, srcs + 1, k - 1, off);
      continue;
    }
    pass_group<Op>(acc, srcs[0] + off, m, srcs + 1, kFanIn, off);
    int s = 1 + kFanIn;
    for (; k - s > kFanIn; s += kFanIn)
      pass_group<Op>(acc, (const float*)nullptr, m, srcs + s, kFanIn, off);
    pass_group<Op>(d, (const float*)acc, m, srcs + s, k - s, off);
  }
}

template <class T, class C>
CX_CLONES void scale_float(T* dst, size_t n, C factor) {
  for (size_t i = 0; i < n; i++) dst[i] = cx_store<T>(cx_load(dst[i]) * factor);
}

// Integer average: C division truncates toward zero, as NCCL's integer ncclAvg does.
template <class T>
void scale_int(T* dst, size_t n, int64_t divisor) {
  for (size_t i = 0; i < n; i++) dst[i] = (T)((int64_t)dst[i] / divisor);
}

template <class T> struct is_widened { static const bool value = false; };
template <> struct is_widened<cx_half> { static const bool value = true; };
template <> struct is_widened<cx_bf16> { static const bool value = true; };

struct ReduceCall {
  void* dst;
  const void* const* srcs;
  int k;
  size_t n;
  template <class T, class Op> int run() {
    T* d = static_cast<T*>(dst);
    const T* const* s = reinterpret_cast<const T* const*>(srcs);
    if constexpr (is_widened<T>::value) {
      reduce_widened<T, Op>(d, s, k, n);
    } else {
#ifdef CX_HAVE_STREAMING
      if (use_streaming<T, Op>(d, k, n)) {
        reduce_streaming<T, Op>(d, s, k, n);
        return CX_OK;
      }
#endif
      reduce_native<T, Op>(d, s, k, n);
    }
    return CX_OK;
  }
};

struct ReduceByDtype {
  ReduceCall call;
  int op;
  template <class T> int run() { return cx_dispatch_op<T>(op, call); }
};

// 1/factor as an integer divisor, or 0 when factor is not (close to) the reciprocal of one.
int64_t divisor_of(double factor) {
  if (!(factor > 0.0) || !(factor <= 1.0)) return 0;
  double inv = 1.0 / factor;
  int64_t d = llround(inv);
  return fabs(inv - (double)d) <= 1e-6 * (double)d ? d : 0;
}

struct ScaleCall {
  void* dst;
  size_t n;
  double factor;
  template <class T> int run() {
    T* d = static_cast<T*>(dst);
    if constexpr (std::is_integral<T>::value) {
      int64_t divisor = divisor_of(factor);
      if (divisor == 0) return CX_ERR_ARG;
      scale_int(d, n, divisor);
    } else if constexpr (std::is_same<T, double>::value) {
      scale_float<T, double>(d, n, factor);
    } else {
      scale_float<T, float>(d, n, (float)factor);
    }
    return CX_OK;
  }
};

}  // namespace

int cx_reduce_impl(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op) {
  if (k < 1) return CX_ERR_ARG;
  size_t size = cx_dtype_size_of(dtype);
  if (size == 0) return CX_ERR_DTYPE;
  if (op < 0 || op >= CX_NUM_OPS) return CX_ERR_OP;
  if (k == 1) {
    cx_copy_impl(dst, srcs[0], n * size);
    return CX_OK;
  }
  if (n == 0) return CX_OK;
  ReduceByDtype by_dtype{ReduceCall{dst, srcs, k, n}, op};
  return cx_dispatch_dtype(dtype, by_dtype);
}

// memcpy, except where glibc's is pathological. Its large copies use `rep movsb` on CPUs with
// ERMS/FSRM, and on AMD Zen 3 that runs 6-10x slower when dst - src mod 4096 is 1..31 (measured
// on an EPYC VM: 256 KiB in ~130 us instead of ~8 us). That is a common case: shared-memory
// staging slots are page-aligned and numpy buffers sit 16 bytes into a malloc'd page, so copies
// between the two hit it. A plain 64-byte block loop has no such cliff. Only AMD CPUs take it:
// on a Xeon VM the loop was 1.3-1.5x slower than glibc at 64 KiB-1 MiB with that skew (SSE2 or
// AVX2 code; even AVX-512 code was 5-10% slower), and the staging copies of a 2-rank 1 MiB
// allreduce spent most of their time in it.
namespace {
CX_CLONES void copy_blocks(char* d, const char* s, size_t nbytes) {
  size_t i = 0;
  for (; i + 64 <= nbytes; i += 64) {
    char block[64];
    __builtin_memcpy(block, s + i, 64);
    __builtin_memcpy(d + i, block, 64);
  }
  memcpy(d + i, s + i, nbytes - i);
}

bool rep_movsb_skew_cliff() {
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}
}  // namespace

void cx_copy_impl(void* dst, const void* src, size_t nbytes) {
  if (dst == src || nbytes == 0) return;
  static const bool cliff = rep_movsb_skew_cliff();
  uintptr_t skew = (uintptr_t(dst) - uintptr_t(src)) & 4095;
  if (!cliff || skew == 0 || skew >= 64 || nbytes < 1024) {
    memcpy(dst, src, nbytes);
    return;
  }
  copy_blocks(static_cast<char*>(dst), static_cast<const char*>(src), nbytes);
}

size_t cx_dtype_size(int dtype) { return cx_dtype_size_of(dtype); }

int cx_scale_impl(void* dst, size_t n, int dtype, double factor) {
  if (cx_dtype_size_of(dtype) == 0) return CX_ERR_DTYPE;
  ScaleCall call{dst, n, factor};
  return cx_dispatch_dtype(dtype, call);
}

const char* cx_kernel_isa(void) {
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
  __builtin_cpu_init();
  // Same preference order as the target_clones list above, so this names the clone that runs.
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
  return "default";
}
