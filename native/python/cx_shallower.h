/* collectx._fastpath.shallower (cx_shallower.c): the local moves that shorten Lovász's trees,
 * for collectx.planner.integral_trees._shallower (~40 ms of Python per call on 6 GPUs, a few
 * calls per plan). */
#ifndef CX_SHALLOWER_H
#define CX_SHALLOWER_H

#include <Python.h>

PyObject* cx_shallower(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#define CX_SHALLOWER_DOC                                                                        \
  "shallower(left, root, trees)\n\n"                                                            \
  "The k >= 1 out-trees from root (each a sequence of (parent, child) pairs spanning every\n"   \
  "node) after the local moves of collectx/planner/integral_trees.py's _shallower: a list of\n" \
  "k lists of top-down (parent, child) tuples. left: the unused lanes of every arc, a\n"        \
  "C-contiguous float64 n x n array (read, not changed). See native/python/cx_shallower.c."

#endif
