/* collectx._fastpath.shape_groups: a schedule's instructions grouped by shape, in C.
 *
 * Why it exists: collectx/schedule/_flat.py works out an instruction's flows once per shape
 * (executing node, destination node, bytes, source nodes), and numbered the shapes by sorting
 * one mixed-radix key per instruction: for a 113,000-instruction candidate about 11 ms, a
 * fifth of the candidate's front end. Here one pass hashes each instruction's shape into an
 * open-addressing table (equal hashes are compared field by field, so groups are exact), with
 * the GIL released. The caller sorts the few groups to number them as numpy's unique did.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cx_shapes.h"

typedef struct {
  const int32_t *me, *dst, *src_off, *src;
  const int64_t* nbytes;
} Shapes;

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ULL;
}

static uint64_t shape_hash(const Shapes* s, Py_ssize_t i) {
  uint64_t h = mix(mix(mix(0, (uint32_t)s->me[i]), (uint32_t)s->dst[i]), (uint64_t)s->nbytes[i]);
  for (int32_t k = s->src_off[i]; k < s->src_off[i + 1]; ++k) h = mix(h, (uint32_t)s->src[k]);
  return h ^ (h >> 31);
}

static int same_shape(const Shapes* s, Py_ssize_t i, Py_ssize_t j) {
  int32_t ni = s->src_off[i + 1] - s->src_off[i], nj = s->src_off[j + 1] - s->src_off[j];
  return s->me[i] == s->me[j] && s->dst[i] == s->dst[j] && s->nbytes[i] == s->nbytes[j] &&
         ni == nj &&
         memcmp(s->src + s->src_off[i], s->src + s->src_off[j], (size_t)ni * sizeof(int32_t)) == 0;
}

/* Fills ids[n] and first[] (returns the group count), or -1 out of memory. */
static Py_ssize_t group(const Shapes* s, Py_ssize_t n, int32_t* ids, int64_t** first_out) {
  size_t cap = 1024, groups = 0, first_cap = 64;
  int32_t* slot = malloc(cap * sizeof(int32_t));   /* group id, or -1 */
  uint64_t* key = malloc(cap * sizeof(uint64_t));
  int64_t* first = malloc(first_cap * sizeof(int64_t));
  if (slot == NULL || key == NULL || first == NULL) goto oom;
  memset(slot, 0xff, cap * sizeof(int32_t));
  for (Py_ssize_t i = 0; i < n; ++i) {
    uint64_t h = shape_hash(s, i);
    size_t at = (size_t)h & (cap - 1);
    while (slot[at] >= 0 && !(key[at] == h && same_shape(s, first[slot[at]], i)))
      at = (at + 1) & (cap - 1);
    if (slot[at] >= 0) {
      ids[i] = slot[at];
      continue;
    }
    if (groups == first_cap) {
      first_cap *= 2;
      int64_t* grown = realloc(first, first_cap * sizeof(int64_t));
      if (grown == NULL) goto oom;
      first = grown;
    }
    first[groups] = i;
    ids[i] = (int32_t)groups;
    slot[at] = (int32_t)groups++;
    key[at] = h;
    if (2 * groups > cap) {   /* keep the table at most half full: rehash into twice the size */
      size_t bigger = 2 * cap;
      int32_t* nslot = malloc(bigger * sizeof(int32_t));
      uint64_t* nkey = malloc(bigger * sizeof(uint64_t));
      if (nslot == NULL || nkey == NULL) {
        free(nslot);
        free(nkey);
        goto oom;
      }
      memset(nslot, 0xff, bigger * sizeof(int32_t));
      for (size_t k = 0; k < cap; ++k) {
        if (slot[k] < 0) continue;
        size_t to = (size_t)key[k] & (bigger - 1);
        while (nslot[to] >= 0) to = (to + 1) & (bigger - 1);
        nslot[to] = slot[k];
        nkey[to] = key[k];
      }
      free(slot);
      free(key);
      slot = nslot;
      key = nkey;
      cap = bigger;
    }
  }
  free(slot);
  free(key);
  *first_out = first;
  return (Py_ssize_t)groups;
oom:
  free(slot);
  free(key);
  free(first);
  return -1;
}

static int int_buffer(PyObject* obj, Py_buffer* view, Py_ssize_t itemsize, const char* name) {
  if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
  if (view->len % itemsize != 0) {
    PyErr_Format(PyExc_ValueError, "shape_groups: %s holds %zd bytes, not a whole number of "
                 "%zd-byte integers", name, view->len, itemsize);
    PyBuffer_Release(view);
    return -1;
  }
  return 0;
}

PyObject* cx_shape_groups(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 5) {
    PyErr_Format(PyExc_TypeError, "shape_groups() takes 5 arguments (%zd given)", nargs);
    return NULL;
  }
  static const char* names[5] = {"me", "dst", "nbytes", "src_off", "src"};
  Py_buffer v[5];
  int got = 0;
  PyObject* result = NULL;
  for (; got < 5; ++got)
    if (int_buffer(args[got], &v[got], got == 2 ? 8 : 4, names[got]) < 0) goto done;
  Py_ssize_t n = v[0].len / 4, m = v[4].len / 4;
  Shapes s = {v[0].buf, v[1].buf, v[3].buf, v[4].buf, v[2].buf};
  int ok = v[1].len / 4 == n && v[2].len / 8 == n && v[3].len / 4 == n + 1 && s.src_off[0] == 0;
  for (Py_ssize_t i = 0; ok && i < n; ++i)
    ok = s.src_off[i] <= s.src_off[i + 1] && s.src_off[i + 1] <= m;
  if (!ok) {
    PyErr_SetString(PyExc_ValueError, "shape_groups: me, dst and nbytes need one entry per "
                    "instruction and src_off n + 1 nondecreasing offsets into src");
    goto done;
  }
  PyObject* ids = PyBytes_FromStringAndSize(NULL, n * 4);
  if (ids == NULL) goto done;
  int64_t* first = NULL;
  Py_ssize_t groups;
  Py_BEGIN_ALLOW_THREADS
  groups = group(&s, n, (int32_t*)PyBytes_AS_STRING(ids), &first);
  Py_END_ALLOW_THREADS
  if (groups < 0) {
    Py_DECREF(ids);
    PyErr_NoMemory();
    goto done;
  }
  PyObject* firsts = PyBytes_FromStringAndSize((const char*)first, groups * 8);
  free(first);
  if (firsts == NULL) {
    Py_DECREF(ids);
    goto done;
  }
  result = Py_BuildValue("(NN)", ids, firsts);
done:
  for (int k = 0; k < got; ++k) PyBuffer_Release(&v[k]);
  return result;
}
