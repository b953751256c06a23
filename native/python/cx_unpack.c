/* collectx._fastpath.pack_words / unpack_words: Schedule.to_packed's and from_packed's loops
 * (collectx/schedule/ir.py), in C.
 *
 * Why they exist: a rank that takes its plan from the plan cache or from rank 0 rebuilds every
 * instruction of it, and a tree plan holds 10^4-10^5 of them (with their refs and
 * dependencies). Read from JSON, the parse alone built a million Python lists and ints first
 * (25-70 ms for an 8-GPU allgather): most of a warm first call. Here the instructions are a
 * flat run of little-endian int64 words, and the only objects made are the ones kept.
 *
 * The words (ir.py's _pack_words writes the same in Python): the rank count; per rank its lane
 * count; per lane its instruction count; per instruction
 *   op, dst (rank, buffer, chunk, count), nsrcs, nsrcs x (rank, buffer, chunk, count),
 *   ndeps, ndeps x (rank, lane, index), engine
 * with engine -1 for a copy or reduce, else the index of its engine_op in ``engine_ops``,
 * followed by the group's length and ranks. Ops and buffers are indices into the tuples given.
 *
 * unpack_words raises ValueError for words that do not parse (truncated, trailing, a negative
 * or impossible count) and IndexError for an op, buffer or engine index out of range; nothing
 * is returned then. pack_words raises KeyError for an op or buffer name it is not given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "cx_named.h"
#include "cx_unpack.h"

/* -- reading ----------------------------------------------------------------------------------- */
typedef struct {
  const unsigned char* at; /* the next word */
  Py_ssize_t left;         /* words left */
  PyObject* ops;           /* tuples of names */
  PyObject* buffers;
  PyObject* engine_ops;
  PyTypeObject* instr;     /* the named tuples */
  PyTypeObject* ref;
  PyTypeObject* dep;
  PyObject* lane;          /* the Lane class, called with each lane's tuple */
} Reader;

