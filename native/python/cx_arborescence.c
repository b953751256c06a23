/* Chu-Liu/Edmonds with contraction on a dense n x n cost matrix: the pricing step of the
 * packing LP asks for one arborescence per group and round, on 8 to 16 GPUs, where the Python
 * version's list work was most of a 16-GPU forest's planning time. The same algorithm,
 * tie-breaking (numpy's argmin: the first minimum, or the first NaN) and result as the Python
 * fallback in collectx/planner/treepack.py, so that compiled and fallback plans agree. */
#define PY_SSIZE_T_CLEAN
#include "cx_arborescence.h"
#include "cx_maxflow.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { FOUND = 0, UNREACHABLE = 1, NO_MEMORY = -1 };

/* numpy.argmin over xs[0], xs[stride], ...: the first minimum, or the first NaN */
static int argmin(const double* xs, int count, int stride) {
  int at = 0;
  double best = xs[0];
  if (isnan(best)) return 0;
  for (int i = 1; i < count; ++i) {
    double x = xs[(size_t)i * stride];
    if (x < best) {
      at = i;
      best = x;
    } else if (isnan(x)) {
      return i;
    }
  }
  return at;
}

/* The first cycle of the parent pointers, walked from the lowest start (its nodes in walk
 * order, into cycle); its length, or 0 when there is none. */
static int find_cycle(const int* parent, int n, int root, int* color, int* walk, int* cycle) {
  memset(color, 0, sizeof(int) * (size_t)n);   /* 0 new, 1 on this walk, 2 done */
  for (int start = 0; start < n; ++start) {
    int len = 0, v = start;
    while (v != -1 && v != root && color[v] == 0) {
      color[v] = 1;
      walk[len++] = v;
      v = parent[v];
    }
    if (v != -1 && v != root && color[v] == 1) {
      int from = 0;
      while (walk[from] != v) ++from;
      memcpy(cycle, walk + from, sizeof(int) * (size_t)(len - from));
      return len - from;
    }
    for (int i = 0; i < len; ++i) color[walk[i]] = 2;
  }
  return 0;
}

static int arborescence(double* W, int n, int root, int* parent);

/* Contract the cycle into one node, solve the smaller problem, expand its answer. */
static int contract(const double* W, int n, int root, int* parent, const int* cycle, int len) {
  int c = n - len, m = c + 1;
  size_t doubles = (size_t)m * m + 2 * (size_t)len, ints = (size_t)n + 3 * (size_t)m;
  double* W2 = malloc(sizeof(double) * doubles + sizeof(int) * ints + (size_t)n);
  if (!W2) return NO_MEMORY;
  double* gains = W2 + (size_t)m * m;
  double* outs = gains + len;
  int* rest = (int*)(outs + len);
  int* enter = rest + n;
  int* leave = enter + m;
  int* sub = leave + m;
  char* in_cycle = (char*)(sub + m);
  memset(in_cycle, 0, (size_t)n);
  for (int k = 0; k < len; ++k) in_cycle[cycle[k]] = 1;
  int count = 0, root_at = 0;
  for (int v = 0; v < n; ++v)
    if (!in_cycle[v]) {
      if (v == root) root_at = count;
      rest[count++] = v;
    }
  for (int i = 0; i < m * m; ++i) W2[i] = INFINITY;
  for (int i = 0; i < c; ++i)
    for (int j = 0; j < c; ++j) W2[(size_t)i * m + j] = W[(size_t)rest[i] * n + rest[j]];
  for (int i = 0; i < c; ++i) {
    int u = rest[i];
    for (int k = 0; k < len; ++k) {
      int v = cycle[k];
      gains[k] = W[(size_t)u * n + v] - W[(size_t)parent[v] * n + v];
      outs[k] = W[(size_t)v * n + u];
    }
    int k = argmin(gains, len, 1);
    W2[(size_t)i * m + c] = gains[k];
    enter[i] = cycle[k];
    k = argmin(outs, len, 1);
    W2[(size_t)c * m + i] = outs[k];
    leave[i] = cycle[k];
  }
  int status = arborescence(W2, m, root_at, sub);
  if (status == FOUND) {
    for (int i = 0; i < c; ++i)
      if (sub[i] != -1) parent[rest[i]] = sub[i] == c ? leave[i] : rest[sub[i]];
    int from = sub[c];
    if (from < 0 || from >= c) status = UNREACHABLE;   /* only with NaN costs */
    else parent[enter[from]] = rest[from];
  }
  free(W2);
  return status;
}

/* W is overwritten (the diagonal and the root's column become inf). */
static int arborescence(double* W, int n, int root, int* parent) {
  for (int i = 0; i < n; ++i) {
    W[(size_t)i * n + i] = INFINITY;
    W[(size_t)i * n + root] = INFINITY;
  }
  for (int v = 0; v < n; ++v) {
    parent[v] = -1;
    if (v == root) continue;
    int p = argmin(W + v, n, n);
    parent[v] = p;
    if (W[(size_t)p * n + v] == INFINITY) return UNREACHABLE;
  }
  int* scratch = malloc(sizeof(int) * 3 * (size_t)n);
  if (!scratch) return NO_MEMORY;
  int len = find_cycle(parent, n, root, scratch, scratch + n, scratch + 2 * n);
  int status = len ? contract(W, n, root, parent, scratch + 2 * n, len) : FOUND;
  free(scratch);
  return status;
}

PyObject* cx_min_arborescence(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  Py_buffer view;
  long root;
  int n = cx_graph_args(args, nargs, 2, "min_arborescence(W, root)", &view, &root);
  if (n < 0) return NULL;
  if (n == 0 || PyErr_Occurred() || root < 0 || root >= n)
    return cx_refuse_matrix(&view, n,
                            "min_arborescence: expected a float64 n x n array and a root < n");
  size_t count = (size_t)n * n;
  double* W = malloc(sizeof(double) * count + sizeof(int) * (size_t)n);
  if (!W) {
    PyBuffer_Release(&view);
    return PyErr_NoMemory();
  }
  memcpy(W, view.buf, sizeof(double) * count);
  PyBuffer_Release(&view);
  int* parent = (int*)(W + count);
  int status = arborescence(W, n, (int)root, parent);
  PyObject* out = NULL;
  if (status == NO_MEMORY) {
    PyErr_NoMemory();
  } else if (status == UNREACHABLE) {
    out = Py_NewRef(Py_None);
  } else if ((out = PyList_New(n)) != NULL) {
    for (int v = 0; v < n; ++v) {
      PyObject* p = PyLong_FromLong(parent[v]);
      if (!p) {
        Py_CLEAR(out);
        break;
      }
      PyList_SET_ITEM(out, v, p);
    }
  }
  free(W);
  return out;
}
