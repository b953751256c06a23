/* Local moves that shorten the trees of Lovász's construction: a GPU swaps its parents in two
 * trees, or takes its parent in one tree over an arc with an unused lane; a move is kept when
 * it lowers (deepest tree, sum of the trees' depths, sum of all levels). The Python loop held
 * the GIL ~40 ms per call on 6 GPUs and 64 trees. The same moves in the same order, the same
 * rule, undo and top-down order of the result as the Python fallback, _shallower in
 * collectx/planner/integral_trees.py, so that compiled and fallback plans agree. */
#define PY_SSIZE_T_CLEAN
#include "cx_shallower.h"
#include "cx_maxflow.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* (deepest tree, sum of the trees' depths, sum of all levels): lower is shallower */
typedef struct {
  int deepest;
  long long depths, sums;
} Score;

/* The k trees as parents (-1 at the root) and levels as last kept, with the score's tallies
 * kept as one or two trees change (Python's _Shape). */
typedef struct {
  int n, k, root;
  double* left;     /* n x n: unused lanes of each arc */
  int* par;         /* k x n */
  int* level;       /* k x n */
  int* fresh;       /* 2 x n: the levels of the trees a move changes */
  int* depth;       /* k */
  long long* sum;   /* k: sum of the tree's levels */
  int* trees_at;    /* n: how many trees have each depth */
  int* spares;      /* n: the tails of arcs into a GPU with an unused lane */
  long long depths, sums;
} Forest;

/* The levels of the tree of parents par into level: its depth, with the sum of the levels in
 * *sum; -1 when par does not reach root from every node (no spanning tree). */
static int levels_of(const int* par, int n, int root, int* level, long long* sum) {
  for (int v = 0; v < n; ++v) level[v] = -1;
  level[root] = 0;
  int deepest = 0;
  long long total = 0;
  for (int v = 0; v < n; ++v) {
    int u = v, up = 0;   /* walk up to a node of known level, then set the path's levels */
    while (level[u] < 0) {
      u = par[u];
      if (u < 0 || ++up > n) return -1;
    }
    for (int w = v, at = level[u] + up; level[w] < 0; w = par[w], --at) level[w] = at;
    if (level[v] > deepest) deepest = level[v];
    total += level[v];
  }
  *sum = total;
  return deepest;
}

/* Whether u lies in the subtree of v (v itself included). */
static int under(const int* par, int u, int v) {
  for (; u >= 0; u = par[u])
    if (u == v) return 1;
  return 0;
}

static void set_stats(Forest* f, int i, int depth, long long sum) {
  f->trees_at[f->depth[i]]--;
  f->trees_at[depth]++;
  f->depths += depth - f->depth[i];
  f->sums += sum - f->sum[i];
  f->depth[i] = depth;
  f->sum[i] = sum;
}

static Score score_of(const Forest* f) {
  int d = f->n - 1;
  while (d > 0 && !f->trees_at[d]) --d;
  Score s = {d, f->depths, f->sums};
  return s;
}

static int lower(Score a, Score b) {
  if (a.deepest != b.deepest) return a.deepest < b.deepest;
  if (a.depths != b.depths) return a.depths < b.depths;
  return a.sums < b.sums;
}

/* One move at v: its parents in trees a and b swapped (b >= 0), or its parent in tree a
 * taken over arc (q, v). Kept (1) when the score falls; else undone, and skipped before it is
 * made when no parent of v rises (the score cannot fall) or it makes a cycle. */
static int try_move(Forest* f, Score* score, int v, int a, int b, int q) {
  int n = f->n, *pa = f->par + (size_t)a * n, x = pa[v], y = 0;
  const int* la = f->level + (size_t)a * n;
  if (b >= 0) {
    int* pb = f->par + (size_t)b * n;
    const int* lb = f->level + (size_t)b * n;
    y = pb[v];
    if ((la[y] >= la[x] && lb[x] >= lb[y]) || under(pa, y, v) || under(pb, x, v)) return 0;
    pa[v] = y;
    pb[v] = x;
  } else {
    if (la[q] >= la[x] || under(pa, q, v)) return 0;
    f->left[(size_t)x * n + v] += 1;
    f->left[(size_t)q * n + v] -= 1;
    pa[v] = q;
  }
  int trees[2] = {a, b}, count = b >= 0 ? 2 : 1, old_depth[2];
  long long old_sum[2];
  for (int t = 0; t < count; ++t) {
    int i = trees[t];
    long long sum;
    int depth = levels_of(f->par + (size_t)i * n, n, f->root, f->fresh + (size_t)t * n, &sum);
    old_depth[t] = f->depth[i];
    old_sum[t] = f->sum[i];
    set_stats(f, i, depth, sum);
  }
  Score now = score_of(f);
  if (lower(now, *score)) {
    *score = now;
    for (int t = 0; t < count; ++t)
      memcpy(f->level + (size_t)trees[t] * n, f->fresh + (size_t)t * n, sizeof(int) * n);
    return 1;
  }
  for (int t = 0; t < count; ++t) set_stats(f, trees[t], old_depth[t], old_sum[t]);
  if (b >= 0) {
    pa[v] = x;
    f->par[(size_t)b * n + v] = y;
  } else {
    f->left[(size_t)q * n + v] += 1;
    f->left[(size_t)x * n + v] -= 1;
    pa[v] = x;
  }
  return 0;
}

/* Python's loop: passes over the GPUs until one keeps no move; at each GPU, tree a's swaps
 * with every later tree, then its spare arcs as they were after those swaps. */