/* The next word, or -1 with ValueError set when none is left (check PyErr_Occurred). */
static int64_t next_word(Reader* r) {
  if (r->left <= 0) {
    PyErr_SetString(PyExc_ValueError, "unpack_words: the words end early (truncated)");
    return -1;
  }
  int64_t v;
  memcpy(&v, r->at, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = (int64_t)__builtin_bswap64((uint64_t)v);
#endif
  r->at += 8;
  r->left -= 1;
  return v;
}

/* A count of items of ``size`` words each that the words left can hold; -1 with ValueError. */
static Py_ssize_t next_count(Reader* r, Py_ssize_t size, const char* what) {
  int64_t n = next_word(r);
  if (n == -1 && PyErr_Occurred()) return -1;
  if (n < 0 || n > r->left / size) {
    PyErr_Format(PyExc_ValueError, "unpack_words: %lld %s, with %zd words left",
                 (long long)n, what, r->left);
    return -1;
  }
  return (Py_ssize_t)n;
}

static PyObject* next_int(Reader* r) {
  int64_t v = next_word(r);
  if (v == -1 && PyErr_Occurred()) return NULL;
  return PyLong_FromLongLong(v);
}

/* A new reference to ``table[k]``, or IndexError. */
static PyObject* name_at(PyObject* table, int64_t k) {
  if (k < 0 || k >= PyTuple_GET_SIZE(table)) {
    PyErr_Format(PyExc_IndexError, "unpack_words: index %lld names none of %R", (long long)k,
                 table);
    return NULL;
  }
  PyObject* name = PyTuple_GET_ITEM(table, k);
  Py_INCREF(name);
  return name;
}

/* A new reference to ``table[next word]``. */
static PyObject* next_name(Reader* r, PyObject* table) {
  int64_t k = next_word(r);
  if (k == -1 && PyErr_Occurred()) return NULL;
  return name_at(table, k);
}

static PyObject* next_ref(Reader* r) {
  PyObject* items[4] = {NULL, NULL, NULL, NULL};
  (void)((items[0] = next_int(r)) && (items[1] = next_name(r, r->buffers)) &&
         (items[2] = next_int(r)) && (items[3] = next_int(r)));
  return cx_named(r->ref, items, 4);
}

static PyObject* next_dep(Reader* r) {
  PyObject* items[3] = {NULL, NULL, NULL};
  (void)((items[0] = next_int(r)) && (items[1] = next_int(r)) && (items[2] = next_int(r)));
  return cx_named(r->dep, items, 3);
}

/* A tuple of a count (items of at least ``size`` words) then that many ``make(r)``. */
static PyObject* next_tuple(Reader* r, Py_ssize_t size, const char* what,
                            PyObject* (*make)(Reader*)) {
  Py_ssize_t n = next_count(r, size, what);
  if (n < 0) return NULL;
  PyObject* out = PyTuple_New(n);
  if (out == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = make(r);
    if (item == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyTuple_SET_ITEM(out, i, item);
  }
  return cx_untrack_atomic(out);
}

static PyObject* next_instr(Reader* r) {
  PyObject* items[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  int ok = (items[0] = next_name(r, r->ops)) && (items[1] = next_ref(r)) &&
           (items[2] = next_tuple(r, 4, "sources", next_ref)) &&
           (items[3] = next_tuple(r, 3, "dependencies", next_dep));
  int64_t engine = ok ? next_word(r) : 0;
  if (ok && engine == -1 && !PyErr_Occurred()) {
    Py_INCREF(Py_None);
    items[4] = Py_None;
    items[5] = PyTuple_New(0);
  } else if (ok && !PyErr_Occurred()) {
    (void)((items[4] = name_at(r->engine_ops, engine)) &&
           (items[5] = next_tuple(r, 1, "group ranks", next_int)));
  }
  return cx_named(r->instr, items, 6);   /* NULL and all released if any is NULL */
}

static PyObject* next_lane(Reader* r) {
  PyObject* instrs = next_tuple(r, 8, "instructions", next_instr);
  if (instrs == NULL) return NULL;
  PyObject* lane = PyObject_CallOneArg(r->lane, instrs);
  Py_DECREF(instrs);
  return lane;
}

static PyObject* next_rank(Reader* r) { return next_tuple(r, 1, "lanes", next_lane); }

PyObject* cx_unpack_words(PyObject* self, PyObject* args) {
  (void)self;
  Py_buffer words;
  PyObject *instr, *ref, *dep;
  Reader r;
  if (!PyArg_ParseTuple(args, "y*O!O!O!OOOO:unpack_words", &words, &PyTuple_Type, &r.ops,
                        &PyTuple_Type, &r.buffers, &PyTuple_Type, &r.engine_ops, &instr, &ref,
                        &dep, &r.lane))
    return NULL;
  PyObject* out = NULL;
  PyObject* types[3] = {instr, ref, dep};
  for (int i = 0; i < 3; ++i) {
    if (!PyType_Check(types[i]) || !PyType_IsSubtype((PyTypeObject*)types[i], &PyTuple_Type)) {
      PyErr_SetString(PyExc_TypeError, "unpack_words: Instr, Ref and Dep must be tuple types");
      goto done;
    }
  }
  if (words.len % 8) {
    PyErr_Format(PyExc_ValueError, "unpack_words: %zd bytes are not whole 8-byte words",
                 words.len);
    goto done;
  }
  r.instr = (PyTypeObject*)instr;
  r.ref = (PyTypeObject*)ref;
  r.dep = (PyTypeObject*)dep;
  r.at = (const unsigned char*)words.buf;
  r.left = words.len / 8;
  out = next_tuple(&r, 1, "ranks", next_rank);
  if (out != NULL && r.left) {
    PyErr_Format(PyExc_ValueError, "unpack_words: %zd words left after the last rank", r.left);
    Py_CLEAR(out);
  }
done:
  PyBuffer_Release(&words);
  return out;
}

/* -- writing ----------------------------------------------------------------------------------- */
/* A growing run of words (native order swapped to little-endian as written), and the name ->
 * index dicts its ops, buffers and engine_ops are written by: pack_words writes a whole
 * schedule with one. */
typedef struct {
  int64_t* words;       /* PyMem_Malloc'ed */
  Py_ssize_t used, size;
  PyObject* ops;        /* dicts: name -> index */
  PyObject* buffers;
  PyObject* engine_ops; /* filled by pack_words: an engine_op first seen gets the next index */
} CxWriter;

/* Append one word; a Ref(rank, buffer, chunk, count) as four; ``table[name]``. 0, or -1 with
 * an exception set (MemoryError, TypeError for a malformed Ref, KeyError for an unknown name). */
static int cx_put(CxWriter* w, int64_t v) {
  if (w->used == w->size) {
    Py_ssize_t size = w->size ? 2 * w->size : 1024;
    int64_t* grown = PyMem_Realloc(w->words, (size_t)size * sizeof(int64_t));
    if (grown == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    w->words = grown;
    w->size = size;
  }
  w->words[w->used++] = cx_le64(v);
  return 0;
}

static int put_int(CxWriter* w, PyObject* v) {
  long long x = PyLong_AsLongLong(v);
  if (x == -1 && PyErr_Occurred()) return -1;
  return cx_put(w, x);
}

static int cx_put_index(CxWriter* w, PyObject* table, PyObject* name) {
  PyObject* k = PyDict_GetItemWithError(table, name);
  if (k == NULL) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, name);
    return -1;
  }
  return put_int(w, k);
}

/* A tuple (a named tuple's field) or TypeError. */
static PyObject* tuple_field(PyObject* t, Py_ssize_t i, Py_ssize_t least) {
  PyObject* v = PyTuple_GET_ITEM(t, i);
  if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) < least) {
    PyErr_Format(PyExc_TypeError, "pack_words: expected a tuple of %zd or more, got %R",
                 least, v);
    return NULL;
  }
  return v;
}

