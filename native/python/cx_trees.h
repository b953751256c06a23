/* collectx._fastpath.tree_broadcast and tree_reduce (cx_trees.c): the tree emitter's item loops,
 * one share at a time, for collectx.planner.treesched.TreeEmitter.broadcast and reduce. */
#ifndef CX_TREES_H
#define CX_TREES_H

#include <Python.h>

PyObject* cx_tree_broadcast(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* cx_tree_reduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#define CX_TREE_BROADCAST_DOC                                                                  \
  "tree_broadcast(items, hop, number, share, pieces, keyed, src, dst, after)\n\n"              \
  "Append to items what TreeEmitter._broadcast_share appends for one share (the same\n"        \
  "arguments; src and dst are ChunkRefs), calling hop for the edges staged through host\n"     \
  "memory. Returns None. See native/python/cx_trees.c."

#define CX_TREE_REDUCE_DOC                                                                     \
  "tree_reduce(items, fresh, through_host, number, share, pieces, shapes, contrib, result,\n"  \
  "            done)\n\n"                                                                      \
  "Append to items what TreeEmitter._reduce_share appends for one share (the same\n"           \
  "arguments; contrib and result are ChunkRefs) and record each piece's root item in done,\n"  \
  "calling fresh for scratch chunks and through_host for the edges staged through host\n"     \
  "memory. Returns None. See native/python/cx_trees.c."

#endif
