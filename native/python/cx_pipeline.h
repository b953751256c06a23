/* collectx._fastpath.pipeline_lanes (cx_pipeline.c): every instruction of a schedule cut into
 * k pieces in a row on its lane, for collectx.schedule.split.pipeline. */
#ifndef CX_PIPELINE_H
#define CX_PIPELINE_H

#include <Python.h>

PyObject* cx_pipeline_lanes(PyObject* self, PyObject* args);

#define CX_PIPELINE_LANES_DOC                                                                  \
  "pipeline_lanes(lanes, k, Instr, Ref, Dep, Lane) -> (lanes, single, apart) or None\n\n"   \
  "Schedule.lanes with every instruction followed by its k - 1 other pieces (run (c, m) ->\n"  \
  "(c*k + j*m, m), dependency index i -> i*k + j); single: every ref names one chunk; apart:\n" \
  "no written run overlaps another run in part (buffers taken as named, not aliased). None\n"  \
  "unless every instruction is a well-formed copy/reduce. See native/python/cx_pipeline.c."

#endif
