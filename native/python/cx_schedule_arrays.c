/* collectx._fastpath.schedule_arrays: one pass over a schedule's instructions, in C.
 *
 * Why it exists: the planner simulates tens of candidate schedules of thousands of
 * instructions each, and numbering the instructions, resolving their dependencies and reading
 * their buffer references took the Python simulator front end longer than the native event
 * loop took to run them (collectx/schedule/_flat.py is the caller and says what it does with
 * the arrays).
 *
 * schedule_arrays(lanes) takes Schedule.lanes (per rank a tuple of Lane objects, each with an
 * ``instrs`` tuple of Instr named tuples) and numbers the instructions densely, rank by rank,
 * lane by lane, as collectx/schedule/_graph.py's build_graph does. It returns a tuple of
 * bytes objects, each an array of native int32 (numpy.frombuffer reads them without a copy):
 *
 *   rank, dst_rank, dst_buf, dst_chunk, dst_count         one entry per instruction
 *   src_off, src_rank, src_host                           sources, CSR (src_off has n + 1)
 *   pred_off, preds                                       lane predecessor, then the explicit
 *                                                         deps, repeats dropped, CSR
 *   succ_off, succs                                       the same edges from the other end,
 *                                                         each list in increasing node order
 *
 * and, last, an int: the instructions on the longest chain of dependent ones (what
 * collectx.planner.cost.steps asks of the candidates it prices), -1 if there is a cycle.
 *
 * ``src_host`` is 1 where the reference's buffer is "host"; ``dst_buf`` is 1 there too, 2 for
 * "output" (a planner reads when each output chunk was last written), else 0. It returns
 * None, having changed nothing, for anything it does not recognise: an op other than
 * copy/reduce (engine steps), a dependency that names no instruction, a malformed tuple. The
 * Python path then runs and raises the precise, typed error where there is one.
 *
 * word_arrays(words, copy, reduce, host[, output]) reads the same from a schedule packed as
 * Schedule.to_packed's int64 words (the grammar is in cx_unpack.c; copy, reduce, host and
 * output are the indices of those ops and buffers), for candidates the planner made as words
 * (cx_lower.c's lower_words): the same arrays, and None for words that do not parse as well.
 * It reads them without the GIL, so candidates judged on threads are read at once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cx_schedule_arrays.h"
#include "cx_unpack.h"

enum { F_RANK, F_DST_RANK, F_DST_BUF, F_DST_CHUNK, F_DST_COUNT, F_SRC_OFF, F_SRC_RANK,
       F_SRC_HOST, F_PRED_OFF, F_PREDS, F_SUCC_OFF, F_SUCCS, F_COUNT };

typedef struct {
  Py_ssize_t n;              /* instructions */
  Py_ssize_t nlanes;         /* lanes over all ranks */
  PyObject** instrs;         /* borrowed: node -> Instr (the schedule keeps them alive) */
  Py_ssize_t* at;            /* or, read from words: node -> its first word */
  Py_ssize_t* rank_lane0;    /* rank -> its first global lane; nranks + 1 entries */
  Py_ssize_t* lane_base;     /* global lane -> node of its first instruction; nlanes + 1 */
  int32_t* out[F_COUNT];
  Py_ssize_t len[F_COUNT];
} Walk;

static void walk_free(Walk* w) {
  free(w->instrs);
  free(w->at);
  free(w->rank_lane0);
  free(w->lane_base);
  for (int i = 0; i < F_COUNT; ++i) free(w->out[i]);
}

/* A Python int that fits an int32, else -1 with *ok cleared (and no Python error left). */
static int32_t small_int(PyObject* o, int* ok) {
  long v = PyLong_Check(o) ? PyLong_AsLong(o) : -1;
  if (v < 0 || v > INT32_MAX) {
    PyErr_Clear();
    *ok = 0;
    return -1;
  }
  return (int32_t)v;
}

/* Ref(rank, buf, chunk, count): writes what the simulator needs, ``*host`` 1 for "host" and,
 * for a destination (chunk asked), 2 for "output"; 0 when malformed. */
