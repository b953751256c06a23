/* Core-to-core round trip: two threads pinned to two CPUs bounce one cache line.
 *
 * The CPU runtime's staged copies move every byte between the ranks' cores, so when this round
 * trip slows down, so do they. On a VM it also shows whether the host keeps the vCPUs close:
 * run it every few seconds and look at the spread.
 *
 *   gcc -O2 -pthread -o /tmp/pingpong perf/pingpong.c
 *   /tmp/pingpong            # CPUs 0 and 1, 200000 round trips
 *   /tmp/pingpong 2 5 100000 # CPUs 2 and 5
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(128) _Atomic long flag;
static long rounds = 200000;
static int cpu_a = 0, cpu_b = 1;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void* pong(void* arg) {
  (void)arg;
  if (pin(cpu_b) != 0) {
    fprintf(stderr, "cannot pin to CPU %d\n", cpu_b);
    exit(2);
  }
  for (long i = 0; i < rounds; i++) {
    while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 1) {
    }
    atomic_store_explicit(&flag, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc > 2) cpu_a = atoi(argv[1]), cpu_b = atoi(argv[2]);
  if (argc > 3) rounds = atol(argv[3]);
  if (rounds <= 0 || pin(cpu_a) != 0) {
    fprintf(stderr, "usage: %s [cpu_a cpu_b [rounds > 0]] (cannot pin to CPU %d)\n", argv[0],
            cpu_a);
    return 2;
  }
  pthread_t t;
  pthread_create(&t, NULL, pong, NULL);
  double t0 = now();
  for (long i = 0; i < rounds; i++) {
    atomic_store_explicit(&flag, 2 * i + 1, memory_order_release);
    while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 2) {
    }
  }
  double per = (now() - t0) / rounds * 1e9;
  pthread_join(t, NULL);
  printf("CPUs %d <-> %d: %.0f ns round trip (%ld rounds)\n", cpu_a, cpu_b, per, rounds);
  return 0;
}
