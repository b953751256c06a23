// Reduction functors, one definition for CPU and GPU (CX_HD).
//
// Each op is a struct with `apply(a, b)` over the *compute* type of a dtype: the element type
// itself for integers, float32/float64, and float32 for float16/bfloat16 (cx_compute<T> below says
// which, and load/store convert). So a k-ary fp16 reduction converts each input once, accumulates
// in float32 and rounds once at the end.
//
// Integer sum/prod go through the unsigned type: signed overflow is undefined in C++, and
// unsigned arithmetic gives the same wrap-around that numpy shows.
#pragma once

#include <type_traits>

#include "cx_dtypes.h"

template <class T> struct cx_compute { typedef T type; };
template <> struct cx_compute<cx_half> { typedef float type; };
template <> struct cx_compute<cx_bf16> { typedef float type; };

template <class T> CX_HD typename cx_compute<T>::type cx_load(T x) { return x; }
CX_HD float cx_load(cx_half x) { return cx_half_to_float(x); }
CX_HD float cx_load(cx_bf16 x) { return cx_bf16_to_float(x); }

template <class T> CX_HD T cx_store(typename cx_compute<T>::type x) { return x; }
template <> CX_HD cx_half cx_store<cx_half>(float x) { return cx_float_to_half(x); }
template <> CX_HD cx_bf16 cx_store<cx_bf16>(float x) { return cx_float_to_bf16(x); }

// Wrap-around arithmetic for integers, plain arithmetic for floats.
template <class C, bool = std::is_integral<C>::value> struct cx_arith {
  static CX_HD C add(C a, C b) { return a + b; }
  static CX_HD C mul(C a, C b) { return a * b; }
};
template <class C> struct cx_arith<C, true> {
  typedef typename std::make_unsigned<C>::type U;
  static CX_HD C add(C a, C b) { return (C)(U)((U)a + (U)b); }
  static CX_HD C mul(C a, C b) { return (C)(U)((U)a * (U)b); }
};

// min/max follow numpy's np.minimum/np.maximum for NaN: a NaN in either input propagates.
// (a != a) is the NaN test; for integers it is always false and folds away.
struct cx_op_sum {
  template <class C> static CX_HD C apply(C a, C b) { return cx_arith<C>::add(a, b); }
};
struct cx_op_prod {
  template <class C> static CX_HD C apply(C a, C b) { return cx_arith<C>::mul(a, b); }
};
struct cx_op_min {
  template <class C> static CX_HD C apply(C a, C b) {
    return (a != a) ? a : ((b < a || b != b) ? b : a);
  }
};
struct cx_op_max {
  template <class C> static CX_HD C apply(C a, C b) {
    return (a != a) ? a : ((b > a || b != b) ? b : a);
  }
};

// Calls fn.template operator()<T>() for a dtype code; returns CX_ERR_DTYPE for unknown codes.
// The same switch serves the CPU kernels and the CUDA launchers (host code only).
template <class Fn> inline int cx_dispatch_dtype(int dtype, Fn&& fn) {
  switch (dtype) {
    case CX_INT8: return fn.template run<int8_t>();
    case CX_UINT8: return fn.template run<uint8_t>();
    case CX_INT32: return fn.template run<int32_t>();
    case CX_INT64: return fn.template run<int64_t>();
    case CX_FLOAT16: return fn.template run<cx_half>();
    case CX_BFLOAT16: return fn.template run<cx_bf16>();
    case CX_FLOAT32: return fn.template run<float>();
    case CX_FLOAT64: return fn.template run<double>();
    default: return CX_ERR_DTYPE;
  }
}

// Calls fn.template run<T, Op>() for an op code (CX_AVG runs as CX_SUM, see collectx.h).
template <class T, class Fn> inline int cx_dispatch_op(int op, Fn&& fn) {
  switch (op) {
    case CX_SUM: case CX_AVG: return fn.template run<T, cx_op_sum>();
    case CX_PROD: return fn.template run<T, cx_op_prod>();
    case CX_MIN: return fn.template run<T, cx_op_min>();
    case CX_MAX: return fn.template run<T, cx_op_max>();
    default: return CX_ERR_OP;
  }
}

// Calls fn.template run<T, Op>() for every op code; the first failure is returned.
template <class T, class Fn> inline int cx_for_each_op(Fn&& fn) {
  for (int op = 0; op < CX_NUM_OPS; op++)
    if (int rc = cx_dispatch_op<T>(op, fn)) return rc;
  return CX_OK;
}