static int read_ref(PyObject* ref, int32_t* rank, int32_t* host, int32_t* chunk,
                    int32_t* count) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) < 4) return 0;
  PyObject* buf = PyTuple_GET_ITEM(ref, 1);
  if (!PyUnicode_Check(buf)) return 0;
  int ok = 1;
  *rank = small_int(PyTuple_GET_ITEM(ref, 0), &ok);
  if (chunk != NULL) *chunk = small_int(PyTuple_GET_ITEM(ref, 2), &ok);
  if (count != NULL) *count = small_int(PyTuple_GET_ITEM(ref, 3), &ok);
  *host = PyUnicode_CompareWithASCIIString(buf, "host") == 0 ? 1
          : chunk != NULL && PyUnicode_CompareWithASCIIString(buf, "output") == 0 ? 2 : 0;
  return ok;
}

/* Pass 1: count lanes and instructions, keep borrowed pointers to the instructions. */
static int number_lanes(PyObject* lanes, Walk* w) {
  static PyObject* instrs_name = NULL;
  if (instrs_name == NULL && (instrs_name = PyUnicode_InternFromString("instrs")) == NULL)
    return -1;
  if (!PyTuple_Check(lanes)) return 0;
  Py_ssize_t nranks = PyTuple_GET_SIZE(lanes), cap = 1024;
  w->rank_lane0 = malloc((size_t)(nranks + 1) * sizeof(Py_ssize_t));
  w->lane_base = malloc(64 * sizeof(Py_ssize_t));
  w->instrs = malloc((size_t)cap * sizeof(PyObject*));
  Py_ssize_t lane_cap = 64;
  if (w->rank_lane0 == NULL || w->lane_base == NULL || w->instrs == NULL) return -1;
  for (Py_ssize_t r = 0; r < nranks; ++r) {
    PyObject* rank_lanes = PyTuple_GET_ITEM(lanes, r);
    if (!PyTuple_Check(rank_lanes)) return 0;
    w->rank_lane0[r] = w->nlanes;
    for (Py_ssize_t l = 0; l < PyTuple_GET_SIZE(rank_lanes); ++l) {
      PyObject* ins = PyObject_GetAttr(PyTuple_GET_ITEM(rank_lanes, l), instrs_name);
      if (ins == NULL) {   /* not a Lane: the Python path says what it is */
        PyErr_Clear();
        return 0;
      }
      int is_tuple = PyTuple_Check(ins);
      Py_DECREF(ins);   /* the Lane keeps its tuple alive */
      if (!is_tuple) return 0;
      Py_ssize_t k = PyTuple_GET_SIZE(ins);
      if (w->nlanes + 2 > lane_cap) {
        lane_cap *= 2;
        Py_ssize_t* grown = realloc(w->lane_base, (size_t)lane_cap * sizeof(Py_ssize_t));
        if (grown == NULL) return -1;
        w->lane_base = grown;
      }
      if (w->n + k > cap) {
        while (w->n + k > cap) cap *= 2;
        PyObject** grown = realloc(w->instrs, (size_t)cap * sizeof(PyObject*));
        if (grown == NULL) return -1;
        w->instrs = grown;
      }
      w->lane_base[w->nlanes++] = w->n;
      for (Py_ssize_t i = 0; i < k; ++i) w->instrs[w->n + i] = PyTuple_GET_ITEM(ins, i);
      w->n += k;
    }
  }
  w->rank_lane0[nranks] = w->nlanes;
  w->lane_base[w->nlanes] = w->n;
  if (w->n > INT32_MAX / 2) return 0;
  return 1;
}

static int alloc_out(Walk* w, int field, Py_ssize_t len) {
  w->len[field] = len;
  w->out[field] = malloc((size_t)(len > 0 ? len : 1) * sizeof(int32_t));
  return w->out[field] != NULL;
}

/* The node a Dep(rank, lane, index) names, or -1 when it names none. */
static Py_ssize_t dep_node(const Walk* w, Py_ssize_t nranks, PyObject* dep) {
  if (!PyTuple_Check(dep) || PyTuple_GET_SIZE(dep) < 3) return -1;
  int ok = 1;
  int32_t r = small_int(PyTuple_GET_ITEM(dep, 0), &ok);
  int32_t l = small_int(PyTuple_GET_ITEM(dep, 1), &ok);
  int32_t i = small_int(PyTuple_GET_ITEM(dep, 2), &ok);
  if (!ok || r >= nranks) return -1;
  Py_ssize_t lane = w->rank_lane0[r] + l;
  if (lane >= w->rank_lane0[r + 1]) return -1;
  Py_ssize_t node = w->lane_base[lane] + i;
  return node < w->lane_base[lane + 1] ? node : -1;
}

