// Internal C++ interface of the CPU copy/reduce kernels, for other native code in libcollectx
// (the CPU executor). The public C ABI (collectx.h) wraps these with argument checks; these do
// only the checks that are free (codes), so callers in hot loops pay nothing extra.
#pragma once

#include <stddef.h>

#include "collectx.h"

// dst[i] = srcs[0][i] op ... op srcs[k-1][i] for i < n (left to right). k == 1 copies.
// dst may equal srcs[0] exactly (in-place accumulate); other overlaps are not allowed.
// Returns CX_OK, CX_ERR_DTYPE, CX_ERR_OP or CX_ERR_ARG (k < 1).
int cx_reduce_impl(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op);

// memcpy for disjoint buffers; dst == src is a no-op.
void cx_copy_impl(void* dst, const void* src, size_t nbytes);

// Bytes per element of a cx_dtype code, 0 for an unknown code.
size_t cx_dtype_size(int dtype);

// Floats: dst *= factor (float16/bfloat16 through float32, rounded once). Integers: factor must
// be 1/d for an integer d >= 1; dst /= d truncating toward zero. CX_ERR_ARG otherwise.
int cx_scale_impl(void* dst, size_t n, int dtype, double factor);

// Name of the vector ISA the kernels' clones run at on this CPU ("avx512f", "avx2", "default").
const char* cx_kernel_isa(void);
