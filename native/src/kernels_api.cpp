// The public C ABI of the kernels (collectx.h): argument checks around the internal kernels,
// version and build information, and CUDA entry points that report CX_ERR_NO_CUDA when the
// library was built without CUDA objects (so the ABI is the same in every build).
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "collectx.h"
#include "cx_kernels.h"

#ifndef CX_VERSION_MAJOR
#define CX_VERSION_MAJOR 0
#define CX_VERSION_MINOR 0
#define CX_VERSION_PATCH 0
#endif
#ifndef CX_COMPILER_ID
#define CX_COMPILER_ID "unknown"
#endif
#ifndef CX_HAVE_CUDA
#define CX_HAVE_CUDA 0
#endif
#ifndef CX_CUDA_ARCHS
#define CX_CUDA_ARCHS ""
#endif

extern "C" {

int cx_version(int* version) {
  if (!version) return CX_ERR_ARG;
  *version = CX_VERSION_MAJOR * 10000 + CX_VERSION_MINOR * 100 + CX_VERSION_PATCH;
  return CX_OK;
}

int cx_build_info(char* buf, size_t len) {
  if (!buf || len == 0) return CX_ERR_ARG;
  int need = snprintf(buf, len, "version=%d.%d.%d;compiler=%s;isa=%s;cuda_objects=%d;cuda_archs=%s",
                      CX_VERSION_MAJOR, CX_VERSION_MINOR, CX_VERSION_PATCH, CX_COMPILER_ID,
                      cx_kernel_isa(), CX_HAVE_CUDA, CX_HAVE_CUDA ? CX_CUDA_ARCHS : "");
  return (need < 0 || (size_t)need >= len) ? CX_ERR_ARG : CX_OK;
}

size_t cx_dtype_bytes(int dtype) { return cx_dtype_size(dtype); }

// True when [a, a + na) and [b, b + nb) share a byte.
static bool ranges_overlap(const void* a, size_t na, const void* b, size_t nb) {
  uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
  return na != 0 && nb != 0 && pa < pb + nb && pb < pa + na;
}

int cx_copy(void* dst, const void* src, size_t nbytes) {
  if (nbytes != 0 && (!dst || !src)) return CX_ERR_ARG;
  // memcpy is undefined for partial overlap; dst == src is a no-op.
  if (dst != src && ranges_overlap(dst, nbytes, src, nbytes)) return CX_ERR_ARG;
  cx_copy_impl(dst, src, nbytes);
  return CX_OK;
}

int cx_reduce(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op) {
  if (k < 1 || !srcs) return CX_ERR_ARG;
  if (n != 0) {
    if (!dst) return CX_ERR_ARG;
    size_t size = cx_dtype_size(dtype);
    if (size == 0) return CX_ERR_DTYPE;
    size_t nbytes = n * size;
    for (int s = 0; s < k; s++) {
      if (!srcs[s]) return CX_ERR_ARG;
      // Only srcs[0] may be dst, and exactly (in-place accumulate: the kernels read each block
      // before writing it); any other overlap would read partly written results. Checking here
      // lets the Python wrapper skip its own overlap test on the fast path.
      if (s == 0 && srcs[0] == dst) continue;
      if (ranges_overlap(dst, nbytes, srcs[s], nbytes)) return CX_ERR_ARG;
    }
  }
  return cx_reduce_impl(dst, srcs, k, n, dtype, op);
}

int cx_scale(void* dst, size_t n, int dtype, double factor) {
  if (n != 0 && !dst) return CX_ERR_ARG;
  return cx_scale_impl(dst, n, dtype, factor);
}

#if !CX_HAVE_CUDA
int cx_cuda_available(void) { return 0; }

int cx_cuda_copy(void*, const void*, size_t, void*) { return CX_ERR_NO_CUDA; }

int cx_cuda_reduce(void*, const void* const*, int, size_t, int, int, void*) {
  return CX_ERR_NO_CUDA;
}
#endif

}  // extern "C"
