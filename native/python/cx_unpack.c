/* collectx._fastpath.unpack_code: Schedule.from_packed's loop (collectx/schedule/ir.py), in C.
 *
 * Why it exists: a rank that takes its plan from the plan cache or from rank 0 rebuilds every
 * instruction of it, and a tree plan holds 10^4-10^5 of them (with their refs and
 * dependencies). In Python that took about 3 us an instruction: most of a warm first call.
 *
 * unpack_code(code, ops, buffers, Instr, Ref, Dep, Lane) builds what ir._unpacked builds, row
 * for row: Instr(ops[row[0]], ref(row[1]), tuple of ref(v) for row[2], tuple of
 * Dep(*x) for row[3] (none when absent), row[4] and tuple(row[5]) when present else None and
 * ()), a ref [rank, buffer, chunk, count] being Ref(rank, buffers[buffer], chunk, count); each
 * lane's instructions become Lane(tuple). Integers must be ints; a malformed row raises
 * ValueError (IndexError for an op or buffer index out of range) and nothing is returned.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cx_named.h"
#include "cx_unpack.h"

typedef struct {
  PyObject* ops;        /* tuple of op names */
  PyObject* buffers;    /* tuple of buffer names */
  PyTypeObject* instr;  /* the named tuples */
  PyTypeObject* ref;
  PyTypeObject* dep;
  PyObject* lane;       /* the Lane class, called with each lane's tuple */
} Types;

static PyObject* malformed(const char* what, PyObject* got) {
  PyErr_Format(PyExc_ValueError, "unpack_code: expected %s, got %R", what, got);
  return NULL;
}

/* The list ``v`` if it is a list of at least ``n`` items, else NULL with ValueError. */
static PyObject* list_of(PyObject* v, Py_ssize_t n, const char* what) {
  if (!PyList_Check(v) || PyList_GET_SIZE(v) < n) return malformed(what, v);
  return v;
}

/* A new reference to list item ``i`` when it is an int. */
static PyObject* int_at(PyObject* list, Py_ssize_t i) {
  PyObject* v = PyList_GET_ITEM(list, i);
  if (!PyLong_Check(v) || PyBool_Check(v)) return malformed("an integer", v);
  Py_INCREF(v);
  return v;
}

/* A new reference to ``table[list[i]]``. */
static PyObject* name_at(PyObject* table, PyObject* list, Py_ssize_t i) {
  PyObject* v = PyList_GET_ITEM(list, i);
  if (!PyLong_Check(v) || PyBool_Check(v)) return malformed("an index", v);
  Py_ssize_t k = PyLong_AsSsize_t(v);
  if (k == -1 && PyErr_Occurred()) return NULL;
  if (k < 0 || k >= PyTuple_GET_SIZE(table)) {
    PyErr_Format(PyExc_IndexError, "unpack_code: index %zd names none of %R", k, table);
    return NULL;
  }
  PyObject* name = PyTuple_GET_ITEM(table, k);
  Py_INCREF(name);
  return name;
}

/* Ref(rank, buffers[buffer], chunk, count) of [rank, buffer, chunk, count]. */
static PyObject* ref_of(const Types* t, PyObject* v) {
  if (!list_of(v, 4, "a ref [rank, buffer, chunk, count]")) return NULL;
  PyObject* items[4] = {NULL, NULL, NULL, NULL};
  if (!(items[0] = int_at(v, 0)) || !(items[1] = name_at(t->buffers, v, 1)) ||
      !(items[2] = int_at(v, 2)) || !(items[3] = int_at(v, 3))) {
    for (int j = 0; j < 4; ++j) Py_XDECREF(items[j]);
    return NULL;
  }
  return cx_named(t->ref, items, 4);
}

static PyObject* dep_of(const Types* t, PyObject* v) {
  if (!list_of(v, 3, "a dependency [rank, lane, index]")) return NULL;
  PyObject* items[3] = {NULL, NULL, NULL};
  if (!(items[0] = int_at(v, 0)) || !(items[1] = int_at(v, 1)) || !(items[2] = int_at(v, 2))) {
    for (int j = 0; j < 3; ++j) Py_XDECREF(items[j]);
    return NULL;
  }
  return cx_named(t->dep, items, 3);
}

