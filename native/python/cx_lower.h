/* collectx._fastpath.lower_words (cx_lower.c): a tree packing's schedule lowered straight to
 * packed words, for collectx.planner.treesched.WordEmitter. */
#ifndef CX_LOWER_H
#define CX_LOWER_H

#include <Python.h>

PyObject* cx_lower_words(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#define CX_LOWER_WORDS_DOC                                                                     \
  "lower_words(nranks, nchunks, lanes, turns, codes, scratch, host, phases) -> bytes\n\n"     \
  "The words of Schedule.to_packed for TreeEmitter's phases (self copies, tree reductions\n" \
  "and broadcasts) flushed in time order, with the builder's scratch and host unit lists\n"  \
  "updated in place. See native/python/cx_lower.c."

#endif