/* The per-instruction arrays for ``nsrc`` sources and ``ndep`` explicit dependencies: 0, or
 * -1 out of memory. */
static int alloc_arrays(Walk* w, Py_ssize_t nsrc, Py_ssize_t ndep) {
  Py_ssize_t n = w->n;
  for (int f = F_RANK; f <= F_DST_COUNT; ++f)
    if (!alloc_out(w, f, n)) return -1;
  if (!alloc_out(w, F_SRC_OFF, n + 1) || !alloc_out(w, F_SRC_RANK, nsrc) ||
      !alloc_out(w, F_SRC_HOST, nsrc) || !alloc_out(w, F_PRED_OFF, n + 1) ||
      !alloc_out(w, F_PREDS, n + ndep))
    return -1;
  w->out[F_SRC_OFF][0] = w->out[F_PRED_OFF][0] = 0;
  return 0;
}

/* Advance *lane and *rank (they only grow) to those of node ``v``, past empty lanes. */
static void locate(const Walk* w, Py_ssize_t v, Py_ssize_t* lane, int32_t* rank) {
  while (w->lane_base[*lane + 1] <= v) ++*lane;
  while (w->rank_lane0[*rank + 1] <= *lane) ++*rank;
}

/* Append predecessor ``u`` to the list that starts at ``first`` (and ends at *p), unless it
 * is there already: a handful of predecessors, so a scan beats a set. */
static void add_pred(Walk* w, Py_ssize_t first, Py_ssize_t* p, Py_ssize_t u) {
  for (Py_ssize_t q = first; q < *p; ++q)
    if (w->out[F_PREDS][q] == u) return;
  w->out[F_PREDS][(*p)++] = (int32_t)u;
}

/* Pass 2: per instruction, its references and predecessors. */
static int read_instrs(Walk* w, Py_ssize_t nranks) {
  Py_ssize_t n = w->n, nsrc = 0, ndep = 0;
  for (Py_ssize_t v = 0; v < n; ++v) {
    PyObject* ins = w->instrs[v];
    if (!PyTuple_Check(ins) || PyTuple_GET_SIZE(ins) < 4) return 0;
    PyObject* srcs = PyTuple_GET_ITEM(ins, 2);
    PyObject* deps = PyTuple_GET_ITEM(ins, 3);
    if (!PyTuple_Check(srcs) || !PyTuple_Check(deps)) return 0;
    nsrc += PyTuple_GET_SIZE(srcs);
    ndep += PyTuple_GET_SIZE(deps);
  }
  if (alloc_arrays(w, nsrc, ndep) < 0) return -1;
  Py_ssize_t lane = 0, s = 0, p = 0;
  int32_t rank = 0;
  for (Py_ssize_t v = 0; v < n; ++v) {
    locate(w, v, &lane, &rank);
    PyObject* ins = w->instrs[v];
    PyObject* op = PyTuple_GET_ITEM(ins, 0);
    if (!PyUnicode_Check(op) || (PyUnicode_CompareWithASCIIString(op, "copy") != 0 &&
                                 PyUnicode_CompareWithASCIIString(op, "reduce") != 0))
      return 0;
    w->out[F_RANK][v] = rank;
    if (!read_ref(PyTuple_GET_ITEM(ins, 1), &w->out[F_DST_RANK][v], &w->out[F_DST_BUF][v],
                  &w->out[F_DST_CHUNK][v], &w->out[F_DST_COUNT][v]))
      return 0;
    PyObject* srcs = PyTuple_GET_ITEM(ins, 2);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(srcs); ++i, ++s)
      if (!read_ref(PyTuple_GET_ITEM(srcs, i), &w->out[F_SRC_RANK][s], &w->out[F_SRC_HOST][s],
                    NULL, NULL))
        return 0;
    w->out[F_SRC_OFF][v + 1] = (int32_t)s;
    Py_ssize_t first = p;
    if (v > w->lane_base[lane]) w->out[F_PREDS][p++] = (int32_t)(v - 1);
    PyObject* deps = PyTuple_GET_ITEM(ins, 3);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(deps); ++i) {
      Py_ssize_t u = dep_node(w, nranks, PyTuple_GET_ITEM(deps, i));
      if (u < 0) return 0;
      add_pred(w, first, &p, u);
    }
    w->out[F_PRED_OFF][v + 1] = (int32_t)p;
  }
  w->len[F_PREDS] = p;
  return 1;
}

