// Instruction records of a flat plan (cx_exec_plan), read by the CPU and CUDA executors alike.
//
// An instruction is 9 int32 words: op (0 copy, 1 reduce), its destination ref (rank, buf, chunk,
// count), the index and number of its source refs in `srcs` (4 words each, laid out like the
// destination), the index and number of its deps in `deps` (3 words each: rank, lane, index).
// Buffers: 0 input, 1 output, 2 scratch. collectx/runtime/executor.py writes these records.
#pragma once

#include <stdint.h>

#include "cx_dtypes.h"

enum {
  CX_IN_OP = 0, CX_IN_DST = 1, CX_IN_SRC0 = 5, CX_IN_NSRC = 6, CX_IN_DEP0 = 7, CX_IN_NDEP = 8,
  CX_IN_WORDS = 9
};

// The destination of `next` when it is a copy that pushes exactly the chunks `in` writes in my
// output or scratch (a reduce's shard) into the same chunks of a peer's output, with no deps of
// its own (collectx/schedule/push.py places such copies right after `in`): running it piece by
// piece inside `in` writes each piece while it is still in cache or registers. NULL otherwise.
CX_HD const int32_t* cx_fusable_push(const int32_t* in, const int32_t* next, const int32_t* srcs,
                                     int rank) {
  const int32_t* to = next + CX_IN_DST;
  bool mine = in[1] == rank && (in[2] == 1 || in[2] == 2);  // my output or scratch
  if (next[CX_IN_OP] != 0 || next[CX_IN_NSRC] != 1 || next[CX_IN_NDEP] != 0 || !mine ||
      to[0] == rank || to[1] != 1 || to[2] != in[3] || to[3] != in[4])
    return nullptr;
  const int32_t* src = srcs + 4 * next[CX_IN_SRC0];
  if (src[0] != in[1] || src[1] != in[2] || src[2] != in[3] || src[3] != in[4]) return nullptr;
  return to;
}
