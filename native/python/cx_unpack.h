/* collectx._fastpath.pack_words and unpack_words (cx_unpack.c): Schedule.to_packed's and
 * from_packed's loops, which write and rebuild every instruction of a schedule as int64 words,
 * for collectx.schedule.ir. */
#ifndef CX_UNPACK_H
#define CX_UNPACK_H

#include <Python.h>
#include <stdint.h>

/* ``v`` as a little-endian word (the byte order of every word written). */
static inline int64_t cx_le64(int64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return (int64_t)__builtin_bswap64((uint64_t)v);
#else
  return v;
#endif
}

PyObject* cx_pack_words(PyObject* self, PyObject* args);
PyObject* cx_unpack_words(PyObject* self, PyObject* args);

#define CX_PACK_WORDS_DOC                                                                      \
  "pack_words(lanes, ops, buffers, engine_ops) -> bytes\n\n"                                   \
  "A schedule's lanes (a tuple per rank of Lanes) as little-endian int64 words; ops and\n"    \
  "buffers map names to indices, and engine_ops (a dict, filled in) each engine call's\n"     \
  "engine_op to its index, in order of first use. See native/python/cx_unpack.c."

#define CX_UNPACK_WORDS_DOC                                                                    \
  "unpack_words(words, ops, buffers, engine_ops, Instr, Ref, Dep, Lane)\n\n"                   \
  "The lanes of pack_words' words as a tuple per rank of tuples of Lane, ops, buffers and\n"  \
  "engine_ops by their index in the tuples given. ValueError, TypeError or IndexError on\n"   \
  "malformed words. See native/python/cx_unpack.c."

#endif