/* The predecessor lists turned around: successors of each node in increasing node order. */
static int invert_preds(Walk* w) {
  Py_ssize_t n = w->n, m = w->len[F_PREDS];
  if (!alloc_out(w, F_SUCC_OFF, n + 1) || !alloc_out(w, F_SUCCS, m)) return -1;
  int32_t* off = w->out[F_SUCC_OFF];
  memset(off, 0, (size_t)(n + 1) * sizeof(int32_t));
  for (Py_ssize_t j = 0; j < m; ++j) ++off[w->out[F_PREDS][j] + 1];
  for (Py_ssize_t v = 0; v < n; ++v) off[v + 1] += off[v];
  int32_t* fill = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
  if (fill == NULL) return -1;
  memcpy(fill, off, (size_t)n * sizeof(int32_t));
  for (Py_ssize_t v = 0; v < n; ++v)
    for (int32_t j = w->out[F_PRED_OFF][v]; j < w->out[F_PRED_OFF][v + 1]; ++j)
      w->out[F_SUCCS][fill[w->out[F_PREDS][j]]++] = (int32_t)v;
  free(fill);
  return 1;
}

/* Instructions on the longest chain of dependent ones (lane order plus deps), by Kahn's
 * algorithm over the CSR; -1 when some never become ready (a cycle). */
static Py_ssize_t longest_chain(const Walk* w) {
  Py_ssize_t n = w->n, head = 0, tail = 0, longest = 0;
  int32_t* waiting = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
  int32_t* depth = calloc((size_t)(n > 0 ? n : 1), sizeof(int32_t));
  int32_t* ready = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
  if (waiting == NULL || depth == NULL || ready == NULL) {
    free(waiting), free(depth), free(ready);
    return -2;
  }
  for (Py_ssize_t v = 0; v < n; ++v) {
    waiting[v] = w->out[F_PRED_OFF][v + 1] - w->out[F_PRED_OFF][v];
    if (waiting[v] == 0) ready[tail++] = (int32_t)v;
  }
  while (head < tail) {
    int32_t u = ready[head++];
    int32_t d = ++depth[u];   /* 1 + the deepest predecessor, already stored */
    if (d > longest) longest = d;
    for (int32_t j = w->out[F_SUCC_OFF][u]; j < w->out[F_SUCC_OFF][u + 1]; ++j) {
      int32_t v = w->out[F_SUCCS][j];
      if (depth[v] < d) depth[v] = d;
      if (--waiting[v] == 0) ready[tail++] = v;
    }
  }
  free(waiting), free(depth), free(ready);
  return tail == n ? longest : -1;
}

static PyObject* to_arrays(Walk* w, Py_ssize_t longest) {
  PyObject* result = PyTuple_New(F_COUNT + 1);
  if (result == NULL) return NULL;
  for (int f = 0; f < F_COUNT; ++f) {
    PyObject* a = PyBytes_FromStringAndSize((const char*)w->out[f],
                                            w->len[f] * (Py_ssize_t)sizeof(int32_t));
    if (a == NULL) {
      Py_DECREF(result);
      return NULL;
    }
    PyTuple_SET_ITEM(result, f, a);
  }
  PyObject* chain = PyLong_FromSsize_t(longest);
  if (chain == NULL) {
    Py_DECREF(result);
    return NULL;
  }
  PyTuple_SET_ITEM(result, F_COUNT, chain);
  return result;
}

/* The passes after reading, for a walk whose reading returned ``rc`` (1 read, 0 not
 * recognised, -1 out of memory): successors and the longest chain (into *longest), plain C
 * that needs no GIL. Returns the walk's status as ``rc`` does. */
static int completed(Walk* w, int rc, Py_ssize_t* longest) {
  if (rc == 1) rc = invert_preds(w);
  if (rc == 1 && (*longest = longest_chain(w)) == -2) rc = -1;
  return rc;
}

