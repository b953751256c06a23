/* Lovász's k trees grown all at once, one arc at a time, each arc tested against Edmonds'
 * condition with root sets over every vertex set without the root: partial trees can all be
 * completed from the unused arcs exactly when every set X is entered at least as often as there
 * are trees that miss it. The numpy version held the GIL ~20 ms per call on 6 GPUs (k (n - 1)
 * steps of several small array operations). The same tree choice, candidate order, first
 * passing arc, open levels and None as the Python fallback, _grown_together in
 * collectx/planner/integral_trees.py, so that compiled and fallback plans agree.
 *
 * The sets are bit masks (ascending, as sets_without lists them; the test is over all of them,
 * so their order does not matter). Counts are compared as doubles, as numpy compares them: exact
 * for whole counts, which are all the planner passes. */
#define PY_SSIZE_T_CLEAN
#include "cx_grown.h"
#include "cx_maxflow.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int n, k, root, sets;
  double* left;        /* n x n: unused arcs */
  double* entering;    /* per set: unused arcs entering it */
  int* missing;        /* per set: trees that miss it */
  int* tight;          /* scratch: the sets an arc can fail */
  unsigned* set;       /* per set: its GPUs */
  unsigned* members;   /* per tree: its GPUs, the root included */
  int* size;           /* per tree: its GPUs */
  int* open;           /* per tree: its shallowest open arc's level (n + 1 when complete) */
  int* level;          /* k x n: -1 outside the tree */
  int* joined;         /* k x n: the tree's GPUs in the order they joined it */
  int* parent;         /* k x n */
  int* tails;          /* n: scratch */
  int* heads;          /* n: scratch */
} Growth;

/* The level of tree t's shallowest GPU with an unused arc to a GPU outside the tree: n when
 * none has one, n + 1 once the tree spans every GPU (Python's shallowest_open). */
static int shallowest_open(const Growth* g, int t) {
  int n = g->n;
  if (g->size[t] == n) return n + 1;
  const int* level = g->level + (size_t)t * n;
  int best = n;
  for (int u = 0; u < n; ++u) {
    if (level[u] < 0 || level[u] >= best) continue;
    const double* row = g->left + (size_t)u * n;
    for (int v = 0; v < n; ++v)
      if (level[v] < 0 && row[v] > 0) {
        best = level[u];
        break;
      }
  }
  return best;
}

/* The tree the next arc goes to: least (open level, size), the lowest index on ties. */
static int next_tree(const Growth* g) {
  int best = 0;
  for (int t = 1; t < g->k; ++t)
    if (g->open[t] < g->open[best] ||
        (g->open[t] == g->open[best] && g->size[t] < g->size[best]))
      best = t;
  return best;
}

/* Whether taking arc (u, v) into tree i keeps every tight set entered often enough: entered
 * once less when v is in it and u is not, missed by one tree less when v is in it and tree i
 * missed it. Python's after >= still, set by set. */
static int passes(const Growth* g, int tights, int i, int u, int v) {
  unsigned tree = g->members[i], head = 1u << v, tail = 1u << u;
  for (int s = 0; s < tights; ++s) {
    int x = g->tight[s];
    unsigned set = g->set[x];
    int in = (set & head) != 0;
    double after = g->entering[x] - (double)(in && !(set & tail));
    int still = g->missing[x] - (in && !(set & tree));
    if (!(after >= (double)still)) return 0;
  }
  return 1;
}

/* The first arc out of tree i that passes, in Python's order: tails by level (ties in the order
 * they joined), heads outside the tree by unused count, most first (ties by index); 0 if none. */
static int first_passing(Growth* g, int i, int* tail, int* head) {
  int n = g->n, size = g->size[i];
  const int *level = g->level + (size_t)i * n, *joined = g->joined + (size_t)i * n;
  /* Only a set with fewer than one spare entering arc can fail (a NaN count fails too):
   * a few of the 2^(n-1) - 1 in practice. */
  int tights = 0;
  for (int x = 0; x < g->sets; ++x)
    if (!(g->entering[x] - 1.0 >= (double)g->missing[x])) g->tight[tights++] = x;
  int tails = 0;
  for (int j = 0; j < size; ++j) {   /* stable insertion by level */
    int u = joined[j], at = tails++;
    for (; at > 0 && level[g->tails[at - 1]] > level[u]; --at) g->tails[at] = g->tails[at - 1];
    g->tails[at] = u;
  }
  for (int a = 0; a < tails; ++a) {
    int u = g->tails[a], heads = 0;
    const double* row = g->left + (size_t)u * n;
    for (int v = 0; v < n; ++v) {   /* stable insertion by count, most first */
      if (level[v] >= 0 || !(row[v] > 0)) continue;
      int at = heads++;
      for (; at > 0 && row[g->heads[at - 1]] < row[v]; --at) g->heads[at] = g->heads[at - 1];
      g->heads[at] = v;
    }
    for (int b = 0; b < heads; ++b)
      if (passes(g, tights, i, u, g->heads[b])) {
        *tail = u;
        *head = g->heads[b];
        return 1;
      }
  }
  return 0;
}

/* Arc (u, v) taken into tree i, and the open levels it changes: tree i's, and when it was the
 * arc's last unused copy, those of the other trees it left. */
