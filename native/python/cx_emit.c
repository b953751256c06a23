/* collectx._fastpath.emit_lanes: TreeEmitter.flush's loop (collectx/planner/treesched.py), in C.
 *
 * Why it exists: a tree planner emits every transfer of every chunk as an item, then flush()
 * deals them onto lanes in time order and appends them to the schedule. Planning emits a few
 * dozen candidate schedules of 5,000-25,000 instructions each for one DGX-1 allocation; the
 * Python loop took about 1.2 us an item, a fifth of the slowest plans' time.
 *
 * emit_lanes(items, lanes, lane_keys, sublanes, max_lanes, tag_sublanes, Instr, Dep) does what
 * the Python loop does, item for item, and leaves the same state behind:
 *   - items: (t, seq, rank, key, op, dst, srcs, tokens), already sorted by t; seq numbers the
 *     items 0..n-1 and tokens are the seqs of the items each waits for (None: no producer);
 *   - an item's lane: the items of one (rank, key) are dealt round-robin over
 *     tag_sublanes[key[0]] sublanes, ``sublanes`` when key[0] is not in that dict; sublane s of
 *     key is the lane
 *     lane_keys[rank][(key, s)], numbered in order of first use and taken modulo max_lanes
 *     (TreeEmitter.lane, which shares lane_keys);
 *   - lanes[rank][lane] (lists, created on demand) get Instr(op, dst, srcs, deps, None, ()),
 *     deps the producers' Dep(rank, lane, index) in token order, repeats dropped.
 * A token naming an item not yet appended (one not earlier in time) raises ValueError, as do
 * malformed items; lanes may then hold part of the items.
 *
 * emit_words(items, nranks, lane_keys, sublanes, max_lanes, tag_sublanes, ops, buffers) deals
 * the same items onto the same lanes, but returns the instructions as the int64 words of
 * Schedule.to_packed (the grammar is in cx_unpack.c), exactly those of the schedule
 * emit_lanes and ScheduleBuilder.build would make (a rank without instructions gets one empty
 * lane). No Python object is made per instruction: the planner simulates most candidates
 * straight from these words and unpacks only the one it keeps. ops and buffers map names to
 * indices; an unknown name raises KeyError, a malformed Ref TypeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "cx_emit.h"
#include "cx_named.h"
#include "cx_unpack.h"

typedef struct {
  long dealt;   /* items of the key so far */
  int nsub;     /* its sublanes */
  int first;    /* its sublanes' lanes: sub_lane[first .. first + nsub), -1 until first used */
} Slot;

typedef struct {
  PyObject* lanes;       /* list per rank of lists of lists */
  PyObject* lane_keys;   /* list per rank of dicts (key, sublane) -> lane number */
  PyObject* slot_of;     /* list per rank of dicts key -> index into slots */
  PyObject* tag_sublanes;   /* dict key[0] -> sublanes of its keys; others get ``sublanes`` */
  long sublanes, max_lanes;
  Slot* slots;
  int* sub_lane;
  Py_ssize_t nslots, cap_slots, nsub_lane, cap_sub_lane;
} Dealer;

/* TreeEmitter.lane(rank, (key, sub)): the number of (key, sub) in lane_keys[rank], a new one
 * when unseen, modulo max_lanes; -1 on error. */
static long lane_number(Dealer* d, Py_ssize_t rank, PyObject* key, int sub) {
  PyObject* keys = PyList_GET_ITEM(d->lane_keys, rank);
  PyObject* s = PyLong_FromLong(sub);
  PyObject* k = s ? PyTuple_Pack(2, key, s) : NULL;
  Py_XDECREF(s);
  if (k == NULL) return -1;
  long number = -1;
  PyObject* v = PyDict_GetItemWithError(keys, k);
  if (v != NULL) {
    number = PyLong_AsLong(v);
  } else if (!PyErr_Occurred()) {
    number = (long)PyDict_GET_SIZE(keys);
    PyObject* n = PyLong_FromLong(number);
    if (n == NULL || PyDict_SetItem(keys, k, n) < 0) number = -1;
    Py_XDECREF(n);
  }
  Py_DECREF(k);
  return number < 0 ? -1 : number % d->max_lanes;
}

