/* collectx._fastpath.max_flow (cx_maxflow.c): Edmonds-Karp over a small dense capacity matrix,
 * for collectx.planner.integral_trees.max_flow (Lovász's construction asks thousands of them
 * per 16-GPU plan). */
#ifndef CX_MAXFLOW_H
#define CX_MAXFLOW_H

#include <Python.h>

/* The C-contiguous float64 n x n matrix obj, into view: n; or 0 when obj is not one (view
 * released, no error set); or -1 with the buffer protocol's error set. */
int cx_square_matrix(PyObject* obj, Py_buffer* view);

/* NULL, with view released (when n > 0: it was taken) and a ValueError saying message unless
 * an error is already set: the refusal of a helper's arguments. */
PyObject* cx_refuse_matrix(Py_buffer* view, int n, const char* message);

/* The arguments every graph helper begins with, (matrix, node, ...), of which it takes want:
 * cx_square_matrix's n, *node read from args[1] (an error set if it is no int); or -1 with a
 * TypeError naming usage when there are not want of them. */
int cx_graph_args(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t want, const char* usage,
                  Py_buffer* view, long* node);

PyObject* cx_max_flow(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#define CX_MAX_FLOW_DOC                                                                        \
  "max_flow(cap, source, sink, enough)\n\n"                                                    \
  "Max-flow from source to sink over cap (a C-contiguous float64 n x n array), stopping\n"     \
  "once it reaches enough: (flow, reached), reached a bytes object of n flags, 1 for the\n"    \
  "nodes the source still reaches in the residual graph. See native/python/cx_maxflow.c."

PyObject* cx_paths_ok(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#define CX_PATHS_OK_DOC                                                                        \
  "paths_ok(mult, root, k, inside)\n\n"                                                        \
  "Lovász's condition for completing the tree over the GPUs flagged in inside (n bytes,\n"     \
  "root included) and k - 1 more trees from the arc counts mult (a C-contiguous float64\n"     \
  "n x n array). See collectx/planner/integral_trees.py's _paths_ok."

#endif
