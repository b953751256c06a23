/* collectx C ABI: the one header cffi reads (collectx/_native.py strips the preprocessor lines and
 * the extern "C" guard lines, then passes the rest to ffi.cdef). So: plain declarations and
 * enums only, no #define constants, no inline code, no C++ types.
 *
 * Every entry point returns an int status: CX_OK (0) or a negative cx_status code.
 * Counts (n) are in elements of the given dtype; sizes (nbytes) are in bytes.
 */
#ifndef COLLECTX_H
#define COLLECTX_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  CX_INT8 = 0,
  CX_UINT8 = 1,
  CX_INT32 = 2,
  CX_INT64 = 3,
  CX_FLOAT16 = 4,
  CX_BFLOAT16 = 5,
  CX_FLOAT32 = 6,
  CX_FLOAT64 = 7,
  CX_NUM_DTYPES = 8
} cx_dtype;

/* CX_AVG reduces like CX_SUM; the caller divides once at the end with cx_scale (1/n), so partial
 * sums from several steps are never divided twice. */
typedef enum {
  CX_SUM = 0,
  CX_PROD = 1,
  CX_MIN = 2,
  CX_MAX = 3,
  CX_AVG = 4,
  CX_NUM_OPS = 5
} cx_op;

typedef enum {
  CX_OK = 0,
  CX_ERR_DTYPE = -1,      /* dtype code outside cx_dtype */
  CX_ERR_OP = -2,         /* op code outside cx_op */
  CX_ERR_ARG = -3,        /* null pointer, k < 1, too many sources, bad factor, small buffer */
  CX_ERR_CUDA = -4,       /* a CUDA runtime call failed */
  CX_ERR_NO_CUDA = -5,    /* the library was built without CUDA objects */
  CX_ERR_NOMEM = -6,      /* an allocation or mapping failed */
  CX_ERR_TIMEOUT = -7,    /* a wait on a peer ran past its deadline */
  CX_ERR_PEER = -8,       /* a peer failed or aborted */
  CX_ERR_INTERNAL = -9    /* a broken invariant inside the library */
} cx_status;

/* The most sources one cx_cuda_reduce call takes (they travel as a kernel parameter). */
typedef enum { CX_MAX_CUDA_SRCS = 32 } cx_limits;

/* Library version as major*10000 + minor*100 + patch. */
int cx_version(int* version);

/* "key=value;key=value" text: version, compiler, isa (chosen at run time), cuda_objects (0/1),
 * cuda_archs. Returns CX_ERR_ARG (with the text truncated) when len is too small. */
int cx_build_info(char* buf, size_t len);

/* Size in bytes of one element of dtype, or 0 for an unknown code. */
size_t cx_dtype_bytes(int dtype);

/* dst[0:nbytes] = src[0:nbytes]. dst == src is a no-op; other overlaps are the caller's error. */
int cx_copy(void* dst, const void* src, size_t nbytes);

/* dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[k-1][i], for i < n, evaluated left to right.
 * k == 1 is a copy. dst may be srcs[0] exactly (accumulate in place); any other overlap between
 * dst and a source is the caller's error. float16/bfloat16 accumulate in float32 and round once.
 * Integers wrap around on overflow, like numpy. */
int cx_reduce(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op);

/* Floats: dst[i] *= factor. Integers: factor must be 1/d for an integer d >= 1 and
 * dst[i] /= d, truncating toward zero (NCCL's integer average). */
int cx_scale(void* dst, size_t n, int dtype, double factor);

/* Number of CUDA devices usable by this library: 0 without CUDA objects, driver or device.
 * Never fails and never aborts on a machine without a GPU. */
int cx_cuda_available(void);

/* Device-pointer versions of cx_copy / cx_reduce, queued on stream (a cudaStream_t, NULL for the
 * legacy default stream). srcs is a host array of k <= CX_MAX_CUDA_SRCS device pointers. The
 * calls return once the work is queued; synchronize the stream before reading dst. */
int cx_cuda_copy(void* dst, const void* src, size_t nbytes, void* stream);
int cx_cuda_reduce(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op,
                   void* stream);