/* The sublanes of ``key``: tag_sublanes[key[0]], else ``sublanes``; -1 on error. */
static long key_sublanes(Dealer* d, PyObject* key) {
  if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 1) return d->sublanes;
  PyObject* v = PyDict_GetItemWithError(d->tag_sublanes, PyTuple_GET_ITEM(key, 0));
  if (v == NULL) return PyErr_Occurred() ? -1 : d->sublanes;
  long n = PyLong_AsLong(v);
  if (n < 1 && !PyErr_Occurred())
    PyErr_Format(PyExc_ValueError, "emit_lanes: tag_sublanes gives %R %ld sublanes; at least "
                 "one expected", PyTuple_GET_ITEM(key, 0), n);
  return n < 1 ? -1 : n;
}

/* A new slot for ``key`` (registered in its rank's slot_of): its index, -1 on error. */
static Py_ssize_t new_slot(Dealer* d, PyObject* slot_of, PyObject* key) {
  long keyed = key_sublanes(d, key);
  if (keyed < 0) return -1;
  int nsub = (int)keyed;
  if (d->nslots == d->cap_slots) {
    Py_ssize_t cap = d->cap_slots ? 2 * d->cap_slots : 64;
    Slot* grown = realloc(d->slots, (size_t)cap * sizeof(Slot));
    if (grown == NULL) return PyErr_NoMemory(), -1;
    d->slots = grown, d->cap_slots = cap;
  }
  if (d->nsub_lane + nsub > d->cap_sub_lane) {
    Py_ssize_t cap = 2 * (d->cap_sub_lane + nsub) + 64;
    int* grown = realloc(d->sub_lane, (size_t)cap * sizeof(int));
    if (grown == NULL) return PyErr_NoMemory(), -1;
    d->sub_lane = grown, d->cap_sub_lane = cap;
  }
  Py_ssize_t i = d->nslots;
  PyObject* index = PyLong_FromSsize_t(i);
  if (index == NULL || PyDict_SetItem(slot_of, key, index) < 0) {
    Py_XDECREF(index);
    return -1;
  }
  Py_DECREF(index);
  d->slots[i] = (Slot){0, nsub, (int)d->nsub_lane};
  for (int s = 0; s < nsub; ++s) d->sub_lane[d->nsub_lane + s] = -1;
  d->nsub_lane += nsub;
  d->nslots += 1;
  return i;
}

/* The rank's dict in ``table`` (a list per rank), created on first use; borrowed. */
static PyObject* rank_dict(PyObject* table, Py_ssize_t rank) {
  PyObject* dict = PyList_GET_ITEM(table, rank);
  if (dict != Py_None) return dict;
  dict = PyDict_New();
  if (dict == NULL) return NULL;
  PyList_SetItem(table, rank, dict);   /* steals */
  return dict;
}

/* The lane of the next item of (rank, key): TreeEmitter._slot_lane (one dict lookup serves the
 * keys of one sublane, which the Python loop keeps in a dict of their own). -1 on error. */
static long next_lane(Dealer* d, Py_ssize_t rank, PyObject* key) {
  PyObject* slot_of = rank_dict(d->slot_of, rank);
  if (slot_of == NULL) return -1;
  Py_ssize_t i;
  PyObject* v = PyDict_GetItemWithError(slot_of, key);
  if (v != NULL) {
    i = PyLong_AsSsize_t(v);
  } else {
    if (PyErr_Occurred()) return -1;
    i = new_slot(d, slot_of, key);
  }
  if (i < 0) return -1;
  Slot* slot = &d->slots[i];
  int sub = slot->nsub == 1 ? 0 : (int)(slot->dealt % slot->nsub);
  slot->dealt += 1;
  int* lane = &d->sub_lane[slot->first + sub];
  if (*lane < 0) {
    long number = lane_number(d, rank, key, sub);
    if (number < 0) return -1;
    *lane = (int)number;
  }
  return *lane;
}

