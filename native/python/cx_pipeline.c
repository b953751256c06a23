/* collectx._fastpath.pipeline_lanes: collectx.schedule.split.pipeline's common case, in C.
 *
 * Why it exists: the planner cuts the instructions of a lagging tree plan into pieces
 * (collectx/schedule/split.py, pipeline) to see whether a finer pipeline finishes sooner. A
 * plan has tens of thousands of instructions; building k named tuples per instruction, their
 * refs and deps took the Python loop about 2 us a piece, longer than simulating the result.
 *
 * pipeline_lanes(lanes, k, Instr, Ref, Dep, Lane) takes Schedule.lanes and returns new lanes
 * in which every instruction is followed on its lane by its k - 1 other pieces: piece j of an
 * instruction names chunk c * k + j wherever the instruction named chunk c, and waits for
 * piece j of every instruction it waited for (index i -> i * k + j). The named tuples are
 * built as tuple.__new__ builds them, without their Python __new__.
 *
 * A run of m chunks starting at c becomes, in piece j, the run of m chunks starting at
 * c * k + j * m. It returns (lanes, single, apart): ``single`` is True when every ref names
 * one chunk; ``apart`` when no written run overlaps another run in part (the pieces would not
 * line up), tested here on the runs as named, since walking 10^5 refs into Python sets cost
 * more than the cut: the caller tests in-place schedules, whose input and output alias, itself
 * (split._check_pipelinable), and also raises the typed error when ``apart`` is False. It returns
 * None, having built nothing that survives, unless every instruction is a copy or a reduce
 * with well-formed refs and deps: the Python path then cuts it or raises the typed error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>

#include "cx_named.h"
#include "cx_pipeline.h"

/* One run of chunks a schedule names: rank, buffer (index into Walk.bufs), first chunk, count,
 * and whether some instruction writes it. */
typedef struct {
  long rank, buf, chunk, count;
  int written;
} Run;

/* What the walk over a schedule's refs has seen: whether every run is one chunk, and the
 * runs themselves (for the overlap test of runs of several chunks). */
typedef struct {
  int single;
  int too_many_buffers;   /* more distinct buffer names than bufs holds: no overlap test */
  Run* runs;
  size_t nruns, cap;
  PyObject* bufs[8];      /* borrowed: the schedule keeps them alive */
  int nbufs;
} Walk;

/* The index of buffer name ``buf`` in walk->bufs (added when new), or -1. */
static long buffer_index(Walk* walk, PyObject* buf) {
  for (int i = 0; i < walk->nbufs; ++i)
    if (walk->bufs[i] == buf) return i;
  for (int i = 0; i < walk->nbufs; ++i) {
    int eq = PyObject_RichCompareBool(walk->bufs[i], buf, Py_EQ);
    if (eq != 0) return eq > 0 ? i : (PyErr_Clear(), -1);
  }
  if (walk->nbufs == (int)(sizeof walk->bufs / sizeof walk->bufs[0])) return -1;
  walk->bufs[walk->nbufs] = buf;
  return walk->nbufs++;
}

/* Whether ``ref`` is a 4-tuple naming a run of one or more chunks from a non-negative index;
 * clears walk->single when the run is longer than one chunk, and records the run. */
static int run_ref(PyObject* ref, Walk* walk, int written) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) != 4) return 0;
  PyObject* count = PyTuple_GET_ITEM(ref, 3);
  PyObject* chunk = PyTuple_GET_ITEM(ref, 2);
  PyObject* rank = PyTuple_GET_ITEM(ref, 0);
  if (!PyLong_Check(count) || !PyLong_Check(chunk) || !PyLong_Check(rank)) return 0;
  int overflow = 0;
  long m = PyLong_AsLongAndOverflow(count, &overflow);
  if (overflow || m < 1) return 0;
  if (m != 1) walk->single = 0;
  long i = PyLong_AsLongAndOverflow(chunk, &overflow);
  if (overflow || i < 0) return 0;
  long r = PyLong_AsLongAndOverflow(rank, &overflow);
  if (overflow) return 0;
  long b = buffer_index(walk, PyTuple_GET_ITEM(ref, 1));
  if (b < 0) {
    walk->too_many_buffers = 1;
    return 1;
  }
  if (walk->nruns == walk->cap) {
    size_t cap = walk->cap ? 2 * walk->cap : 1024;
    Run* grown = realloc(walk->runs, cap * sizeof(Run));
    if (grown == NULL) {
      walk->too_many_buffers = 1;   /* no memory for the test: leave it to the caller */
      return 1;
    }
    walk->runs = grown, walk->cap = cap;
  }
  walk->runs[walk->nruns++] = (Run){r, b, i, m, written};
  return 1;
}

static int by_place(const void* a, const void* b) {
  const Run *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  if (x->buf != y->buf) return x->buf < y->buf ? -1 : 1;
  if (x->chunk != y->chunk) return x->chunk < y->chunk ? -1 : 1;
  return x->count < y->count ? -1 : x->count > y->count;
}

