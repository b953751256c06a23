// The public C ABI of the kernels (collectx.h): argument checks around the internal kernels,
// version and build information, and CUDA entry points that report CX_ERR_NO_CUDA when the
// library was built without CUDA objects (so the ABI is the same in every build).
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

int cx_copy(void* dst, const void* src, size_t nbytes) {
  if (nbytes != 0 && (!dst || !src)) return CX_ERR_ARG;
  cx_copy_impl(dst, src, nbytes);
  return CX_OK;
}

int cx_reduce(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op) {
  if (k < 1 || !srcs) return CX_ERR_ARG;
  if (n != 0) {
    if (!dst) return CX_ERR_ARG;
    for (int s = 0; s < k; s++) {
      if (!srcs[s]) return CX_ERR_ARG;
      // Only srcs[0] may be dst (in-place accumulate); the kernels read it before writing.
      if (s > 0 && srcs[s] == dst) return CX_ERR_ARG;
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
