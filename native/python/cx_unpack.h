/* collectx._fastpath.unpack_code (cx_unpack.c): Schedule.from_packed's loop, which rebuilds
 * every instruction of a packed schedule, for collectx.schedule.ir.Schedule.from_packed. */
#ifndef CX_UNPACK_H
#define CX_UNPACK_H

#include <Python.h>

PyObject* cx_unpack_code(PyObject* self, PyObject* args);

#define CX_UNPACK_CODE_DOC                                                                     \
  "unpack_code(code, ops, buffers, Instr, Ref, Dep, Lane)\n\n"                                 \
  "The lanes of Schedule.to_packed's 'code' (a list per rank of lists per lane of rows\n"     \
  "[op, dst, srcs(, deps(, engine_op, group))]) as a tuple per rank of tuples of Lane, ops\n"  \
  "and buffers by their index in the tuples given. ValueError, TypeError or IndexError on\n"  \
  "malformed data. See native/python/cx_unpack.c."

#endif