/* The producers' Deps of ``tokens`` in order, repeats dropped; NULL on error. */
static PyObject* wait_for(PyObject* tokens, PyObject** dep_of, Py_ssize_t n) {
  Py_ssize_t nt = PyTuple_GET_SIZE(tokens), m = 0;
  PyObject* found[16];
  PyObject** deps = nt <= 16 ? found : PyMem_Malloc((size_t)nt * sizeof(PyObject*));
  if (deps == NULL) return PyErr_NoMemory();
  for (Py_ssize_t i = 0; i < nt; ++i) {
    PyObject* t = PyTuple_GET_ITEM(tokens, i);
    if (t == Py_None) continue;
    Py_ssize_t k = PyLong_Check(t) ? PyLong_AsSsize_t(t) : -1;
    if (k < 0 || k >= n || dep_of[k] == NULL) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "emit_lanes: token %R names no item appended before "
                     "this one (tokens must name earlier items)", t);
      if (deps != found) PyMem_Free(deps);
      return NULL;
    }
    int seen = 0;
    for (Py_ssize_t j = 0; j < m && !seen; ++j) seen = deps[j] == dep_of[k];
    if (!seen) deps[m++] = dep_of[k];
  }
  PyObject* out = PyTuple_New(m);
  for (Py_ssize_t j = 0; out != NULL && j < m; ++j) PyTuple_SET_ITEM(out, j, Py_NewRef(deps[j]));
  if (deps != found) PyMem_Free(deps);
  return out == NULL ? NULL : cx_untrack_atomic(out);
}

/* Append Instr(op, dst, srcs, deps, None, ()) to lanes[rank][lane]: its Dep, NULL on error. */
static PyObject* append(PyObject* lanes, PyObject* rank_obj, Py_ssize_t rank, long lane,
                        PyObject* item, PyObject* deps, PyTypeObject* Instr, PyTypeObject* Dep) {
  PyObject* rank_lanes = PyList_GET_ITEM(lanes, rank);
  if (!PyList_Check(rank_lanes)) {
    PyErr_SetString(PyExc_TypeError, "emit_lanes: lanes[rank] must be a list");
    return NULL;
  }
  while (PyList_GET_SIZE(rank_lanes) <= lane) {
    PyObject* fresh = PyList_New(0);
    if (fresh == NULL || PyList_Append(rank_lanes, fresh) < 0) {
      Py_XDECREF(fresh);
      return NULL;
    }
    Py_DECREF(fresh);
  }
  PyObject* seq = PyList_GET_ITEM(rank_lanes, lane);
  PyObject* srcs = PyTuple_GET_ITEM(item, 6);   /* the emitter's refs: untracked where atomic */
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(srcs); ++i)
    if (PyTuple_Check(PyTuple_GET_ITEM(srcs, i))) cx_untrack_atomic(PyTuple_GET_ITEM(srcs, i));
  cx_untrack_atomic(srcs);
  if (PyTuple_Check(PyTuple_GET_ITEM(item, 5))) cx_untrack_atomic(PyTuple_GET_ITEM(item, 5));
  PyObject* fields[6] = {Py_NewRef(PyTuple_GET_ITEM(item, 4)), Py_NewRef(PyTuple_GET_ITEM(item, 5)),
                         Py_NewRef(PyTuple_GET_ITEM(item, 6)), Py_NewRef(deps), Py_NewRef(Py_None),
                         PyTuple_New(0)};
  PyObject* ins = cx_named(Instr, fields, 6);
  if (ins == NULL || !PyList_Check(seq) || PyList_Append(seq, ins) < 0) {
    if (ins != NULL && !PyList_Check(seq))
      PyErr_SetString(PyExc_TypeError, "emit_lanes: a lane must be a list");
    Py_XDECREF(ins);
    return NULL;
  }
  Py_DECREF(ins);
  PyObject* at[3] = {Py_NewRef(rank_obj), PyLong_FromLong(lane),
                     PyLong_FromSsize_t(PyList_GET_SIZE(seq) - 1)};
  return cx_named(Dep, at, 3);
}

/* Whether ``item`` is an 8-tuple with a seq in [0, n), a rank in [0, nranks) and tuples of
 * srcs and tokens; sets *seq and *rank. */