static void shorten(Forest* f) {
  int n = f->n, k = f->k;
  Score score = score_of(f);
  int improved = 1;
  while (improved) {   /* every kept move lowers the score, so this ends */
    improved = 0;
    for (int v = 0; v < n; ++v) {
      if (v == f->root) continue;
      for (int a = 0; a < k; ++a) {
        const int* pa = f->par + (size_t)a * n;
        for (int b = a + 1; b < k; ++b)
          if (pa[v] != f->par[(size_t)b * n + v]) improved |= try_move(f, &score, v, a, b, -1);
        int spares = 0;
        for (int q = 0; q < n; ++q)
          if (f->left[(size_t)q * n + v] > 0) f->spares[spares++] = q;
        for (int s = 0; s < spares; ++s)
          if (f->spares[s] != pa[v]) improved |= try_move(f, &score, v, a, -1, f->spares[s]);
      }
    }
  }
}

/* Tree i's parents from its (parent, child) pairs into par; -1 with an error set when they
 * are not pairs of nodes < n, or name the root as a child. */
static int read_tree(PyObject* edges, int n, int root, int* par) {
  PyObject* seq = PySequence_Fast(edges, "shallower: a tree is a sequence of pairs");
  if (!seq) return -1;
  int ok = 1;
  for (Py_ssize_t e = 0; ok && e < PySequence_Fast_GET_SIZE(seq); ++e) {
    PyObject* pair = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, e), "shallower: a pair");
    ok = pair && PySequence_Fast_GET_SIZE(pair) == 2;
    long p = ok ? PyLong_AsLong(PySequence_Fast_GET_ITEM(pair, 0)) : -1;
    long c = ok ? PyLong_AsLong(PySequence_Fast_GET_ITEM(pair, 1)) : -1;
    ok = ok && !PyErr_Occurred() && p >= 0 && p < n && c >= 0 && c < n && c != root;
    if (ok) par[c] = (int)p;
    Py_XDECREF(pair);
  }
  Py_DECREF(seq);
  return ok ? 0 : -1;
}

/* The k trees, each its pairs (parent[v], v) ordered by (level, v). */
static PyObject* top_down_pairs(const Forest* f) {
  int n = f->n;
  PyObject* out = PyList_New(f->k);
  for (int i = 0; out && i < f->k; ++i) {
    const int *par = f->par + (size_t)i * n, *level = f->level + (size_t)i * n;
    PyObject* pairs = PyList_New(n - 1);
    Py_ssize_t at = 0;
    for (int d = 1; pairs && d <= f->depth[i]; ++d)
      for (int v = 0; v < n; ++v) {
        if (level[v] != d) continue;
        PyObject* pair = Py_BuildValue("(ii)", par[v], v);
        if (!pair) {
          Py_CLEAR(pairs);
          break;
        }
        PyList_SET_ITEM(pairs, at++, pair);
      }
    if (!pairs) Py_CLEAR(out);
    else PyList_SET_ITEM(out, i, pairs);
  }
  return out;
}

PyObject* cx_shallower(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  const char* refusal =
      "shallower: expected a float64 n x n array, a root < n and k >= 1 spanning trees";
  Py_buffer view;
  long root;
  int n = cx_graph_args(args, nargs, 3, "shallower(left, root, trees)", &view, &root);
  if (n < 0) return NULL;
  PyObject* trees = NULL;
  if (n == 0 || PyErr_Occurred() || root < 0 || root >= n ||
      !(trees = PySequence_Fast(args[2], "shallower: trees is a sequence")) ||
      PySequence_Fast_GET_SIZE(trees) < 1 || PySequence_Fast_GET_SIZE(trees) > INT_MAX / n) {
    Py_XDECREF(trees);
    return cx_refuse_matrix(&view, n, refusal);
  }
  int k = (int)PySequence_Fast_GET_SIZE(trees);
  size_t cells = (size_t)n * n, kn = (size_t)k * n;
  double* left = malloc(sizeof(double) * cells + sizeof(long long) * k +
                        sizeof(int) * (2 * kn + 4 * (size_t)n + k));
  if (!left) {
    Py_DECREF(trees);
    PyBuffer_Release(&view);
    return PyErr_NoMemory();
  }
  Forest f = {.n = n, .k = k, .root = (int)root, .left = left};
  f.sum = (long long*)(left + cells);
  f.par = (int*)(f.sum + k);
  f.level = f.par + kn;
  f.fresh = f.level + kn;
  f.depth = f.fresh + 2 * (size_t)n;
  f.trees_at = f.depth + k;
  f.spares = f.trees_at + n;
  memcpy(left, view.buf, sizeof(double) * cells);
  PyBuffer_Release(&view);
  memset(f.trees_at, 0, sizeof(int) * n);
  int ok = 1;
  for (int i = 0; ok && i < k; ++i) {
    int* par = f.par + (size_t)i * n;
    for (int v = 0; v < n; ++v) par[v] = -1;
    ok = read_tree(PySequence_Fast_GET_ITEM(trees, i), n, f.root, par) == 0 &&
         (f.depth[i] = levels_of(par, n, f.root, f.level + (size_t)i * n, &f.sum[i])) >= 0;
    if (ok) {
      f.trees_at[f.depth[i]]++;
      f.depths += f.depth[i];
      f.sums += f.sum[i];
    }
  }
  Py_DECREF(trees);
  PyObject* out = NULL;
  if (!ok) {
    cx_refuse_matrix(&view, 0, refusal);
  } else {
    Py_BEGIN_ALLOW_THREADS   /* plain C on copies from here: other planner threads may run */
    shorten(&f);
    Py_END_ALLOW_THREADS
    out = top_down_pairs(&f);
  }
  free(left);
  return out;
}
