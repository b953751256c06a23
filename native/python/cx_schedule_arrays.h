/* collectx._fastpath.schedule_arrays and word_arrays (cx_schedule_arrays.c): a schedule's
 * instructions (objects or packed words) as flat int32 arrays for the flow simulator. */
#ifndef CX_SCHEDULE_ARRAYS_H
#define CX_SCHEDULE_ARRAYS_H

#include <Python.h>

PyObject* cx_schedule_arrays(PyObject* self, PyObject* lanes);
PyObject* cx_word_arrays(PyObject* self, PyObject* args);

#define CX_SCHEDULE_ARRAYS_DOC                                                                 \
  "schedule_arrays(lanes) -> tuple of bytes (int32 arrays) or None\n\n"                       \
  "Schedule.lanes numbered and read in one pass for the flow simulator: per instruction its\n" \
  "rank and destination, its sources, predecessors and successors (CSR). None for anything\n"  \
  "but copy/reduce instructions with valid dependencies. See native/python/cx_schedule_arrays.c."

#define CX_WORD_ARRAYS_DOC                                                                     \
  "word_arrays(words, copy, reduce, host) -> tuple of bytes (int32 arrays) or None\n\n"       \
  "schedule_arrays for a schedule packed as Schedule.to_packed's words (copy, reduce: their\n" \
  "op indices; host: the host buffer's index): the same arrays, None where it gives None or\n" \
  "the words do not parse. See native/python/cx_schedule_arrays.c."

#endif