static int well_formed(PyObject* item, Py_ssize_t n, Py_ssize_t nranks, Py_ssize_t* seq,
                       Py_ssize_t* rank) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 8) return 0;
  PyObject* s = PyTuple_GET_ITEM(item, 1);
  PyObject* r = PyTuple_GET_ITEM(item, 2);
  if (!PyLong_Check(s) || !PyLong_Check(r) || !PyTuple_Check(PyTuple_GET_ITEM(item, 6)) ||
      !PyTuple_Check(PyTuple_GET_ITEM(item, 7)))
    return 0;
  *seq = PyLong_AsSsize_t(s);
  *rank = PyLong_AsSsize_t(r);
  PyErr_Clear();
  return *seq >= 0 && *seq < n && *rank >= 0 && *rank < nranks;
}

static int deal(Dealer* d, PyObject* items, PyTypeObject* Instr, PyTypeObject* Dep) {
  Py_ssize_t n = PyList_GET_SIZE(items), nranks = PyList_GET_SIZE(d->lanes);
  PyObject** dep_of = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject*));
  if (dep_of == NULL) return PyErr_NoMemory(), -1;
  int rc = 0;
  for (Py_ssize_t i = 0; i < n && rc == 0; ++i) {
    PyObject* item = PyList_GET_ITEM(items, i);
    Py_ssize_t seq, rank;
    if (!well_formed(item, n, nranks, &seq, &rank) || dep_of[seq] != NULL) {
      PyErr_Format(PyExc_ValueError, "emit_lanes: item %zd is not (t, seq, rank, key, op, dst, "
                   "srcs, tokens) with a new seq in [0, %zd) and a rank in [0, %zd)", i, n,
                   nranks);
      rc = -1;
      break;
    }
    long lane = next_lane(d, rank, PyTuple_GET_ITEM(item, 3));
    PyObject* deps = lane < 0 ? NULL : wait_for(PyTuple_GET_ITEM(item, 7), dep_of, n);
    if (deps == NULL) {
      rc = -1;
      break;
    }
    dep_of[seq] = append(d->lanes, PyTuple_GET_ITEM(item, 2), rank, lane, item, deps, Instr,
                         Dep);
    Py_DECREF(deps);
    if (dep_of[seq] == NULL) rc = -1;
  }
  for (Py_ssize_t i = 0; i < n; ++i) Py_XDECREF(dep_of[i]);
  PyMem_Free(dep_of);
  return rc;
}

/* Whether ``lane_keys`` holds a dict per rank; TypeError (naming ``who``) if not. */
static int dicts_per_rank(PyObject* lane_keys, const char* who) {
  for (Py_ssize_t r = 0; r < PyList_GET_SIZE(lane_keys); ++r) {
    if (!PyDict_Check(PyList_GET_ITEM(lane_keys, r))) {
      PyErr_Format(PyExc_TypeError, "%s: lane_keys must hold a dict per rank", who);
      return 0;
    }
  }
  return 1;
}

static PyObject* per_rank_table(Py_ssize_t nranks) {
  PyObject* t = PyList_New(nranks);
  for (Py_ssize_t r = 0; t != NULL && r < nranks; ++r) PyList_SET_ITEM(t, r, Py_NewRef(Py_None));
  return t;
}

PyObject* cx_emit_lanes(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *items, *lanes, *lane_keys, *tags;
  long sublanes, max_lanes;
  PyTypeObject *Instr, *Dep;
  if (!PyArg_ParseTuple(args, "O!O!O!llO!O!O!", &PyList_Type, &items, &PyList_Type, &lanes,
                        &PyList_Type, &lane_keys, &sublanes, &max_lanes, &PyDict_Type, &tags,
                        &PyType_Type, &Instr, &PyType_Type, &Dep))
    return NULL;
  Py_ssize_t nranks = PyList_GET_SIZE(lanes);
  if (sublanes < 1 || max_lanes < 1 || PyList_GET_SIZE(lane_keys) != nranks ||
      !PyType_IsSubtype(Instr, &PyTuple_Type) || !PyType_IsSubtype(Dep, &PyTuple_Type)) {
    PyErr_SetString(PyExc_ValueError, "emit_lanes: sublanes and max_lanes >= 1, a lane_keys "
                    "dict per rank of lanes and named tuple types expected");
    return NULL;
  }
  if (!dicts_per_rank(lane_keys, "emit_lanes")) return NULL;
  Dealer d = {lanes, lane_keys, per_rank_table(nranks), tags, sublanes, max_lanes, NULL, NULL,
              0, 0, 0, 0};
  int rc = d.slot_of != NULL ? deal(&d, items, Instr, Dep) : -1;
  Py_XDECREF(d.slot_of);
  free(d.slots);
  free(d.sub_lane);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}


