/* collectx._fastpath.emit_lanes and emit_words (cx_emit.c): the tree emitter's flush loop, which
 * deals time-ordered items onto lanes as instructions (objects or words), for
 * collectx.planner.treesched.TreeEmitter.flush. */
#ifndef CX_EMIT_H
#define CX_EMIT_H

#include <Python.h>

PyObject* cx_emit_lanes(PyObject* self, PyObject* args);
PyObject* cx_emit_words(PyObject* self, PyObject* args);

#define CX_EMIT_LANES_DOC                                                                      \
  "emit_lanes(items, lanes, lane_keys, sublanes, max_lanes, tag_sublanes, Instr, Dep)\n\n"    \
  "Append time-ordered emitter items (t, seq, rank, key, op, dst, srcs, tokens) to lanes\n"    \
  "[rank][lane] as Instr tuples, each key's items dealt round-robin over its sublanes\n"       \
  "(tag_sublanes[key[0]], else sublanes); lane_keys[rank] maps (key, sublane)\n"               \
  "to a lane number (modulo max_lanes) and is extended as TreeEmitter.lane extends it.\n"      \
  "Returns None. See native/python/cx_emit.c."

#define CX_EMIT_WORDS_DOC                                                                      \
  "emit_words(items, nranks, lane_keys, sublanes, max_lanes, tag_sublanes, ops, buffers)\n\n" \
  "The items emit_lanes would append, dealt onto the same lanes, as the int64 words of\n"      \
  "Schedule.to_packed (bytes): exactly the schedule emit_lanes and ScheduleBuilder.build\n"    \
  "make, with no Python object per instruction. See native/python/cx_emit.c."

#endif