/* tuple(make(t, x) for x in list); make NULL: the list's ints themselves (a group). */
static PyObject* tuple_of(const Types* t, PyObject* list, const char* what,
                          PyObject* (*make)(const Types*, PyObject*)) {
  if (!list_of(list, 0, what)) return NULL;
  Py_ssize_t n = PyList_GET_SIZE(list);
  PyObject* out = PyTuple_New(n);
  if (out == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = make ? make(t, PyList_GET_ITEM(list, i)) : int_at(list, i);
    if (item == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyTuple_SET_ITEM(out, i, item);
  }
  return cx_untrack_atomic(out);
}

static PyObject* instr_of(const Types* t, PyObject* row) {
  if (!list_of(row, 3, "an instruction [op, dst, srcs, ...]")) return NULL;
  Py_ssize_t n = PyList_GET_SIZE(row);
  if (n > 4 && n < 6) return malformed("an engine call's [..., engine_op, group]", row);
  PyObject* items[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  int ok = (items[0] = name_at(t->ops, row, 0)) && (items[1] = ref_of(t, PyList_GET_ITEM(row, 1))) &&
           (items[2] = tuple_of(t, PyList_GET_ITEM(row, 2), "a list of refs", ref_of));
  if (ok && n > 3) {
    ok = (items[3] = tuple_of(t, PyList_GET_ITEM(row, 3), "a list of dependencies", dep_of)) != NULL;
  } else if (ok) {
    ok = (items[3] = PyTuple_New(0)) != NULL;
  }
  if (ok && n > 4) {
    PyObject* op = PyList_GET_ITEM(row, 4);
    if (!PyUnicode_Check(op)) {
      malformed("an engine_op string", op);
      ok = 0;
    } else {
      Py_INCREF(op);
      items[4] = op;
      ok = (items[5] = tuple_of(t, PyList_GET_ITEM(row, 5), "a list of ranks", NULL)) != NULL;
    }
  } else if (ok) {
    Py_INCREF(Py_None);
    items[4] = Py_None;
    ok = (items[5] = PyTuple_New(0)) != NULL;
  }
  if (!ok) {
    for (int j = 0; j < 6; ++j) Py_XDECREF(items[j]);
    return NULL;
  }
  return cx_named(t->instr, items, 6);
}

static PyObject* lane_of(const Types* t, PyObject* rows) {
  PyObject* instrs = tuple_of(t, rows, "a lane's list of instructions", instr_of);
  if (instrs == NULL) return NULL;
  PyObject* lane = PyObject_CallOneArg(t->lane, instrs);
  Py_DECREF(instrs);
  return lane;
}

static PyObject* rank_of(const Types* t, PyObject* lanes) {
  return tuple_of(t, lanes, "a rank's list of lanes", lane_of);
}

PyObject* cx_unpack_code(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *code, *instr, *ref, *dep;
  Types t;
  if (!PyArg_ParseTuple(args, "OO!O!OOOO:unpack_code", &code, &PyTuple_Type, &t.ops,
                        &PyTuple_Type, &t.buffers, &instr, &ref, &dep, &t.lane))
    return NULL;
  PyObject* types[3] = {instr, ref, dep};
  for (int i = 0; i < 3; ++i) {
    if (!PyType_Check(types[i]) || !PyType_IsSubtype((PyTypeObject*)types[i], &PyTuple_Type)) {
      PyErr_SetString(PyExc_TypeError, "unpack_code: Instr, Ref and Dep must be tuple types");
      return NULL;
    }
  }
  t.instr = (PyTypeObject*)instr;
  t.ref = (PyTypeObject*)ref;
  t.dep = (PyTypeObject*)dep;
  return tuple_of(&t, code, "a list of ranks' lanes", rank_of);
}