/* -- emit_words -------------------------------------------------------------------------------- */
typedef struct {
  int32_t rank, lane, index;   /* the Dep of an item's instruction; rank -1 until dealt */
} Placed;

typedef struct {
  CxWriter* lane_words;   /* nranks x max_lanes writers, one per lane */
  Py_ssize_t* lane_count; /* instructions per lane */
  int* nlanes;            /* per rank: lanes created (the highest used + 1) */
  Placed* placed;         /* per item seq */
} Words;

/* The instruction of ``item`` (dealt to ``rank``'s ``lane``) as words: op, dst, sources, the
 * producers of its tokens in order (repeats dropped), no engine. 0, or -1 with an exception. */
static int put_item(Words* out, CxWriter* w, PyObject* item, Py_ssize_t n) {
  PyObject* srcs = PyTuple_GET_ITEM(item, 6);
  PyObject* tokens = PyTuple_GET_ITEM(item, 7);
  if (cx_put_index(w, w->ops, PyTuple_GET_ITEM(item, 4)) ||
      cx_put_ref(w, PyTuple_GET_ITEM(item, 5)) || cx_put(w, PyTuple_GET_SIZE(srcs)))
    return -1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(srcs); ++i)
    if (cx_put_ref(w, PyTuple_GET_ITEM(srcs, i))) return -1;
  Py_ssize_t nt = PyTuple_GET_SIZE(tokens), m = 0, found[16];
  Py_ssize_t* deps = nt <= 16 ? found : PyMem_Malloc((size_t)nt * sizeof(Py_ssize_t));
  if (deps == NULL) return PyErr_NoMemory(), -1;
  int rc = 0;
  for (Py_ssize_t i = 0; i < nt && rc == 0; ++i) {
    PyObject* t = PyTuple_GET_ITEM(tokens, i);
    if (t == Py_None) continue;
    Py_ssize_t k = PyLong_Check(t) ? PyLong_AsSsize_t(t) : -1;
    if (k < 0 || k >= n || out->placed[k].rank < 0) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "emit_words: token %R names no item appended before "
                     "this one (tokens must name earlier items)", t);
      rc = -1;
      break;
    }
    int seen = 0;
    for (Py_ssize_t j = 0; j < m && !seen; ++j) seen = deps[j] == k;
    if (!seen) deps[m++] = k;
  }
  if (rc == 0) rc = cx_put(w, m);
  for (Py_ssize_t j = 0; j < m && rc == 0; ++j) {
    Placed d = out->placed[deps[j]];
    rc = cx_put(w, d.rank) || cx_put(w, d.lane) || cx_put(w, d.index) ? -1 : 0;
  }
  if (deps != found) PyMem_Free(deps);
  return rc == 0 ? cx_put(w, -1) : -1;
}

static int deal_words(Dealer* d, Words* out, PyObject* items) {
  Py_ssize_t n = PyList_GET_SIZE(items), nranks = PyList_GET_SIZE(d->lane_keys);
  for (Py_ssize_t i = 0; i < n; ++i) out->placed[i].rank = -1;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyList_GET_ITEM(items, i);
    Py_ssize_t seq, rank;
    if (!well_formed(item, n, nranks, &seq, &rank) || out->placed[seq].rank >= 0) {
      PyErr_Format(PyExc_ValueError, "emit_words: item %zd is not (t, seq, rank, key, op, dst, "
                   "srcs, tokens) with a new seq in [0, %zd) and a rank in [0, %zd)", i, n,
                   nranks);
      return -1;
    }
    long lane = next_lane(d, rank, PyTuple_GET_ITEM(item, 3));
    if (lane < 0) return -1;
    Py_ssize_t at = rank * d->max_lanes + lane;
    if (put_item(out, &out->lane_words[at], item, n) < 0) return -1;
    out->placed[seq] = (Placed){(int32_t)rank, (int32_t)lane, (int32_t)out->lane_count[at]++};
    if (out->nlanes[rank] <= lane) out->nlanes[rank] = (int)lane + 1;
  }
  return 0;
}