/* 1 when no written run overlaps another distinct run in part, 0 when one does (or the walk
 * could not record every run): split._check_runs_apart without aliasing, over sorted runs
 * whose overlapping neighbours form clusters. */
static int runs_apart(Walk* walk) {
  if (walk->too_many_buffers) return 0;
  qsort(walk->runs, walk->nruns, sizeof(Run), by_place);
  size_t i = 0;
  while (i < walk->nruns) {
    const Run* first = &walk->runs[i];
    long reach = first->chunk + first->count;
    int written = first->written, distinct = 1;
    size_t j = i + 1;
    for (; j < walk->nruns && walk->runs[j].rank == first->rank &&
           walk->runs[j].buf == first->buf && walk->runs[j].chunk < reach; ++j) {
      const Run* r = &walk->runs[j];
      const Run* prev = &walk->runs[j - 1];
      distinct += r->chunk != prev->chunk || r->count != prev->count;
      written |= r->written;
      if (r->chunk + r->count > reach) reach = r->chunk + r->count;
    }
    if (distinct > 1 && written) return 0;
    i = j;
  }
  return 1;
}

/* Piece j of ``ref``: chunk * k + j * count, the rest shared. */
static PyObject* ref_piece(PyTypeObject* Ref, PyObject* ref, long k, long j) {
  long chunk = PyLong_AsLong(PyTuple_GET_ITEM(ref, 2));
  long count = PyLong_AsLong(PyTuple_GET_ITEM(ref, 3));
  PyObject* items[4] = {Py_NewRef(PyTuple_GET_ITEM(ref, 0)), Py_NewRef(PyTuple_GET_ITEM(ref, 1)),
                        PyLong_FromLong(chunk * k + j * count),
                        Py_NewRef(PyTuple_GET_ITEM(ref, 3))};
  return cx_named(Ref, items, 4);
}

/* Piece j of dependency ``dep``: index * k + j, rank and lane shared. */
static PyObject* dep_piece(PyTypeObject* Dep, PyObject* dep, long k, long j) {
  long index = PyLong_AsLong(PyTuple_GET_ITEM(dep, 2));
  if (index == -1 && PyErr_Occurred()) return NULL;
  PyObject* items[3] = {Py_NewRef(PyTuple_GET_ITEM(dep, 0)), Py_NewRef(PyTuple_GET_ITEM(dep, 1)),
                        PyLong_FromLong(index * k + j)};
  return cx_named(Dep, items, 3);
}

/* 1 when ``ins`` is a copy/reduce Instr with well-formed refs (see run_ref) and deps
 * (3-tuples ending in an int), else 0. */
static int cuttable(PyObject* ins, Walk* walk) {
  if (!PyTuple_Check(ins) || PyTuple_GET_SIZE(ins) != 6) return 0;
  PyObject* op = PyTuple_GET_ITEM(ins, 0);
  if (!PyUnicode_Check(op) || (PyUnicode_CompareWithASCIIString(op, "copy") != 0 &&
                               PyUnicode_CompareWithASCIIString(op, "reduce") != 0))
    return 0;
  PyObject* srcs = PyTuple_GET_ITEM(ins, 2);
  PyObject* deps = PyTuple_GET_ITEM(ins, 3);
  if (!run_ref(PyTuple_GET_ITEM(ins, 1), walk, 1) || !PyTuple_Check(srcs) ||
      !PyTuple_Check(deps))
    return 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(srcs); ++i)
    if (!run_ref(PyTuple_GET_ITEM(srcs, i), walk, 0)) return 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(deps); ++i) {
    PyObject* d = PyTuple_GET_ITEM(deps, i);
    if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 3 || !PyLong_Check(PyTuple_GET_ITEM(d, 2)))
      return 0;
  }
  return 1;
}

/* Piece j of ``ins`` (already found cuttable). */
static PyObject* instr_piece(PyTypeObject* Instr, PyTypeObject* Ref, PyTypeObject* Dep,
                             PyObject* ins, long k, long j) {
  PyObject* srcs = PyTuple_GET_ITEM(ins, 2);
  PyObject* deps = PyTuple_GET_ITEM(ins, 3);
  Py_ssize_t ns = PyTuple_GET_SIZE(srcs), nd = PyTuple_GET_SIZE(deps);
  PyObject* items[6] = {Py_NewRef(PyTuple_GET_ITEM(ins, 0)),
                        ref_piece(Ref, PyTuple_GET_ITEM(ins, 1), k, j), PyTuple_New(ns),
                        PyTuple_New(nd), Py_NewRef(PyTuple_GET_ITEM(ins, 4)),
                        Py_NewRef(PyTuple_GET_ITEM(ins, 5))};
  int ok = items[1] != NULL && items[2] != NULL && items[3] != NULL;
  for (Py_ssize_t i = 0; ok && i < ns; ++i) {
    PyObject* r = ref_piece(Ref, PyTuple_GET_ITEM(srcs, i), k, j);
    if (r == NULL) ok = 0; else PyTuple_SET_ITEM(items[2], i, r);
  }
  for (Py_ssize_t i = 0; ok && i < nd; ++i) {
    PyObject* d = dep_piece(Dep, PyTuple_GET_ITEM(deps, i), k, j);
    if (d == NULL) ok = 0; else PyTuple_SET_ITEM(items[3], i, d);
  }
  if (!ok) {
    for (int i = 0; i < 6; ++i) Py_XDECREF(items[i]);
    return NULL;
  }
  cx_untrack_atomic(items[2]);
  cx_untrack_atomic(items[3]);
  return cx_named(Instr, items, 6);
}