static void take(Growth* g, int i, int u, int v) {
  int n = g->n;
  unsigned head = 1u << v, tail = 1u << u, tree = g->members[i];
  double* cell = g->left + (size_t)u * n + v;
  *cell -= 1;
  for (int x = 0; x < g->sets; ++x) {
    unsigned set = g->set[x];
    if (!(set & head)) continue;
    if (!(set & tail)) g->entering[x] -= 1;
    if (!(set & tree)) g->missing[x] -= 1;
  }
  g->members[i] |= head;
  int* level = g->level + (size_t)i * n;
  level[v] = level[u] + 1;
  g->parent[(size_t)i * n + v] = u;
  g->joined[(size_t)i * n + g->size[i]++] = v;
  g->open[i] = shallowest_open(g, i);
  if (*cell == 0)
    for (int t = 0; t < g->k; ++t)
      if ((g->members[t] & tail) && !(g->members[t] & head)) g->open[t] = shallowest_open(g, t);
}

/* Python's loop: k (n - 1) arcs, each to the tree next_tree names; 0 when none passes. */
static int grow(Growth* g) {
  int n = g->n, k = g->k;
  for (int x = 0; x < g->sets; ++x) {
    unsigned set = g->set[x];
    double sum = 0;
    for (int u = 0; u < n; ++u)
      if (!(set >> u & 1))
        for (int v = 0; v < n; ++v)
          if (set >> v & 1) sum += g->left[(size_t)u * n + v];
    g->entering[x] = sum;
    g->missing[x] = k;
  }
  for (int t = 0; t < k; ++t) g->open[t] = shallowest_open(g, t);
  for (long step = 0; step < (long)k * (n - 1); ++step) {
    int i = next_tree(g), u, v;
    if (!first_passing(g, i, &u, &v)) return 0;   /* not when Edmonds' condition holds */
    take(g, i, u, v);
  }
  return 1;
}

/* The trees, each its arcs (parent, child) in the order they were taken. */
static PyObject* trees_of(const Growth* g) {
  int n = g->n;
  PyObject* out = PyList_New(g->k);
  for (int i = 0; out && i < g->k; ++i) {
    const int *joined = g->joined + (size_t)i * n, *parent = g->parent + (size_t)i * n;
    PyObject* arcs = PyList_New(g->size[i] - 1);
    for (int j = 1; arcs && j < g->size[i]; ++j) {
      PyObject* arc = Py_BuildValue("(ii)", parent[joined[j]], joined[j]);
      if (!arc) Py_CLEAR(arcs);
      else PyList_SET_ITEM(arcs, j - 1, arc);
    }
    if (!arcs) Py_CLEAR(out);
    else PyList_SET_ITEM(out, i, arcs);
  }
  return out;
}

PyObject* cx_grown_together(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  const char* refusal = "grown_together: expected a float64 n x n array (writable, n <= 20, "
                        "no NaN), a root < n and k >= 0";
  Py_buffer view;
  long root;
  int n = cx_graph_args(args, nargs, 3, "grown_together(left, root, k)", &view, &root);
  if (n < 0) return NULL;
  long k = PyLong_AsLong(args[2]);
  size_t cells = (size_t)n * n;
  int ok = n > 0 && !PyErr_Occurred() && !view.readonly && n <= CX_GROWN_MAX_N && root >= 0 &&
           root < n && k >= 0 && k <= INT_MAX / n;
  for (size_t c = 0; ok && c < cells; ++c)   /* a NaN would upset Python's sort: refused */
    ok = ((const double*)view.buf)[c] == ((const double*)view.buf)[c];
  if (!ok) return cx_refuse_matrix(&view, n, refusal);
  int sets = (1 << (n - 1)) - 1;
  size_t kn = (size_t)k * n;
  double* left = malloc(sizeof(double) * (cells + sets) +
                        sizeof(int) * (3 * (size_t)sets + 3 * kn + 3 * (size_t)k + 2 * n));
  if (!left) {
    PyBuffer_Release(&view);
    return PyErr_NoMemory();
  }
  Growth g = {.n = n, .k = (int)k, .root = (int)root, .sets = sets, .left = left};
  g.entering = left + cells;
  g.missing = (int*)(g.entering + sets);
  g.tight = g.missing + sets;
  g.set = (unsigned*)(g.tight + sets);
  g.members = g.set + sets;
  g.size = (int*)(g.members + k);
  g.open = g.size + k;
  g.level = g.open + k;
  g.joined = g.level + kn;
  g.parent = g.joined + kn;
  g.tails = g.parent + kn;
  g.heads = g.tails + n;
  memcpy(left, view.buf, sizeof(double) * cells);
  for (unsigned s = 1, x = 0; s < 1u << n; ++s)   /* every set without the root, ascending */
    if (!(s >> root & 1)) g.set[x++] = s;
  for (int t = 0; t < g.k; ++t) {
    int* level = g.level + (size_t)t * n;
    for (int v = 0; v < n; ++v) level[v] = -1;
    level[root] = 0;
    g.joined[(size_t)t * n] = (int)root;
    g.parent[(size_t)t * n + root] = -1;
    g.members[t] = 1u << root;
    g.size[t] = 1;
  }
  int grown;
  Py_BEGIN_ALLOW_THREADS   /* plain C on copies from here: other planner threads may run */
  grown = grow(&g);
  Py_END_ALLOW_THREADS
  memcpy(view.buf, left, sizeof(double) * cells);   /* left loses the arcs taken, as in Python */
  PyBuffer_Release(&view);
  PyObject* out = grown ? trees_of(&g) : Py_NewRef(Py_None);
  free(left);
  return out;
}
