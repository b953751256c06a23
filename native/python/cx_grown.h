/* collectx._fastpath.grown_together (cx_grown.c): Lovász's trees grown all at once and tested
 * over every vertex set, for collectx.planner.integral_trees._grown_together (~20 ms of numpy
 * and Python per call on 6 GPUs, a few calls per plan). */
#ifndef CX_GROWN_H
#define CX_GROWN_H

#include <Python.h>

/* Past this many GPUs the 2^(n-1) - 1 vertex sets are not written out (Python stops at 12). */
#define CX_GROWN_MAX_N 20

PyObject* cx_grown_together(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#define CX_GROWN_TOGETHER_DOC                                                                   \
  "grown_together(left, root, k)\n\n"                                                           \
  "The k >= 0 out-trees from root grown at once from the arc counts left (a writable\n"         \
  "C-contiguous float64 n x n array, n <= 20) as collectx/planner/integral_trees.py's\n"        \
  "_grown_together grows them: a list of k lists of (parent, child) tuples in the order\n"      \
  "taken, or None when no arc passes. left loses the arcs taken, as in Python (written back\n"  \
  "when the call returns, None included). See native/python/cx_grown.c."

#endif
