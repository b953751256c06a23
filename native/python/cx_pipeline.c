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
 * c * k + j * m. It returns (lanes, single): ``single`` is True when every ref names one
 * chunk; otherwise the caller must check that no written run overlaps another in part (the
 * pieces would not line up), which takes sets and sorting and stays in Python. It returns
 * None, having built nothing that survives, unless every instruction is a copy or a reduce
 * with well-formed refs and deps: the Python path then cuts it or raises the typed error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cx_named.h"
#include "cx_pipeline.h"

/* Whether ``ref`` is a 4-tuple naming a run of one or more chunks from a non-negative index;
 * clears *single when the run is longer than one chunk. */
static int run_ref(PyObject* ref, int* single) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) != 4) return 0;
  PyObject* count = PyTuple_GET_ITEM(ref, 3);
  PyObject* chunk = PyTuple_GET_ITEM(ref, 2);
  if (!PyLong_Check(count) || !PyLong_Check(chunk)) return 0;
  int overflow = 0;
  long m = PyLong_AsLongAndOverflow(count, &overflow);
  if (overflow || m < 1) return 0;
  if (m != 1) *single = 0;
  long i = PyLong_AsLongAndOverflow(chunk, &overflow);
  return !overflow && i >= 0;
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
static int cuttable(PyObject* ins, int* single) {
  if (!PyTuple_Check(ins) || PyTuple_GET_SIZE(ins) != 6) return 0;
  PyObject* op = PyTuple_GET_ITEM(ins, 0);
  if (!PyUnicode_Check(op) || (PyUnicode_CompareWithASCIIString(op, "copy") != 0 &&
                               PyUnicode_CompareWithASCIIString(op, "reduce") != 0))
    return 0;
  PyObject* srcs = PyTuple_GET_ITEM(ins, 2);
  PyObject* deps = PyTuple_GET_ITEM(ins, 3);
  if (!run_ref(PyTuple_GET_ITEM(ins, 1), single) || !PyTuple_Check(srcs) ||
      !PyTuple_Check(deps))
    return 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(srcs); ++i)
    if (!run_ref(PyTuple_GET_ITEM(srcs, i), single)) return 0;
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
                             PyTypeObject* Dep, PyObject* Lane, int* single) {
  PyObject* instrs = PyObject_GetAttrString(lane, "instrs");
  if (instrs == NULL) return NULL;
  if (!PyTuple_Check(instrs)) {
    Py_DECREF(instrs);
    Py_RETURN_NONE;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(instrs);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!cuttable(PyTuple_GET_ITEM(instrs, i), single)) {
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
  Py_ssize_t nranks = PyTuple_GET_SIZE(lanes);
  int single = 1;
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
      PyObject* lane = lane_pieces(PyTuple_GET_ITEM(rank, l), k, Instr, Ref, Dep, Lane, &single);
      if (lane == NULL || lane == Py_None) {
        Py_DECREF(out);
        return lane;   /* an error, or None: the Python path decides */
      }
      PyTuple_SET_ITEM(mine, l, lane);
    }
  }
  if (out == NULL) return NULL;
  PyObject* result = Py_BuildValue("(NO)", out, single ? Py_True : Py_False);
  return result;
}