/* Every rank's lanes in order, as pack_words lays them out: a bytes object. */
static PyObject* joined(const Words* out, Py_ssize_t nranks, long max_lanes) {
  Py_ssize_t total = 1;
  for (Py_ssize_t r = 0; r < nranks; ++r) {
    total += 1 + (out->nlanes[r] ? 0 : 1);   /* a rank without lanes gets one, empty */
    for (int l = 0; l < out->nlanes[r]; ++l) total += 1 + out->lane_words[r * max_lanes + l].used;
  }
  PyObject* bytes = PyBytes_FromStringAndSize(NULL, total * (Py_ssize_t)sizeof(int64_t));
  if (bytes == NULL) return NULL;
  int64_t* at = (int64_t*)PyBytes_AS_STRING(bytes);
  *at++ = cx_le64(nranks);
  for (Py_ssize_t r = 0; r < nranks; ++r) {
    *at++ = cx_le64(out->nlanes[r] ? out->nlanes[r] : 1);
    if (!out->nlanes[r]) *at++ = 0;
    for (int l = 0; l < out->nlanes[r]; ++l) {
      const CxWriter* w = &out->lane_words[r * max_lanes + l];
      *at++ = cx_le64(out->lane_count[r * max_lanes + l]);
      if (w->used) memcpy(at, w->words, (size_t)w->used * sizeof(int64_t));   /* already LE */
      at += w->used;
    }
  }
  return bytes;
}

PyObject* cx_emit_words(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *items, *lane_keys, *tags, *ops, *buffers;
  Py_ssize_t nranks;
  long sublanes, max_lanes;
  if (!PyArg_ParseTuple(args, "O!nO!llO!O!O!:emit_words", &PyList_Type, &items, &nranks,
                        &PyList_Type, &lane_keys, &sublanes, &max_lanes, &PyDict_Type, &tags,
                        &PyDict_Type, &ops, &PyDict_Type, &buffers))
    return NULL;
  if (sublanes < 1 || max_lanes < 1 || max_lanes > (1 << 20) || nranks < 1 ||
      PyList_GET_SIZE(lane_keys) != nranks) {
    PyErr_SetString(PyExc_ValueError, "emit_words: sublanes, max_lanes and nranks >= 1 and a "
                    "lane_keys dict per rank expected");
    return NULL;
  }
  if (!dicts_per_rank(lane_keys, "emit_words")) return NULL;
  Py_ssize_t n = PyList_GET_SIZE(items), nlw = nranks * max_lanes;
  Words out = {PyMem_Calloc((size_t)nlw, sizeof(CxWriter)),
               PyMem_Calloc((size_t)nlw, sizeof(Py_ssize_t)),
               PyMem_Calloc((size_t)nranks, sizeof(int)),
               PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Placed))};
  Dealer d = {NULL, lane_keys, per_rank_table(nranks), tags, sublanes, max_lanes, NULL, NULL,
              0, 0, 0, 0};
  PyObject* result = NULL;
  if (out.lane_words == NULL || out.lane_count == NULL || out.nlanes == NULL ||
      out.placed == NULL) {
    PyErr_NoMemory();
  } else if (d.slot_of != NULL) {
    for (Py_ssize_t i = 0; i < nlw; ++i)
      out.lane_words[i].ops = ops, out.lane_words[i].buffers = buffers;
    if (deal_words(&d, &out, items) == 0) result = joined(&out, nranks, max_lanes);
  }
  for (Py_ssize_t i = 0; out.lane_words != NULL && i < nlw; ++i)
    PyMem_Free(out.lane_words[i].words);
  PyMem_Free(out.lane_words);
  PyMem_Free(out.lane_count);
  PyMem_Free(out.nlanes);
  PyMem_Free(out.placed);
  Py_XDECREF(d.slot_of);
  free(d.slots);
  free(d.sub_lane);
  return result;
}