/* The arrays of a completed walk (None where it was not recognised), the walk freed. */
static PyObject* finished(Walk* w, int rc, Py_ssize_t longest) {
  PyObject* result = NULL;
  if (rc == 1) {
    result = to_arrays(w, longest);
  } else if (rc == 0) {
    result = Py_NewRef(Py_None);
  } else if (!PyErr_Occurred()) {
    PyErr_NoMemory();
  }
  walk_free(w);
  return result;
}

PyObject* cx_schedule_arrays(PyObject* self, PyObject* lanes) {
  (void)self;
  Walk w;
  memset(&w, 0, sizeof w);
  Py_ssize_t longest = 0;
  int rc = number_lanes(lanes, &w);
  if (rc == 1) rc = read_instrs(&w, PyTuple_GET_SIZE(lanes));
  rc = completed(&w, rc, &longest);
  return finished(&w, rc, longest);
}


/* -- word_arrays ------------------------------------------------------------------------------- */
typedef struct {
  const char* w;   /* the words, little-endian, not necessarily aligned */
  Py_ssize_t n;
  int64_t copy, reduce, host, output;
} Words;

/* Word ``i``, or -1 past the end (every count and index read is then refused). */
static int64_t word(const Words* ws, Py_ssize_t i) {
  if (i >= ws->n) return -1;
  int64_t v;
  memcpy(&v, ws->w + 8 * i, 8);
  return cx_le64(v);
}

/* Pass 1 over words: lanes, instructions and where each one starts (like number_lanes). 1, 0
 * for words that do not parse or hold an engine step, -1 out of memory. */
static int number_words(const Words* ws, Walk* w) {
  Py_ssize_t i = 0, cap = 1024, lane_cap = 64;
  int64_t nranks = word(ws, i++);
  if (nranks < 1 || nranks > ws->n) return 0;
  w->rank_lane0 = malloc((size_t)(nranks + 1) * sizeof(Py_ssize_t));
  w->lane_base = malloc((size_t)lane_cap * sizeof(Py_ssize_t));
  w->at = malloc((size_t)cap * sizeof(Py_ssize_t));
  if (w->rank_lane0 == NULL || w->lane_base == NULL || w->at == NULL) return -1;
  for (int64_t r = 0; r < nranks; ++r) {
    int64_t nl = word(ws, i++);
    if (nl < 0 || nl > ws->n) return 0;
    w->rank_lane0[r] = w->nlanes;
    for (int64_t l = 0; l < nl; ++l) {
      int64_t k = word(ws, i++);
      if (k < 0 || k > ws->n) return 0;
      if (w->nlanes + 2 > lane_cap) {
        lane_cap *= 2;
        Py_ssize_t* grown = realloc(w->lane_base, (size_t)lane_cap * sizeof(Py_ssize_t));
        if (grown == NULL) return -1;
        w->lane_base = grown;
      }
      w->lane_base[w->nlanes++] = w->n;
      for (int64_t j = 0; j < k; ++j) {
        if (w->n == cap) {
          cap *= 2;
          Py_ssize_t* grown = realloc(w->at, (size_t)cap * sizeof(Py_ssize_t));
          if (grown == NULL) return -1;
          w->at = grown;
        }
        w->at[w->n++] = i;
        int64_t op = word(ws, i);
        int64_t nsrc = word(ws, i + 5);
        if ((op != ws->copy && op != ws->reduce) || nsrc < 0 || nsrc > ws->n) return 0;
        i += 6 + 4 * nsrc;
        int64_t ndep = word(ws, i);
        if (ndep < 0 || ndep > ws->n) return 0;
        i += 1 + 3 * ndep;
        if (word(ws, i++) != -1) return 0;   /* an engine step, or past the end */
      }
    }
  }
  if (i != ws->n || w->n > INT32_MAX / 2) return 0;
  w->rank_lane0[nranks] = w->nlanes;
  w->lane_base[w->nlanes] = w->n;
  return 1;
}

