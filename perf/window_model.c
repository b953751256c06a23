// A 2-rank in-place allreduce of arrays in shared memory (comm.empty), in C: how fast can the
// data movement alone go, and why the pushed copy is written part by part.
//
// Two processes pinned to the first two allowed CPUs share one mapping that holds both ranks'
// float32 arrays x0 and x1 of N bytes (4 KiB pages, as the window's). Rank r owns half r:
//   x_r[half] += x_peer[half]   (reads both, writes its own)
//   x_peer[half] = x_r[half]    (the pushed copy: writes the peer's)
// then both wait for each other, again and again on the same arrays (the benchmarks' loop).
//   whole - the reduce over the whole half, then the copy of the whole half
//   parts - both, 16 KiB at a time: each part is copied while it is still in L1
// Every call moves 2 N bytes per core (N read, N written): no schedule can move less. Prints
// the median call time of each way; every call's result is checked.
//
//   gcc -O3 -o /tmp/window_model perf/window_model.c && /tmp/window_model 4 16 64
//   (arguments: sizes in MiB, default 4)
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "two_cores.h"

enum { kCalls = 50, kWarm = 3 };
enum { kWhole, kParts, kWays };
static const char* kNames[kWays] = {"whole", "parts"};
static const size_t kPart = 16 << 10;

typedef struct {
  Flag done[2], bad[2];
} Shared;


// x_r[lo, lo + len) += x_peer[...], then copied into x_peer, in steps of `step` bytes.
static void reduce_push(char* mine, char* theirs, size_t len, size_t step) {
  for (size_t off = 0; off < len; off += step) {
    size_t m = len - off < step ? len - off : step;
    add((float*)(mine + off), (const float*)(theirs + off), m / sizeof(float));
    memcpy(theirs + off, mine + off, m);
  }
}

// One rank; rank 0 returns the median call time in seconds.
static double rank_main(int rank, Shared* sh, char* x[2], size_t nbytes, int way) {
  if (pin(rank) != 0) _exit(1);
  size_t n = nbytes / sizeof(float), half = nbytes / 2, lo = rank * half;
  float* mine = (float*)x[rank];
  double t[kCalls];
  for (int64_t call = 1; call <= kCalls + kWarm; call++) {
    for (size_t i = lo / sizeof(float); i < (lo + half) / sizeof(float); i++) mine[i] = 1.0f;
    for (size_t i = lo / sizeof(float); i < (lo + half) / sizeof(float); i++)
      ((float*)x[1 - rank])[i] = 2.0f;
    publish(&sh->done[rank], 3 * call - 2);  // both halves set up
    wait_for(&sh->done[1 - rank], 3 * call - 2);
    double t0 = now();
    reduce_push(x[rank] + lo, x[1 - rank] + lo, half, way == kWhole ? half : kPart);
    publish(&sh->done[rank], 3 * call - 1);
    wait_for(&sh->done[1 - rank], 3 * call - 1);
    if (call > kWarm) t[call - kWarm - 1] = now() - t0;
    for (size_t i = 0; i < n; i += 1021)
      if (mine[i] != 3.0f) publish(&sh->bad[rank], 1);
    // The next call's set-up writes into the peer's array: not before the peer has checked it.
    publish(&sh->done[rank], 3 * call);
    wait_for(&sh->done[1 - rank], 3 * call);
  }
  qsort(t, kCalls, sizeof t[0], cmp_double);
  return t[kCalls / 2];
}

static int run(size_t nbytes, int way) {
  size_t bytes = sizeof(Shared) + 4096 + 2 * nbytes;
  char* map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return -1;
  memset(map, 0, sizeof(Shared));
  Shared* sh = (Shared*)map;
  char* x[2] = {map + 4096, map + 4096 + nbytes};
  pid_t child = start_pair(120);
  double t = rank_main(child == 0 ? 1 : 0, sh, x, nbytes, way);
  if (child == 0) _exit(0);
  int ok = join_pair(child) && !sh->bad[0].v && !sh->bad[1].v;
  if (ok) printf("%8zu KiB  %-6s %10.1f us\n", nbytes >> 10, kNames[way], t * 1e6);
  munmap(map, bytes);
  return ok ? 0 : -1;
}

int main(int argc, char** argv) {
  int nsizes = 0;
  double sizes[64];
  for (int i = 1; i < argc && nsizes < 64; i++) sizes[nsizes++] = atof(argv[i]);
  if (nsizes == 0) sizes[nsizes++] = 4;
  if (two_cpus() != 0) {
    fprintf(stderr, "window_model: needs two CPUs\n");
    return 1;
  }
  for (int i = 0; i < nsizes; i++) {
    size_t nbytes = (size_t)(sizes[i] * (1 << 20)) & ~(size_t)(2 * kPart - 1);
    if (nbytes == 0) {
      fprintf(stderr, "window_model: sizes are MiB, at least 32 KiB; got %g\n", sizes[i]);
      return 1;
    }
    for (int way = 0; way < kWays; way++)
      if (run(nbytes, way) != 0) {
        fprintf(stderr, "window_model: %s at %zu bytes failed\n", kNames[way], nbytes);
        return 1;
      }
  }
  return 0;
}
