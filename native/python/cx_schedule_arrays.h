/* collectx._fastpath.schedule_arrays (cx_schedule_arrays.c): a schedule's instructions as flat
 * int32 arrays for the flow simulator. */
#ifndef CX_SCHEDULE_ARRAYS_H
#define CX_SCHEDULE_ARRAYS_H

#include <Python.h>

PyObject* cx_schedule_arrays(PyObject* self, PyObject* lanes);

#define CX_SCHEDULE_ARRAYS_DOC                                                                 \
  "schedule_arrays(lanes) -> tuple of bytes (int32 arrays) or None\n\n"                       \
  "Schedule.lanes numbered and read in one pass for the flow simulator: per instruction its\n" \
  "rank and destination, its sources, predecessors and successors (CSR). None for anything\n"  \
  "but copy/reduce instructions with valid dependencies. See native/python/cx_schedule_arrays.c."

#endif