/* ---- CPU executor (collectx/runtime; native/src/executor.cpp, layout in cx_executor.h) ----- */

/* Why a collective stopped: cx_exec_result.status (cx_exec_run returns the matching cx_status). */
typedef enum {
  CX_EXEC_OK = 0,
  CX_EXEC_TIMEOUT = 1,    /* the deadline passed while waiting (CX_ERR_TIMEOUT) */
  CX_EXEC_PEER_DEAD = 2,  /* result.rank's process is gone (CX_ERR_PEER) */
  CX_EXEC_ABORTED = 3,    /* result.rank set its abort word or aborted this call (CX_ERR_PEER) */
  CX_EXEC_MISMATCH = 4,   /* result.rank's call descriptor differs from ours (CX_ERR_PEER) */
  CX_EXEC_BADARG = 5,     /* malformed plan or call (CX_ERR_ARG) */
  CX_EXEC_KERNEL = 6      /* a copy/reduce kernel refused its arguments (CX_ERR_INTERNAL) */
} cx_exec_status;

/* Control block at the start of every rank's window; layout in cx_executor.h. */
typedef struct cx_ctl cx_ctl;

/* One rank's slice of a schedule, flattened once per schedule.
 * instrs: 9 int32 per instruction: op (0 copy, 1 reduce), dst rank, dst buf (0 input, 1 output,
 *   2 scratch), dst chunk, dst count, first source, number of sources, first dep, number of deps.
 * srcs: 4 int32 per source ref (rank, buf, chunk, count); deps: 3 int32 (rank, lane, index).
 * lane_off[nlanes + 1]: instruction range of each of this rank's lanes.
 * fin_deps: instructions (of any rank) after which this rank's output holds the result. */
typedef struct {
  int nranks;
  int rank;
  int nchunks;
  int nlanes;
  const int* lane_off;
  const int* instrs;
  const int* srcs;
  const int* deps;
  const int* fin_deps;
  int nfin;
  int units[3];           /* units per rank of input, output, scratch (scratch: max over ranks) */
} cx_exec_plan;

/* Every rank's window, mapped in this process. */
typedef struct {
  int nranks;
  int rank;
  cx_ctl** ctl;           /* [nranks] control blocks */
  char** data;            /* [nranks] start of staging set 0 */
  long long set_bytes;    /* bytes of one staging set (there are two) */
  int spin;               /* busy polls before yielding the CPU */
} cx_exec_window;

/* One collective call of this rank. */
typedef struct {
  int dtype;
  int op;
  long long count;        /* elements per unit of the whole message */
  long long tile_count;   /* elements per unit per tile (equal on every rank) */
  const void* user_in;    /* NULL: nothing to stage */
  void* user_out;         /* NULL: nothing to copy out */
  int in_private;         /* 1: no peer touches this rank's input; read user_in in place */
  int out_private;        /* 1: no peer touches this rank's output; write user_out in place */
  double scale;           /* != 1.0: multiply the output once complete (avg) */
  unsigned long long seq;       /* call sequence number; descriptor slot = seq & 1 */
  unsigned long long epoch;     /* epoch of the first tile; tile t uses epoch + t */
  long long deadline_ns;  /* CLOCK_MONOTONIC deadline (cx_exec_now_ns) */
} cx_exec_call;

typedef struct {
  int status;             /* cx_exec_status */
  int rank;               /* the peer involved, or -1 */
  unsigned long long epochs_used;  /* tiles begun, also on failure */
  int lane;               /* on timeout: the lane and instruction that was waiting */
  int index;
} cx_exec_result;

/* Runs this rank's part of one collective, every tile, with the GIL released by cffi. */
int cx_exec_run(const cx_exec_plan* plan, const cx_exec_window* win, const cx_exec_call* call,
                cx_exec_result* res);
/* CLOCK_MONOTONIC in nanoseconds, the clock of cx_exec_call.deadline_ns. */
long long cx_exec_now_ns(void);
/* 1 if the process exists and is not a zombie, else 0. */
int cx_exec_pid_alive(long long pid);

/* ---- end CPU executor ------------------------------------------------------------------------ */

#ifdef __cplusplus
}
#endif

#endif /* COLLECTX_H */
