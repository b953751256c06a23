// CPU copy / n-ary reduce / scale kernels.
//
// How it works: one template per job (reduce, scale) over dtype T and functor Op, compiled three
// times by GCC function multiversioning (target_clones: AVX-512F, AVX2, baseline SSE2); the
// loader's ifunc resolver picks the best clone for the CPU once, so the build stays portable
// (no -march=native) while simple loops still auto-vectorize at full width. The hot loops are
// always_inline helpers so they are compiled inside each clone with that clone's ISA.
//
// k-ary reductions walk the arrays in blocks that fit in L1: the first pass combines src0 and
// src1 into the block's accumulator, each further source is folded into it while it is still
// cached, and the result is written once. Native types (integers, float32/64) accumulate in dst
// itself; float16/bfloat16 accumulate in a float32 block on the stack and round once at the end.
// The order is left to right: ((src0 op src1) op src2) op ..., matching a numpy chain.
#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <string.h>

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

// ---- loops over one block (restrict: callers guarantee the pointers are distinct) ----------
template <class T, class Op>
CX_INLINE void combine2(T* __restrict d, const T* __restrict a, const T* __restrict b, size_t m) {
  for (size_t i = 0; i < m; i++) d[i] = Op::apply(a[i], b[i]);
}

template <class T, class Op>
CX_INLINE void fold_into(T* __restrict d, const T* __restrict b, size_t m) {
  for (size_t i = 0; i < m; i++) d[i] = Op::apply(d[i], b[i]);
}

template <class T, class Op>
CX_INLINE void load2_f32(float* __restrict acc, const T* __restrict a, const T* __restrict b,
                         size_t m) {
  for (size_t i = 0; i < m; i++) acc[i] = Op::apply(cx_load(a[i]), cx_load(b[i]));
}

template <class T, class Op>
CX_INLINE void fold_f32(float* __restrict acc, const T* __restrict b, size_t m) {
  for (size_t i = 0; i < m; i++) acc[i] = Op::apply(acc[i], cx_load(b[i]));
}

template <class T>
CX_INLINE void store_f32(T* __restrict d, const float* __restrict acc, size_t m) {
  for (size_t i = 0; i < m; i++) d[i] = cx_store<T>(acc[i]);
}

// ---- whole-array kernels, one clone per ISA ------------------------------------------------
// Types computed natively: dst is the accumulator. dst == srcs[0] folds src1 into it directly.
template <class T, class Op>
CX_CLONES void reduce_native(T* dst, const T* const* srcs, int k, size_t n) {
  const size_t block = kBlockBytes / sizeof(T);
  const bool in_place = dst == srcs[0];
  for (size_t off = 0; off < n; off += block) {
    size_t m = std::min(block, n - off);
    T* d = dst + off;
    if (in_place) fold_into<T, Op>(d, srcs[1] + off, m);
    else combine2<T, Op>(d, srcs[0] + off, srcs[1] + off, m);
    for (int s = 2; s < k; s++) fold_into<T, Op>(d, srcs[s] + off, m);
  }
}

// 16-bit floats: a float32 accumulator block on the stack, rounded once into dst. dst may be
// srcs[0] because each block of srcs[0] is fully read before that block of dst is written.
template <class T, class Op>
CX_CLONES void reduce_widened(T* dst, const T* const* srcs, int k, size_t n) {
  constexpr size_t block = kBlockBytes / sizeof(float);
  alignas(64) float acc[block];
  for (size_t off = 0; off < n; off += block) {
    size_t m = std::min(block, n - off);
    load2_f32<T, Op>(acc, srcs[0] + off, srcs[1] + off, m);
    for (int s = 2; s < k; s++) fold_f32<T, Op>(acc, srcs[s] + off, m);
    store_f32<T>(dst + off, acc, m);
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
    if constexpr (is_widened<T>::value) reduce_widened<T, Op>(d, s, k, n);
    else reduce_native<T, Op>(d, s, k, n);
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

void cx_copy_impl(void* dst, const void* src, size_t nbytes) {
  if (dst != src && nbytes != 0) memcpy(dst, src, nbytes);
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