/* The node of the Dep at words ``d`` (rank, lane, index), or -1 when it names none. */
static Py_ssize_t word_dep_node(const Walk* w, const Words* ws, Py_ssize_t d, int64_t nranks) {
  int64_t r = word(ws, d), l = word(ws, d + 1), i = word(ws, d + 2);
  if (r < 0 || r >= nranks || l < 0 || i < 0) return -1;
  if (l >= w->rank_lane0[r + 1] - w->rank_lane0[r]) return -1;
  Py_ssize_t lane = w->rank_lane0[r] + l;
  if (i >= w->lane_base[lane + 1] - w->lane_base[lane]) return -1;
  return w->lane_base[lane] + i;
}

/* A reference at words ``i``: rank and host flag (as read_ref's), chunk and count where asked;
 * 0 when a field does not fit an int32. */
static int word_ref(const Words* ws, Py_ssize_t i, int32_t* rank, int32_t* host,
                    int32_t* chunk, int32_t* count) {
  int64_t f[4] = {word(ws, i), word(ws, i + 1), word(ws, i + 2), word(ws, i + 3)};
  for (int k = 0; k < 4; ++k)
    if (f[k] < 0 || f[k] > INT32_MAX) return 0;
  *rank = (int32_t)f[0];
  *host = f[1] == ws->host ? 1 : chunk != NULL && f[1] == ws->output ? 2 : 0;
  if (chunk != NULL) *chunk = (int32_t)f[2];
  if (count != NULL) *count = (int32_t)f[3];
  return 1;
}

/* Pass 2 over words: as read_instrs. */
static int read_words(Walk* w, const Words* ws, int64_t nranks) {
  Py_ssize_t n = w->n, nsrc = 0, ndep = 0;
  for (Py_ssize_t v = 0; v < n; ++v) {
    int64_t k = word(ws, w->at[v] + 5);
    nsrc += k;
    ndep += word(ws, w->at[v] + 6 + 4 * k);
  }
  if (alloc_arrays(w, nsrc, ndep) < 0) return -1;
  Py_ssize_t lane = 0, s = 0, p = 0;
  int32_t rank = 0;
  for (Py_ssize_t v = 0; v < n; ++v) {
    locate(w, v, &lane, &rank);
    Py_ssize_t i = w->at[v];
    w->out[F_RANK][v] = rank;
    if (!word_ref(ws, i + 1, &w->out[F_DST_RANK][v], &w->out[F_DST_BUF][v],
                  &w->out[F_DST_CHUNK][v], &w->out[F_DST_COUNT][v]))
      return 0;
    int64_t k = word(ws, i + 5);
    for (int64_t j = 0; j < k; ++j, ++s)
      if (!word_ref(ws, i + 6 + 4 * j, &w->out[F_SRC_RANK][s], &w->out[F_SRC_HOST][s], NULL,
                    NULL))
        return 0;
    w->out[F_SRC_OFF][v + 1] = (int32_t)s;
    Py_ssize_t first = p, d = i + 6 + 4 * k;
    if (v > w->lane_base[lane]) w->out[F_PREDS][p++] = (int32_t)(v - 1);
    for (int64_t j = 0, m = word(ws, d); j < m; ++j) {
      Py_ssize_t u = word_dep_node(w, ws, d + 1 + 3 * j, nranks);
      if (u < 0) return 0;
      add_pred(w, first, &p, u);
    }
    w->out[F_PRED_OFF][v + 1] = (int32_t)p;
  }
  w->len[F_PREDS] = p;
  return 1;
}

PyObject* cx_word_arrays(PyObject* self, PyObject* args) {
  (void)self;
  Py_buffer buf;
  long long copy, reduce, host, output = -1;
  if (!PyArg_ParseTuple(args, "y*LLL|L:word_arrays", &buf, &copy, &reduce, &host, &output))
    return NULL;
  Walk w;
  memset(&w, 0, sizeof w);
  Words ws = {buf.buf, buf.len / 8, copy, reduce, host, output};
  Py_ssize_t longest = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS   /* plain C over the held buffer: two candidates are read at once */
  rc = buf.len % 8 ? 0 : number_words(&ws, &w);
  if (rc == 1) rc = read_words(&w, &ws, word(&ws, 0));
  rc = completed(&w, rc, &longest);
  Py_END_ALLOW_THREADS
  PyObject* result = finished(&w, rc, longest);
  PyBuffer_Release(&buf);
  return result;
}
