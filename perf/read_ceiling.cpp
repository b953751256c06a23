// How fast can one core read k streams? The ceiling for a k-ary reduce against a numpy chain.
//
// A k-ary reduce must read its k inputs once; no kernel runs faster than a loop that only
// reads them. This times, on one core, with the inputs out of cache (size per input >= 4 MiB):
//   chain   - k-1 binary adds through one output, as numpy does (np.add(c, s, out=c))
//   read    - a loop that reads the k inputs and sums them into a register (no output)
//   reduce  - the k inputs summed and written once with non-temporal stores, two cache lines
//             per source per step
//   reduce+pf - the same, each step also prefetching its lines 1 KiB ahead in every source
//             (what libcollectx's large float reductions do)
// GB/s is payload, k * size / time, as in perf/kernels.py. "read / chain" is the most any
// k-ary kernel can lead a chain of binary adds by on this machine.
//
//   g++ -O2 -o /tmp/read_ceiling perf/read_ceiling.cpp && /tmp/read_ceiling 16 8
//   (arguments: MiB per input, k; defaults 16 and 8)
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <vector>

typedef float V __attribute__((vector_size(32)));

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx2"))) static void chain(float* c, float** s, int k, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    V a, b;
    memcpy(&a, s[0] + i, 32); memcpy(&b, s[1] + i, 32); a += b; memcpy(c + i, &a, 32);
  }
  for (int j = 2; j < k; j++)
    for (size_t i = 0; i < n; i += 8) {
      V a, b;
      memcpy(&a, c + i, 32); memcpy(&b, s[j] + i, 32); a += b; memcpy(c + i, &a, 32);
    }
}

volatile float sink;
__attribute__((target("avx2"))) static void read_only(float*, float** s, int k, size_t n) {
  V t = {0};
  for (size_t i = 0; i < n; i += 16)
    for (int j = 0; j < k; j++) {
      V x, y;
      memcpy(&x, s[j] + i, 32); memcpy(&y, s[j] + i + 8, 32); t += x + y;
    }
  sink = t[0];
}

__attribute__((target("avx2"))) static void reduce(float* d, float** s, int k, size_t n) {
  for (size_t i = 0; i < n; i += 32) {
    V a[4], x;
    for (int u = 0; u < 4; u++) memcpy(&a[u], s[0] + i + 8 * u, 32);
    for (int j = 1; j < k; j++)
      for (int u = 0; u < 4; u++) { memcpy(&x, s[j] + i + 8 * u, 32); a[u] += x; }
    for (int u = 0; u < 4; u++) _mm256_stream_ps(d + i + 8 * u, (__m256)a[u]);
  }
  _mm_sfence();
}

__attribute__((target("avx2"))) static void reduce_prefetch(float* d, float** s, int k, size_t n) {
  for (size_t i = 0; i < n; i += 32) {
    V a[4], x;
    for (int j = 0; j < k; j++) {
      _mm_prefetch(reinterpret_cast<const char*>(s[j] + i) + 1024, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(s[j] + i) + 1088, _MM_HINT_T0);
    }
    for (int u = 0; u < 4; u++) memcpy(&a[u], s[0] + i + 8 * u, 32);
    for (int j = 1; j < k; j++)
      for (int u = 0; u < 4; u++) { memcpy(&x, s[j] + i + 8 * u, 32); a[u] += x; }
    for (int u = 0; u < 4; u++) _mm256_stream_ps(d + i + 8 * u, (__m256)a[u]);
  }
  _mm_sfence();
}

int main(int argc, char** argv) {
  long mib = argc > 1 ? atol(argv[1]) : 16;
  long k = argc > 2 ? atol(argv[2]) : 8;
  if (mib < 1 || mib > 4096 || k < 2 || k > 64) {
    fprintf(stderr, "usage: read_ceiling [MiB per input, 1..4096] [k, 2..64]; got %s %s\n",
            argc > 1 ? argv[1] : "-", argc > 2 ? argv[2] : "-");
    return 2;
  }
  size_t n = (size_t(mib) << 20) / sizeof(float);
  auto alloc = [&]() {  // 2 MiB aligned and huge pages where allowed, as numpy's large arrays
    float* p = (float*)aligned_alloc(1 << 21, n * sizeof(float));
    if (p == nullptr) { fprintf(stderr, "read_ceiling: out of memory\n"); exit(1); }
    madvise(p, n * sizeof(float), MADV_HUGEPAGE);
    for (size_t i = 0; i < n; i++) p[i] = float(i % 7);
    return p;
  };
  std::vector<float*> s(k);
  for (auto& p : s) p = alloc();
  float* out = alloc();
  const char* names[] = {"chain", "read", "reduce", "reduce+pf"};
  void (*fns[])(float*, float**, int, size_t) = {chain, read_only, reduce, reduce_prefetch};
  constexpr int kFns = sizeof(fns) / sizeof(fns[0]);
  std::vector<double> t[kFns];
  for (int r = 0; r < 15; r++)   // interleaved, so load on the machine hits all alike
    for (int f = 0; f < kFns; f++) {
      double t0 = now();
      fns[f](out, s.data(), k, n);
      t[f].push_back(now() - t0);
    }
  printf("k=%ld, %ld MiB per input, medians of 15\n", k, mib);
  for (int f = 0; f < kFns; f++) {
    std::sort(t[f].begin(), t[f].end());
    double m = t[f][7];
    double gbps = double(k) * n * sizeof(float) / m / 1e9;
    printf("%-9s %7.2f GB/s  %.2fx chain\n", names[f], gbps, t[0][7] / m);
  }
  return 0;
}
