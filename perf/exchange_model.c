// How fast can two cores run a staged 2-rank allreduce? A model with no library around it.
//
// Two processes pinned to the first two allowed CPUs each hold a private float32 array x of
// N bytes and run, again and again, the data movement of collectx's staged 2-rank in-place
// allreduce, synchronised by flags in a shared segment:
//   stage   - copy the half of x the peer reduces into my slot of the shared segment
//   reduce  - wait for the peer's staged half, then x[mine] += peer's staged half, writing the
//             result both into x and into my result slot (as collectx's write-through does)
//   copy    - wait for the peer's result, copy it into x[peer's half]
// It prints the median time of a whole call and each phase's mean (rank 0's view), and then
// the rate at which one core reads lines the other core has just written ("remote read"):
// every byte of the peer's data must come that way, N bytes per call per core.
// Compare the call time with perf/compare_cpu.py's at the same size: a runtime can shave its
// own overheads, not this.
//
//   gcc -O2 -o /tmp/exchange_model perf/exchange_model.c && /tmp/exchange_model 1 2 4
//   (arguments: sizes in MiB, default 1 2)
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "two_cores.h"

typedef float V __attribute__((vector_size(32)));

enum { kCalls = 300, kWarm = 20 };

typedef struct {                      // one cache line per counter: no false sharing
  Flag staged, reduced, done;
} Flags;

__attribute__((target("avx2"))) static void add_twice(float* x, float* slot, const float* peer,
                                                      size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    V a, b;
    memcpy(&a, x + i, 32);
    memcpy(&b, peer + i, 32);
    a += b;
    memcpy(x + i, &a, 32);
    memcpy(slot + i, &a, 32);
  }
}

__attribute__((target("avx2"))) static float sum(const float* p, size_t n) {
  V a = {0}, b = {0};
  for (size_t i = 0; i < n; i += 16) {
    V u, v;
    memcpy(&u, p + i, 32);
    memcpy(&v, p + i + 8, 32);
    a += u;
    b += v;
  }
  a += b;
  float s = 0;
  for (int i = 0; i < 8; i++) s += a[i];
  return s;
}

// One rank of the model; rank 0 reports. Returns 0, or -1 when there are not two CPUs.
static int allreduce_model(int rank, size_t nbytes, char* shared) {
  Flags* flags = (Flags*)shared;
  size_t half = nbytes / 2, n = half / sizeof(float);
  char* in_slot[2] = {shared + 4096, shared + 4096 + half};
  char* out_slot[2] = {shared + 4096 + 2 * half, shared + 4096 + 3 * half};
  int peer = 1 - rank;
  if (pin(rank) != 0) return -1;
  float* x = aligned_alloc(64, nbytes);
  for (size_t i = 0; i < nbytes / sizeof(float); i++) x[i] = 1e-30f;
  char* mine = (char*)x + rank * half;
  char* theirs = (char*)x + peer * half;
  double total[kCalls], phase[3] = {0, 0, 0};
  for (int64_t call = 1; call <= kCalls + kWarm; call++) {
    double t0 = now();
    memcpy(in_slot[rank], theirs, half);
    publish(&flags[rank].staged, call);
    double t1 = now();
    wait_for(&flags[peer].staged, call);
    add_twice((float*)mine, (float*)out_slot[rank], (const float*)in_slot[peer], n);
    publish(&flags[rank].reduced, call);
    double t2 = now();
    wait_for(&flags[peer].reduced, call);
    memcpy(theirs, out_slot[peer], half);
    publish(&flags[rank].done, call);
    wait_for(&flags[peer].done, call);  // slots are reused by the next call
    double t3 = now();
    if (call > kWarm) {
      total[call - kWarm - 1] = t3 - t0;
      phase[0] += t1 - t0;
      phase[1] += t2 - t1;
      phase[2] += t3 - t2;
    }
  }
  if (rank == 0) {
    qsort(total, kCalls, sizeof total[0], cmp_double);
    printf("%8zu KiB  call %8.1f us  (stage %.1f, reduce %.1f, copy %.1f)\n", nbytes >> 10,
           total[kCalls / 2] * 1e6, phase[0] / kCalls * 1e6, phase[1] / kCalls * 1e6,
           phase[2] / kCalls * 1e6);
  }
  free(x);
  return 0;
}

// Rank 1 writes nbytes into the shared segment, rank 0 sums them: GB/s of rank 0's reads.
static int remote_read(int rank, size_t nbytes, char* shared) {
  Flags* flags = (Flags*)shared;
  float* buf = (float*)(shared + 4096);
  if (pin(rank) != 0) return -1;
  double t[kCalls];
  float s = 0;
  for (int64_t call = 1; call <= kCalls + kWarm; call++) {
    if (rank == 1) {
      memset(buf, (int)call, nbytes);
      publish(&flags[1].staged, call);
      wait_for(&flags[0].staged, call);
    } else {
      wait_for(&flags[1].staged, call);
      double t0 = now();
      s += sum(buf, nbytes / sizeof(float));
      if (call > kWarm) t[call - kWarm - 1] = now() - t0;
      publish(&flags[0].staged, call);
    }
  }
  if (rank == 0) {
    qsort(t, kCalls, sizeof t[0], cmp_double);
    printf("%8zu KiB  remote read %6.1f us, %5.1f GB/s%s\n", nbytes >> 10, t[kCalls / 2] * 1e6,
           nbytes / t[kCalls / 2] / 1e9, s == 1234.5f ? " " : "");
  }
  return 0;
}

static int in_two_processes(int (*body)(int, size_t, char*), size_t nbytes) {
  size_t len = 4096 + 4 * nbytes;
  char* shared = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return -1;
  memset(shared, 0, 4096);
  pid_t child = start_pair(60);
  int rc = body(child == 0 ? 1 : 0, nbytes, shared);
  if (child == 0) _exit(rc == 0 ? 0 : 1);
  int ok = join_pair(child);
  munmap(shared, len);
  return rc == 0 && ok ? 0 : -1;
}

int main(int argc, char** argv) {
  const char* fallback[] = {"1", "2"};
  if (two_cpus() != 0) {
    fprintf(stderr, "exchange_model: needs two CPUs\n");
    return 1;
  }
  int nsizes = argc > 1 ? argc - 1 : 2;
  const char** sizes = argc > 1 ? (const char**)argv + 1 : fallback;
  for (int i = 0; i < nsizes; i++) {
    size_t nbytes = (size_t)(atof(sizes[i]) * (1 << 20)) & ~(size_t)127;
    if (nbytes == 0 || in_two_processes(allreduce_model, nbytes) != 0 ||
        in_two_processes(remote_read, nbytes / 2) != 0) {
      fprintf(stderr, "exchange_model: a size of at least 128 bytes, and memory for it\n");
      return 1;
    }
  }
  return 0;
}