static int cx_put_ref(CxWriter* w, PyObject* ref) {
  if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) < 4) {
    PyErr_Format(PyExc_TypeError, "pack_words: expected a Ref, got %R", ref);
    return -1;
  }
  return put_int(w, PyTuple_GET_ITEM(ref, 0)) ||
                 cx_put_index(w, w->buffers, PyTuple_GET_ITEM(ref, 1)) ||
                 put_int(w, PyTuple_GET_ITEM(ref, 2)) || put_int(w, PyTuple_GET_ITEM(ref, 3))
             ? -1
             : 0;
}

static int put_instr(CxWriter* w, PyObject* ins) {
  if (!PyTuple_Check(ins) || PyTuple_GET_SIZE(ins) < 6) {
    PyErr_Format(PyExc_TypeError, "pack_words: expected an Instr, got %R", ins);
    return -1;
  }
  PyObject *srcs, *deps;
  if (cx_put_index(w, w->ops, PyTuple_GET_ITEM(ins, 0)) ||
      cx_put_ref(w, PyTuple_GET_ITEM(ins, 1)) || !(srcs = tuple_field(ins, 2, 0)) ||
      cx_put(w, PyTuple_GET_SIZE(srcs)))
    return -1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(srcs); ++i)
    if (cx_put_ref(w, PyTuple_GET_ITEM(srcs, i))) return -1;
  if (!(deps = tuple_field(ins, 3, 0)) || cx_put(w, PyTuple_GET_SIZE(deps))) return -1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(deps); ++i) {
    PyObject* d = PyTuple_GET_ITEM(deps, i);
    if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) < 3) {
      PyErr_Format(PyExc_TypeError, "pack_words: expected a Dep, got %R", d);
      return -1;
    }
    for (Py_ssize_t j = 0; j < 3; ++j)
      if (put_int(w, PyTuple_GET_ITEM(d, j))) return -1;
  }
  PyObject* engine = PyTuple_GET_ITEM(ins, 4);
  if (engine == Py_None) return cx_put(w, -1);
  PyObject* k = PyDict_GetItemWithError(w->engine_ops, engine);
  if (k == NULL) {
    if (PyErr_Occurred()) return -1;
    PyObject* next = PyLong_FromSsize_t(PyDict_GET_SIZE(w->engine_ops));
    if (next == NULL || PyDict_SetItem(w->engine_ops, engine, next)) {
      Py_XDECREF(next);
      return -1;
    }
    Py_DECREF(next);
  }
  PyObject* group;
  if (cx_put_index(w, w->engine_ops, engine) || !(group = tuple_field(ins, 5, 0)) ||
      cx_put(w, PyTuple_GET_SIZE(group)))
    return -1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(group); ++i)
    if (put_int(w, PyTuple_GET_ITEM(group, i))) return -1;
  return 0;
}

/* Every lane of ``lanes`` (a tuple per rank of Lanes, each with a tuple ``instrs``). */
static int put_lanes(CxWriter* w, PyObject* lanes) {
  if (!PyTuple_Check(lanes)) {
    PyErr_Format(PyExc_TypeError, "pack_words: expected a tuple of ranks' lanes, got %R", lanes);
    return -1;
  }
  if (cx_put(w, PyTuple_GET_SIZE(lanes))) return -1;
  for (Py_ssize_t r = 0; r < PyTuple_GET_SIZE(lanes); ++r) {
    PyObject* rank = PyTuple_GET_ITEM(lanes, r);
    if (!PyTuple_Check(rank) || cx_put(w, PyTuple_GET_SIZE(rank))) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "pack_words: rank %zd's lanes: %R", r, rank);
      return -1;
    }
    for (Py_ssize_t l = 0; l < PyTuple_GET_SIZE(rank); ++l) {
      PyObject* instrs = PyObject_GetAttrString(PyTuple_GET_ITEM(rank, l), "instrs");
      if (instrs == NULL) return -1;
      int bad = !PyTuple_Check(instrs) || cx_put(w, PyTuple_GET_SIZE(instrs));
      for (Py_ssize_t i = 0; !bad && i < PyTuple_GET_SIZE(instrs); ++i)
        bad = put_instr(w, PyTuple_GET_ITEM(instrs, i));
      if (bad && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "pack_words: a lane's instrs: %R", instrs);
      Py_DECREF(instrs);
      if (bad) return -1;
    }
  }
  return 0;
}

PyObject* cx_pack_words(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* lanes;
  CxWriter w = {NULL, 0, 0, NULL, NULL, NULL};
  if (!PyArg_ParseTuple(args, "OO!O!O!:pack_words", &lanes, &PyDict_Type, &w.ops, &PyDict_Type,
                        &w.buffers, &PyDict_Type, &w.engine_ops))
    return NULL;
  PyObject* out = NULL;
  if (put_lanes(&w, lanes) == 0)
    out = PyBytes_FromStringAndSize((const char*)w.words, w.used * (Py_ssize_t)sizeof(int64_t));
  PyMem_Free(w.words);
  return out;
}
