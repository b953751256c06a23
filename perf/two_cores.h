// Shared by the two-process C models in perf/ (exchange_model.c, cma_push_model.c,
// window_model.c): a clock, a comparison for qsort, flags in shared memory, the float32 add,
// and pinning each process to one of the first two allowed CPUs.
#ifndef COLLECTX_PERF_TWO_CORES_H
#define COLLECTX_PERF_TWO_CORES_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static cpu_set_t g_allowed;  // the CPUs this program may use, read before any pinning

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// A flag one process publishes and the other waits for, alone in its cache line.
typedef struct {
  volatile int64_t v, pad[7];
} Flag;

static inline void wait_for(Flag* f, int64_t v) {
  while (__atomic_load_n(&f->v, __ATOMIC_ACQUIRE) < v) {
  }
}

static inline void publish(Flag* f, int64_t v) { __atomic_store_n(&f->v, v, __ATOMIC_RELEASE); }

// The reduction the models time: x += y, float32.
static inline void add(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// Reads the allowed CPUs (before any process pins itself); 0 when there are at least two.
static int two_cpus(void) {
  return sched_getaffinity(0, sizeof g_allowed, &g_allowed) == 0 && CPU_COUNT(&g_allowed) >= 2
             ? 0 : -1;
}

// Pins the calling process to the nth allowed CPU.
static int pin(int nth) {
  cpu_set_t one;
  for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &g_allowed) && seen++ == nth) {
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      return sched_setaffinity(0, sizeof one, &one);
    }
  return -1;
}

// Forks the second process: the caller then runs rank 0 (the parent) or rank 1 (the child,
// where this returns 0). A side whose peer died would wait forever: an alarm ends both after
// `limit_s` seconds instead of hanging.
static pid_t start_pair(unsigned limit_s) {
  fflush(stdout);
  pid_t child = fork();
  alarm(limit_s);
  return child;
}

// In rank 0: waits for rank 1; 1 when it exited with status 0.
static int join_pair(pid_t child) {
  int status = 0;
  waitpid(child, &status, 0);
  alarm(0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#endif
