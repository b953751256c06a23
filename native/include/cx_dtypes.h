// Element types shared by the CPU and CUDA code: the CX_HD macro, float16/bfloat16 storage types
// and their conversions to and from float32, and the dtype code -> element size table.
//
// The conversions are written with integer bit manipulation and selects rather than branches, so
// one definition compiles for the GPU and auto-vectorizes on the CPU (GCC turns the ternaries
// into blends); no F16C or CUDA half intrinsics are needed.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "collectx.h"

#if defined(__CUDACC__)
#define CX_HD __host__ __device__ __forceinline__
#else
#define CX_HD inline __attribute__((always_inline))
#endif

// Storage-only 16-bit floats: arithmetic always goes through float32.
struct cx_half { uint16_t bits; };
struct cx_bf16 { uint16_t bits; };

CX_HD float cx_bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

CX_HD uint32_t cx_f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// IEEE binary16 -> binary32, exact for every input (subnormals renormalized, NaN payload kept).
// Method: move exponent+mantissa into float position and rebias; Inf/NaN get the rest of the
// exponent range; subnormals are fixed by one float subtraction of the implicit bit.
CX_HD float cx_half_to_float(cx_half h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = (uint32_t)(h.bits & 0x7fffu) << 13;
  uint32_t exp = o & shifted_exp;
  o += (127u - 15u) << 23;
  uint32_t inf_nan = o + ((128u - 16u) << 23);
  uint32_t sub = cx_f32_to_bits(cx_bits_to_f32(o + (1u << 23)) - cx_bits_to_f32(113u << 23));
  o = exp == shifted_exp ? inf_nan : (exp == 0 ? sub : o);
  return cx_bits_to_f32(o | ((uint32_t)(h.bits & 0x8000u) << 16));
}

// binary32 -> binary16 with round-to-nearest-even; overflow gives Inf, NaN stays a (quiet) NaN.
// Subnormal results are rounded by the FPU itself: adding a magic constant lines the half's
// subnormal LSB up with the float's LSB, so the float add does the RNE rounding.
CX_HD cx_half cx_float_to_half(float f) {
  const uint32_t f32_inf = 255u << 23;
  const uint32_t f16_max = (127u + 16u) << 23;
  const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = cx_f32_to_bits(f);
  uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t special = u > f32_inf ? 0x7e00u : 0x7c00u;
  uint32_t sub = cx_f32_to_bits(cx_bits_to_f32(u) + cx_bits_to_f32(denorm_magic)) - denorm_magic;
  uint32_t mant_odd = (u >> 13) & 1u;
  uint32_t norm = (u + ((uint32_t)(15 - 127) << 23) + 0xfffu + mant_odd) >> 13;
  uint32_t o = u >= f16_max ? special : (u < (113u << 23) ? sub : norm);
  cx_half h;
  h.bits = (uint16_t)(o | (sign >> 16));
  return h;
}

CX_HD float cx_bf16_to_float(cx_bf16 b) { return cx_bits_to_f32((uint32_t)b.bits << 16); }

// binary32 -> bfloat16 with round-to-nearest-even; NaN is kept quiet (never rounds to Inf).
CX_HD cx_bf16 cx_float_to_bf16(float f) {
  uint32_t u = cx_f32_to_bits(f);
  bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  cx_bf16 b;
  b.bits = (uint16_t)(is_nan ? ((u >> 16) | 0x40u) : rounded);
  return b;
}

// Element size of each cx_dtype code, 0 for codes outside the enum.
CX_HD size_t cx_dtype_size_of(int dtype) {
  switch (dtype) {
    case CX_INT8: case CX_UINT8: return 1;
    case CX_FLOAT16: case CX_BFLOAT16: return 2;
    case CX_INT32: case CX_FLOAT32: return 4;
    case CX_INT64: case CX_FLOAT64: return 8;
    default: return 0;
  }
}