/* The pieces of one lane's instructions, as a new Lane; NULL on error, Py_None (new
 * reference) when some instruction is not cuttable here. */
static PyObject* lane_pieces(PyObject* lane, long k, PyTypeObject* Instr, PyTypeObject* Ref,
                             PyTypeObject* Dep, PyObject* Lane, Walk* walk) {
  PyObject* instrs = PyObject_GetAttrString(lane, "instrs");
  if (instrs == NULL) return NULL;
  if (!PyTuple_Check(instrs)) {
    Py_DECREF(instrs);
    Py_RETURN_NONE;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(instrs);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!cuttable(PyTuple_GET_ITEM(instrs, i), walk)) {
      Py_DECREF(instrs);
      Py_RETURN_NONE;
    }
  PyObject* out = PyTuple_New(n * k);
  for (Py_ssize_t i = 0; out != NULL && i < n; ++i)
    for (long j = 0; j < k; ++j) {
      PyObject* p = instr_piece(Instr, Ref, Dep, PyTuple_GET_ITEM(instrs, i), k, j);
      if (p == NULL) {
        Py_CLEAR(out);
        break;
      }
      PyTuple_SET_ITEM(out, i * k + j, p);
    }
  Py_DECREF(instrs);
  if (out == NULL) return NULL;
  PyObject* result = PyObject_CallOneArg(Lane, cx_untrack_atomic(out));
  Py_DECREF(out);
  return result;
}

/* Every rank's lanes cut (see lane_pieces): a new tuple, NULL on error, or Py_None (new
 * reference) when the Python path must decide. */
static PyObject* cut_lanes(PyObject* lanes, long k, PyTypeObject* Instr, PyTypeObject* Ref,
                           PyTypeObject* Dep, PyObject* Lane, Walk* walk) {
  Py_ssize_t nranks = PyTuple_GET_SIZE(lanes);
  PyObject* out = PyTuple_New(nranks);
  for (Py_ssize_t r = 0; out != NULL && r < nranks; ++r) {
    PyObject* rank = PyTuple_GET_ITEM(lanes, r);
    if (!PyTuple_Check(rank)) {
      Py_DECREF(out);
      Py_RETURN_NONE;
    }
    Py_ssize_t nl = PyTuple_GET_SIZE(rank);
    PyObject* mine = PyTuple_New(nl);
    if (mine == NULL) {
      Py_CLEAR(out);
      break;
    }
    PyTuple_SET_ITEM(out, r, mine);
    for (Py_ssize_t l = 0; l < nl; ++l) {
      PyObject* lane = lane_pieces(PyTuple_GET_ITEM(rank, l), k, Instr, Ref, Dep, Lane, walk);
      if (lane == NULL || lane == Py_None) {
        Py_DECREF(out);
        return lane;   /* an error, or None: the Python path decides */
      }
      PyTuple_SET_ITEM(mine, l, lane);
    }
  }
  return out;
}

PyObject* cx_pipeline_lanes(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *lanes, *Lane;
  PyTypeObject *Instr, *Ref, *Dep;
  long k;
  if (!PyArg_ParseTuple(args, "O!lO!O!O!O:pipeline_lanes", &PyTuple_Type, &lanes, &k,
                        &PyType_Type, &Instr, &PyType_Type, &Ref, &PyType_Type, &Dep, &Lane))
    return NULL;
  if (k < 1 || !PyType_IsSubtype(Instr, &PyTuple_Type) || !PyType_IsSubtype(Ref, &PyTuple_Type) ||
      !PyType_IsSubtype(Dep, &PyTuple_Type)) {
    PyErr_SetString(PyExc_ValueError, "pipeline_lanes: k >= 1 and named tuple types expected");
    return NULL;
  }
  Walk walk = {1, 0, NULL, 0, 0, {NULL}, 0};
  PyObject* out = cut_lanes(lanes, k, Instr, Ref, Dep, Lane, &walk);
  int apart = out != NULL && out != Py_None && (walk.single || runs_apart(&walk));
  free(walk.runs);
  if (out == NULL || out == Py_None) return out;
  return Py_BuildValue("(NOO)", out, walk.single ? Py_True : Py_False,
                       apart ? Py_True : Py_False);
}
