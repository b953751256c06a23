/* CUDA executor: internal layout shared by native/cuda/executor.cu and window.cu, and mirrored by
 * collectx/runtime/cuda/window.py (which only needs CX_CUDA_CTL_BYTES, via cx_cuda_ctl_bytes).
 *
 * Window layout (per rank, one cudaMalloc allocation, exported to peers by CUDA IPC):
 *   [0, CX_CUDA_CTL_BYTES)        control block, struct cx_cuda_ctl below
 *   [CX_CUDA_CTL_BYTES, +2*set)   two staging sets (double buffer by epoch parity), each holding
 *                                 the input | output | scratch slots of one tile (only the
 *                                 scratch slot when the call is direct: see user_ptr)
 *
 * The words mean what they mean in the CPU executor (cx_executor.h): flags are
 * (epoch << 32 | instruction index + 1), `ready` is the epoch whose tile this rank has staged,
 * `abort_word` is seq+1 of a call this rank rejected or CX_ABORT_FATAL|rank after a failure.
 * A direct call (ranks of one process, which address each other's memory) publishes the user's
 * input and output in `user_ptr` before `ready`, so peers read and write them in place; its
 * blocks count themselves out in `exit_count`, the last one publishes `done` = epoch and waits
 * for every peer's, so no kernel returns while a peer may still touch its user's buffers.
 * Lane flags are per channel: flag ch * lane_stride + lane. A call's epoch and sequence number
 * are counted on the device (`epochs_used`, `calls_done`), so graph replays count as calls.
 * Each hot word sits on its own 128-byte line (the GPU's cache line and NVLink request size).
 */
#ifndef CX_CUDA_EXEC_H
#define CX_CUDA_EXEC_H

#include <stdint.h>

#include "collectx.h"

#define CX_CUDA_CTL_BYTES 65536
#define CX_CUDA_MAX_LANES 64
#define CX_CUDA_FLAGS_OFFSET 1024
#define CX_CUDA_MAX_FLAGS ((CX_CUDA_CTL_BYTES - CX_CUDA_FLAGS_OFFSET) / 128) /* channels x lanes */
#define CX_CUDA_MAX_PUSH 16        /* pushed copies fused into one instruction */
#define CX_CUDA_MAX_SRCS 64        /* sources of one reduce instruction (CPU executor: 64) */
#define CX_CUDA_MAX_RANKS 1024
#define CX_CUDA_DESC_WORDS 8
#define CX_CUDA_DESC_COMPARED 6    /* seq, collective, dtype, op, count, root */
#define CX_CUDA_ABORTED_CALL 0xFFFF /* descriptor collective code of a rejected call */
#define CX_CUDA_ABORT_FATAL (1ull << 63)
#define CX_CUDA_PLAN_HEADER 16     /* int32 words before the arrays in a packed plan */

struct cx_cuda_ctl {
  uint64_t ready;
  uint64_t pad0[15];
  uint64_t abort_word;
  uint64_t pad1[15];
  uint64_t desc[2][CX_CUDA_DESC_WORDS]; /* slot = seq parity */
  int32_t status[4];                    /* cx_cuda_exec_status of the current call */
  uint64_t pad2[14];
  uint64_t user_ptr[2];                 /* direct calls: the user's input and output */
  uint64_t pad3[14];
  uint64_t done;                        /* direct calls: epoch this rank is done with */
  uint64_t pad4[15];
  uint32_t exit_count;                  /* blocks of this rank that finished the tile */
  uint32_t pad5[31];
  uint64_t epochs_used;                 /* epochs (tiles) of this rank's finished calls */
  uint64_t calls_done;                  /* this rank's finished calls: the next call's seq */
  uint64_t pad6[14];
  uint64_t lane_flag[CX_CUDA_MAX_FLAGS][16]; /* [channel * lane_stride + lane][0] used */
};

/* Header words of a packed plan (cx_cuda_plan_pack). */
enum {
  CX_PK_NRANKS = 0, CX_PK_RANK, CX_PK_NCHUNKS, CX_PK_NLANES, CX_PK_NINSTRS, CX_PK_NSRCS,
  CX_PK_NDEPS, CX_PK_NFIN, CX_PK_UNITS0, CX_PK_UNITS1, CX_PK_UNITS2, CX_PK_OFF_LANE,
  CX_PK_OFF_INSTRS, CX_PK_OFF_SRCS, CX_PK_OFF_DEPS, CX_PK_OFF_FIN
};

/* Host-side record of an uploaded plan: the header stays on the host (launch geometry), the
 * whole packed image lives on the device. */
struct cx_cuda_plan {
  int header[CX_CUDA_PLAN_HEADER];
  int* d_words;
  long long nwords;
};

#ifdef __cplusplus
#include <cstddef>
static_assert(offsetof(cx_cuda_ctl, abort_word) == 128 && offsetof(cx_cuda_ctl, desc) == 256 &&
                  offsetof(cx_cuda_ctl, status) == 384 && offsetof(cx_cuda_ctl, user_ptr) == 512 &&
                  offsetof(cx_cuda_ctl, done) == 640 && offsetof(cx_cuda_ctl, exit_count) == 768 &&
                  offsetof(cx_cuda_ctl, epochs_used) == 896 &&
                  offsetof(cx_cuda_ctl, lane_flag) == CX_CUDA_FLAGS_OFFSET &&
                  sizeof(cx_cuda_ctl) <= CX_CUDA_CTL_BYTES,
              "cx_cuda_ctl layout: the kernel and the abort path address these words");
#endif

#endif
