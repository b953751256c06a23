/* collectx._fastpath.pack_words and unpack_words (cx_unpack.c): Schedule.to_packed's and
 * from_packed's loops, which write and rebuild every instruction of a schedule as int64 words,
 * for collectx.schedule.ir. */
#ifndef CX_UNPACK_H
#define CX_UNPACK_H

#include <Python.h>
#include <stdint.h>

/* A growing run of words (native order swapped to little-endian as written), and the name ->
 * index dicts its ops, buffers and engine_ops are written by: pack_words writes a whole
 * schedule with one; emit_words (cx_emit.c) one per lane. */
typedef struct {
  int64_t* words;       /* PyMem_Malloc'ed */
  Py_ssize_t used, size;
  PyObject* ops;        /* dicts: name -> index */
  PyObject* buffers;
  PyObject* engine_ops; /* filled by pack_words: an engine_op first seen gets the next index */
} CxWriter;

/* ``v`` as a little-endian word (the byte order of every word written). */
static inline int64_t cx_le64(int64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return (int64_t)__builtin_bswap64((uint64_t)v);
#else
  return v;
#endif
}

/* Append one word; a Ref(rank, buffer, chunk, count) as four; ``table[name]``. 0, or -1 with
 * an exception set (MemoryError, TypeError for a malformed Ref, KeyError for an unknown name). */
int cx_put(CxWriter* w, int64_t v);
int cx_put_ref(CxWriter* w, PyObject* ref);
int cx_put_index(CxWriter* w, PyObject* table, PyObject* name);

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
