/* Named tuples built in C as tuple.__new__ builds them, without their Python __new__: shared by
 * the planner helpers of collectx._fastpath (cx_unpack.c). */
#ifndef CX_NAMED_H
#define CX_NAMED_H

#include <Python.h>

/* Untracks ``tuple`` from the cyclic garbage collector when every item is untracked (ints,
 * strings, None, or such tuples), as the collector itself does when it first visits a tuple:
 * no cycle can pass through it. A plan builds hundreds of thousands of such tuples (refs,
 * dependencies); tracked, the first collection after planning visits each of them. */
static inline PyObject* cx_untrack_atomic(PyObject* tuple) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); ++i) {
    PyObject* item = PyTuple_GET_ITEM(tuple, i);
    if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item)) return tuple;
  }
  if (PyObject_GC_IsTracked(tuple)) PyObject_GC_UnTrack(tuple);
  return tuple;
}

/* A named tuple of type ``type`` holding ``n`` new references (stolen), untracked when its
 * items are (cx_untrack_atomic); NULL on failure, with the references released (entries may
 * be NULL after a failed allocation). */
static inline PyObject* cx_named(PyTypeObject* type, PyObject** items, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (items[i] == NULL) {
      for (Py_ssize_t j = 0; j < n; ++j) Py_XDECREF(items[j]);
      return NULL;
    }
  }
  PyObject* t = type->tp_alloc(type, n);
  if (t == NULL) {
    for (Py_ssize_t i = 0; i < n; ++i) Py_DECREF(items[i]);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t, i, items[i]);
  return cx_untrack_atomic(t);
}

#endif
