// Pull or push the reduced halves? A 2-rank allreduce over cross-memory attach, in C.
//
// Two processes pinned to the first two allowed CPUs each hold a private float32 array x of
// N bytes (malloc'd like numpy's: 4 KiB pages unless --huge asks for transparent huge pages)
// and allreduce it in place, again and again, the way collectx does from 128 KiB:
//   reduce - read the peer's half of x that I reduce (process_vm_readv, 256 KiB pieces into a
//            bounce buffer) and add it into my x
//   pull   - then read the half the peer reduced from its x into mine (process_vm_readv)
//   push   - or write each reduced piece into the peer's x right after computing it
//            (process_vm_writev), while it is still in cache: no second read of lines another
//            core has just written ("push-whole" writes the half once it is all reduced)
// With --touch each rank rewrites its whole x before every call, as a training step writes its
// gradients; without it the loop is the benchmarks' (same buffer, nothing in between). Every
// call's result is checked. Prints the median call time of each way.
//
//   gcc -O2 -o /tmp/cma_push_model perf/cma_push_model.c && /tmp/cma_push_model --touch 1 16
//   (arguments: [--touch] [--huge] sizes in MiB, default 1)
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "two_cores.h"

enum { kCalls = 100, kWarm = 5 };
enum { kPull, kPushPiece, kPushWhole, kWays };
static const char* kNames[kWays] = {"pull", "push", "push-whole"};
static const size_t kPiece = 256 << 10;

typedef struct {
  Flag pid[2], addr[2], arrived[2], reduced[2], done[2], bad[2];
} Shared;


static void move(pid_t pid, void* local, void* remote, size_t n, int write) {
  struct iovec l = {local, n}, r = {remote, n};
  ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                      : process_vm_readv(pid, &l, 1, &r, 1, 0);
  if (got != (ssize_t)n) {
    perror("cma_push_model: process_vm_readv/writev");
    _exit(1);
  }
}

// One rank; rank 0 returns the median call time in seconds.
static double rank_main(int rank, Shared* sh, size_t nbytes, int way, int touch, int huge) {
  int peer = 1 - rank;
  if (pin(rank) != 0) _exit(1);
  size_t alloc = huge ? (nbytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1) : nbytes;
  float* x = huge ? aligned_alloc(2u << 20, alloc) : malloc(nbytes);
  char* bounce = malloc(kPiece);
  if (!x || !bounce) _exit(1);
  if (huge) madvise(x, alloc, MADV_HUGEPAGE);
  size_t n = nbytes / sizeof(float), half = nbytes / 2;
  for (size_t i = 0; i < n; i++) x[i] = (float)(rank + 1);
  publish(&sh->pid[rank], getpid());
  publish(&sh->addr[rank], (int64_t)(uintptr_t)x);
  publish(&sh->arrived[rank], 1);
  wait_for(&sh->arrived[peer], 1);
  pid_t pid = (pid_t)sh->pid[peer].v;
  char* theirs = (char*)(uintptr_t)sh->addr[peer].v;
  char* mine = (char*)x;
  size_t lo = rank * half, other = peer * half;
  int64_t pieces = (int64_t)((half + kPiece - 1) / kPiece);
  double t[kCalls];
  for (int64_t call = 1; call <= kCalls + kWarm; call++) {
    if (touch || call == 1)
      for (size_t i = 0; i < n; i++) x[i] = (float)(rank + 1);
    publish(&sh->arrived[rank], call + 1);
    wait_for(&sh->arrived[peer], call + 1);
    double t0 = now();
    for (int64_t k = 0; k < pieces; k++) {
      size_t off = lo + (size_t)k * kPiece, m = half - (size_t)k * kPiece;
      m = m < kPiece ? m : kPiece;
      move(pid, bounce, theirs + off, m, 0);
      add((float*)(mine + off), (const float*)bounce, m / sizeof(float));
      if (way == kPushPiece) move(pid, mine + off, theirs + off, m, 1);
    }
    if (way == kPushWhole) move(pid, mine + lo, theirs + lo, half, 1);
    publish(&sh->reduced[rank], call);
    wait_for(&sh->reduced[peer], call);
    if (way == kPull) move(pid, mine + other, theirs + other, half, 0);
    publish(&sh->done[rank], call);    // the peer may reuse its x once both are done
    wait_for(&sh->done[peer], call);
    if (call > kWarm) t[call - kWarm - 1] = now() - t0;
    if (touch || call == 1)
      for (size_t i = 0; i < n; i += 1021)
        if (x[i] != 3.0f) publish(&sh->bad[rank], 1);
  }
  qsort(t, kCalls, sizeof t[0], cmp_double);
  return t[kCalls / 2];
}

static int run(size_t nbytes, int way, int touch, int huge) {
  Shared* sh = mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
  if (sh == MAP_FAILED) return -1;
  memset(sh, 0, sizeof *sh);
  pid_t child = start_pair(60);
  double t = rank_main(child == 0 ? 1 : 0, sh, nbytes, way, touch, huge);
  if (child == 0) _exit(0);
  int ok = join_pair(child) && !sh->bad[0].v && !sh->bad[1].v;
  if (ok) printf("%8zu KiB  %-10s %8.1f us\n", nbytes >> 10, kNames[way], t * 1e6);
  munmap(sh, sizeof *sh);
  return ok ? 0 : -1;
}

int main(int argc, char** argv) {
  int touch = 0, huge = 0, nsizes = 0;
  double sizes[64];
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--touch")) touch = 1;
    else if (!strcmp(argv[i], "--huge")) huge = 1;
    else if (nsizes < 64) sizes[nsizes++] = atof(argv[i]);
  }
  if (nsizes == 0) sizes[nsizes++] = 1;
  if (two_cpus() != 0) {
    fprintf(stderr, "cma_push_model: needs two CPUs\n");
    return 1;
  }
  printf("%s, %s pages\n", touch ? "buffer rewritten before each call" : "same buffer each call",
         huge ? "transparent huge" : "4 KiB");
  for (int i = 0; i < nsizes; i++) {
    size_t nbytes = (size_t)(sizes[i] * (1 << 20)) & ~(size_t)4095;
    if (nbytes == 0) {
      fprintf(stderr, "cma_push_model: sizes are MiB, at least 4 KiB; got %g\n", sizes[i]);
      return 1;
    }
    for (int way = 0; way < kWays; way++)
      if (run(nbytes, way, touch, huge) != 0) {
        fprintf(stderr, "cma_push_model: %s at %zu bytes failed (wrong result, or cross-memory "
                "attach not allowed here)\n", kNames[way], nbytes);
        return 1;
      }
  }
  return 0;
}
