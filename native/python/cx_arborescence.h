/* collectx._fastpath.min_arborescence (cx_arborescence.c): Chu-Liu/Edmonds over a small dense
 * cost matrix, for collectx.planner.treepack.min_arborescence (the packing LP's pricing asks
 * for thousands of them per 16-GPU plan). */
#ifndef CX_ARBORESCENCE_H
#define CX_ARBORESCENCE_H

#include <Python.h>

PyObject* cx_min_arborescence(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#define CX_MIN_ARBORESCENCE_DOC                                                                \
  "min_arborescence(W, root)\n\n"                                                              \
  "Parent of each node in a minimum-cost spanning arborescence rooted at root, W a\n"          \
  "C-contiguous float64 n x n array of arc costs (inf: no arc); None when some node is\n"      \
  "unreachable. See native/python/cx_arborescence.c."

#endif
