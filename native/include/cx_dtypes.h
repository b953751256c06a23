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

// The two binary16 conversions follow Marat Dukhan's FP16 library (fp16_ieee_to_fp32_value,
// fp16_ieee_from_fp32_value): a few integer ops, one or two float ops and selects, no branches
// and no subnormal float arithmetic on the common path. Both are exact / correctly rounded for
// every input, with and without FMA contraction (each product is an exact power-of-2 scaling).

// IEEE binary16 -> binary32, exact (signaling NaNs come out quiet, as hardware converts them).
// Normals and Inf/NaN: shift exponent+mantissa into float position, scale by 2^-112 to rebias.
// Subnormals: place the mantissa under a 0.5 exponent and subtract 0.5.
CX_HD float cx_half_to_float(cx_half h) {
  const uint32_t w = (uint32_t)h.bits << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // exponent+mantissa at the top, sign shifted out
  const float normal = cx_bits_to_f32((two_w >> 4) + (0xE0u << 23)) * cx_bits_to_f32(0x07800000u);
  const float subnormal = cx_bits_to_f32((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t magnitude = two_w < (1u << 27) ? cx_f32_to_bits(subnormal) : cx_f32_to_bits(normal);
  return cx_bits_to_f32(sign | magnitude);
}

// binary32 -> binary16 with round-to-nearest-even; overflow gives Inf, NaN gives a quiet NaN.
// Scaling |f| by 2^112 then 2^-110 saturates huge values to Inf; adding a power of two chosen
// from f's exponent (at least 2^-14's) leaves exactly the half's mantissa bits in the float's
// low bits, so the float add itself rounds to nearest even, subnormal results included.
CX_HD cx_half cx_float_to_half(float f) {
  const uint32_t w = cx_f32_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  float base = cx_bits_to_f32(w & 0x7fffffffu) * cx_bits_to_f32(0x77800000u);  // * 2^112
  base = base * cx_bits_to_f32(0x08800000u);                                  // * 2^-110
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = cx_bits_to_f32((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = cx_f32_to_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  cx_half h;
  h.bits = (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
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
