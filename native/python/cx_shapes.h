/* collectx._fastpath.shape_groups (cx_shapes.c): a schedule's instructions grouped by shape,
 * for collectx/schedule/_flat.py (numpy's row sort took a fifth of a candidate's front end). */
#ifndef CX_SHAPES_H
#define CX_SHAPES_H

#include <Python.h>

PyObject* cx_shape_groups(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#define CX_SHAPE_GROUPS_DOC                                                                     \
  "shape_groups(me, dst, nbytes, src_off, src)\n\n"                                             \
  "Instructions with equal (me, dst, nbytes, sources) in one group: (ids, first), bytes of\n"   \
  "native int32 (the group of each instruction, numbered in order of first appearance) and\n"  \
  "int64 (each group's first instruction). me, dst: int32 per instruction; nbytes: int64;\n"    \
  "src_off: int32 CSR offsets (n + 1) into src, int32. ValueError for inconsistent lengths.\n"  \
  "See native/python/cx_shapes.c."

#endif
