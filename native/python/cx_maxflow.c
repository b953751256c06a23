/* Edmonds-Karp (shortest augmenting paths) on a dense n x n capacity matrix: the graphs of
 * Lovász's construction have at most a few dozen GPUs and flows of a few dozen units, where a
 * breadth-first search over the matrix beats any sparse setup. The same algorithm, visiting
 * order and result as the Python fallback in collectx/planner/integral_trees.py. */
#define PY_SSIZE_T_CLEAN
#include "cx_maxflow.h"

#include <stdlib.h>
#include <string.h>

static double augment(double* left, int n, int source, int sink, int* back, int* queue) {
  for (int v = 0; v < n; ++v) back[v] = -1;
  back[source] = source;
  int head = 0, tail = 0;
  queue[tail++] = source;
  /* level by level, each level's nodes in discovery order: the Python loop's frontier order */
  while (head < tail && back[sink] < 0) {
    int end = tail;
    for (; head < end; ++head) {
      int u = queue[head];
      const double* row = left + (size_t)u * n;
      for (int v = 0; v < n; ++v) {
        if (back[v] < 0 && row[v] > 1e-12) {
          back[v] = u;
          queue[tail++] = v;
        }
      }
    }
  }
  if (back[sink] < 0) return 0.0;
  double push = 1e300;
  for (int v = sink; v != source; v = back[v]) {
    double c = left[(size_t)back[v] * n + v];
    if (c < push) push = c;
  }
  for (int v = sink; v != source; v = back[v]) {
    int u = back[v];
    left[(size_t)u * n + v] -= push;
    left[(size_t)v * n + u] += push;
  }
  return push;
}

int cx_square_matrix(PyObject* obj, Py_buffer* view) {
  if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
  Py_ssize_t count = view->len / (Py_ssize_t)sizeof(double);
  int n = 0;
  while ((Py_ssize_t)(n + 1) * (n + 1) <= count) ++n;
  if (view->format && strcmp(view->format, "d") == 0 && n > 0 && (Py_ssize_t)n * n == count &&
      view->len == count * (Py_ssize_t)sizeof(double))
    return n;
  PyBuffer_Release(view);
  return 0;
}

PyObject* cx_refuse_matrix(Py_buffer* view, int n, const char* message) {
  if (n > 0) PyBuffer_Release(view);
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, message);
  return NULL;
}

int cx_graph_args(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t want, const char* usage,
                  Py_buffer* view, long* node) {
  if (nargs != want) {
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
  }
  int n = cx_square_matrix(args[0], view);
  if (n >= 0) *node = PyLong_AsLong(args[1]);
  return n;
}

PyObject* cx_max_flow(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  Py_buffer view;
  long source;
  int n = cx_graph_args(args, nargs, 4, "max_flow(cap, source, sink, enough)", &view, &source);
  if (n < 0) return NULL;
  long sink = PyLong_AsLong(args[2]);
  double enough = PyFloat_AsDouble(args[3]);
  if (n == 0 || PyErr_Occurred() || source < 0 || sink < 0 || source >= n || sink >= n)
    return cx_refuse_matrix(&view, n, "max_flow: expected a float64 n x n array and nodes < n");
  size_t count = (size_t)n * n;
  double* left = malloc(sizeof(double) * count + sizeof(int) * 2 * (size_t)n);
  if (!left) {
    PyBuffer_Release(&view);
    return PyErr_NoMemory();
  }
  memcpy(left, view.buf, sizeof(double) * count);
  PyBuffer_Release(&view);
  int* back = (int*)(left + count);
  int* queue = back + n;
  double flow = 0.0, push = 1.0;
  while (flow < enough && (push = augment(left, n, (int)source, (int)sink, back, queue)) > 0.0)
    flow += push;
  PyObject* reached = PyBytes_FromStringAndSize(NULL, n);
  if (reached) {
    char* flags = PyBytes_AS_STRING(reached);
    int cut = push == 0.0;   /* the last search failed: back[] marks the source side */
    for (int v = 0; v < n; ++v) flags[v] = (char)(cut && back[v] >= 0);
  }
  free(left);
  if (!reached) return NULL;
  return Py_BuildValue("(dN)", flow, reached);
}

/* The flow from source to sink over cap (n x n), stopping once it reaches enough; left, back
 * and queue are scratch. */
static double flow_upto(const double* cap, double* left, int n, int source, int sink,
                        double enough, int* back, int* queue) {
  memcpy(left, cap, sizeof(double) * (size_t)n * n);
  double flow = 0.0, push;
  while (flow < enough && (push = augment(left, n, source, sink, back, queue)) > 0.0)
    flow += push;
  return flow;
}

/* Lovász's condition of collectx/planner/integral_trees.py's _paths_ok, its max-flows here:
 * the Python loop around them cost more than the flows on 16 GPUs. */
PyObject* cx_paths_ok(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  Py_buffer view;
  long root;
  int n = cx_graph_args(args, nargs, 4, "paths_ok(mult, root, k, inside)", &view, &root);
  if (n < 0) return NULL;
  long k = PyLong_AsLong(args[2]);
  const char* inside = PyBytes_Check(args[3]) ? PyBytes_AS_STRING(args[3]) : NULL;
  if (n == 0 || PyErr_Occurred() || root < 0 || root >= n || !inside ||
      PyBytes_GET_SIZE(args[3]) != n)
    return cx_refuse_matrix(
        &view, n, "paths_ok: expected a float64 n x n array, a root < n and n flag bytes");
  size_t count = (size_t)n * n;
  double* big = malloc(sizeof(double) * 3 * count + sizeof(int) * 2 * (size_t)n);
  if (!big) {
    PyBuffer_Release(&view);
    return PyErr_NoMemory();
  }
  const double* mult = view.buf;
  double* left = big + count;
  int* back = (int*)(left + count);
  int* queue = back + n;
  memcpy(big, mult, sizeof(double) * count);
  double most = mult[0];
  for (size_t i = 1; i < count; ++i)
    if (mult[i] > most) most = mult[i];
  /* the tree taken as one source: the root reaches every GPU of it without limit */
  double unlimited = (double)n * (double)(long long)(most + 1) * (double)(k > 1 ? k : 1);
  for (int t = 0; t < n; ++t)
    if (inside[t] && t != root) big[(size_t)root * n + t] = unlimited;
  int ok = 1;
  for (int v = 0; v < n && ok; ++v) {
    if (v == root) continue;
    if (!inside[v] && flow_upto(big, left, n, (int)root, v, (double)k, back, queue) < k) ok = 0;
    else if (k > 1 && flow_upto(mult, left, n, (int)root, v, (double)(k - 1), back, queue) < k - 1)
      ok = 0;
  }
  free(big);
  PyBuffer_Release(&view);
  return PyBool_FromLong(ok);
}
