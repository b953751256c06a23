// Chunk arithmetic of the schedule IR, shared by the CPU and CUDA executors.
//
// Must stay identical to collectx/schedule/ir.py chunk_span / range_span: a buffer holds whole
// payload units of `count` elements; chunk j is chunk (j % nchunks) of unit (j / nchunks), and
// chunk i of a unit covers elements [i*count/nchunks, (i+1)*count/nchunks) (floor division), so
// every count works, zero and odd ones included. Products are taken in 64 bits: count * nchunks
// stays far below 2^63 for any buffer that fits in memory.
#pragma once

#include <stdint.h>

#include "cx_dtypes.h"

struct cx_span {
  int64_t offset;  // first element
  int64_t length;  // number of elements
};

// Element (offset, length) of chunk j of a buffer whose units hold `count` elements.
CX_HD cx_span cx_chunk_span(int64_t j, int64_t nchunks, int64_t count) {
  int64_t unit = j / nchunks, i = j % nchunks;
  int64_t lo = i * count / nchunks;
  int64_t hi = (i + 1) * count / nchunks;
  cx_span s;
  s.offset = unit * count + lo;
  s.length = hi - lo;
  return s;
}

// Element (offset, length) of the contiguous chunk run [chunk, chunk + nchunk).
CX_HD cx_span cx_range_span(int64_t chunk, int64_t nchunk, int64_t nchunks, int64_t count) {
  cx_span first = cx_chunk_span(chunk, nchunks, count);
  cx_span last = cx_chunk_span(chunk + nchunk - 1, nchunks, count);
  cx_span s;
  s.offset = first.offset;
  s.length = last.offset + last.length - first.offset;
  return s;
}
