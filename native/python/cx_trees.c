/* collectx._fastpath.tree_broadcast and tree_reduce: TreeEmitter._broadcast_share and
 * TreeEmitter._reduce_share (collectx/planner/treesched.py), in C.
 *
 * Why they exist: a tree plan lowers about a dozen candidate packings to 10^4-10^5 transfers
 * each, and the emitter builds an item tuple (and a Ref or two) per transfer before flush()
 * deals them onto lanes (cx_emit.c); the Python loops took about a fifth of an 8-GPU plan.
 *
 * The Python methods are the reference and these functions mirror them: the same arguments,
 * the same items appended in the same order, their times computed with the same double
 * arithmetic, so the schedules are byte-identical. Differences are in form only:
 *   - the RefFns must be treesched.ChunkRefs, read as data: the Ref of node v for piece (j, k)
 *     of a share is Ref(v, buf, share.root * per_root + j, k), built as tuple.__new__ builds it
 *     (the emitter uses the Python loops for any other RefFn);
 *   - the per-piece dicts of the Python loops (ready, partial) are arrays indexed by node, each
 *     entry stamped with the piece that set it, so reading a node the piece has not reached
 *     raises KeyError(node) as the dict does; nodes are ranks, ints in [0, CX_TREE_NODES);
 *   - edges staged through host memory and fresh scratch chunks stay in Python: hop,
 *     through_host and fresh (the emitter's and the builder's methods) are called where the
 *     Python loops call them, so the items they append fall in the same places.
 * Malformed arguments raise TypeError or ValueError (KeyError where the Python loop's lookup
 * would fail); items may then hold part of the share's items, as after the Python loop raised.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cx_named.h"
#include "cx_trees.h"

#define CX_TREE_NODES (1L << 20) /* node ids the per-piece arrays are sized for, at most */
/* |per_root| and |j| at most: root * per_root + j then fits a long long with room to spare. */
#define CX_TREE_CHUNKS (1LL << 40)

/* collectx.schedule.ir.Ref, imported on first use and kept for the process. */
static PyTypeObject* ref_type(void) {
  static PyObject* cached = NULL;
  if (cached != NULL) return (PyTypeObject*)cached;
  PyObject* ir = PyImport_ImportModule("collectx.schedule.ir");
  PyObject* ref = ir != NULL ? PyObject_GetAttrString(ir, "Ref") : NULL;
  Py_XDECREF(ir);
  if (ref == NULL) return NULL;
  if (!PyType_Check(ref) || !PyType_IsSubtype((PyTypeObject*)ref, &PyTuple_Type)) {
    Py_DECREF(ref);
    PyErr_SetString(PyExc_TypeError, "collectx.schedule.ir.Ref must be a named tuple type");
    return NULL;
  }
  cached = ref;
  return (PyTypeObject*)cached;
}

/* ``obj`` as a node id in [0, CX_TREE_NODES); -1 with ValueError otherwise. */
static long node_id(PyObject* obj, const char* fname) {
  long v = PyLong_Check(obj) ? PyLong_AsLong(obj) : -1;
  if (v >= 0 && v < CX_TREE_NODES) return v;
  PyErr_Clear();
  PyErr_Format(PyExc_ValueError, "%s: tree node %R is not a rank in [0, %ld)", fname, obj,
               CX_TREE_NODES);
  return -1;
}

/* A ChunkRefs read for one share: the Ref of node v for piece (j, k) is Ref(v, buf, first + j,
 * k). ``buf`` is owned. */
typedef struct {
  PyObject* buf;
  long long first;
} Chunks;

/* ``value`` within [-CX_TREE_CHUNKS, CX_TREE_CHUNKS]; OverflowError otherwise. */
static int chunk_range(long long value, const char* fname, const char* what) {
  if (value >= -CX_TREE_CHUNKS && value <= CX_TREE_CHUNKS) return 0;
  PyErr_Format(PyExc_OverflowError, "%s: %s %lld is out of range", fname, what, value);
  return -1;
}

static int read_chunks(Chunks* out, PyObject* fn, long long root, const char* fname,
                       const char* what) {
  PyObject* buf = PyObject_GetAttrString(fn, "buf");
  PyObject* per = buf != NULL ? PyObject_GetAttrString(fn, "per_root") : NULL;
  PyErr_Clear();   /* a missing attribute is the TypeError below */
  int ok = buf != NULL && per != NULL && PyUnicode_Check(buf) && PyLong_Check(per);
  long long per_root = ok ? PyLong_AsLongLong(per) : 0;
  Py_XDECREF(per);
  if (!ok) {
    Py_XDECREF(buf);
    PyErr_Format(PyExc_TypeError, "%s: %s must be a ChunkRefs (a str buf and an int per_root)",
                 fname, what);
    return -1;
  }
  if ((per_root == -1 && PyErr_Occurred()) || chunk_range(per_root, fname, "per_root") < 0) {
    Py_DECREF(buf);
    return -1;
  }
  out->buf = buf;
  out->first = root * per_root;
  return 0;
}

/* Ref(v, buf, first + j, k), untracked like every atomic tuple (cx_named); NULL on error. */
static PyObject* chunk_ref(PyTypeObject* Ref, PyObject* v, const Chunks* c, long long j,
                           PyObject* k) {
  PyObject* fields[4] = {Py_NewRef(v), Py_NewRef(c->buf), PyLong_FromLongLong(c->first + j),
                         Py_NewRef(k)};
  return cx_named(Ref, fields, 4);
}

/* pieces[i] (a tuple) as j (borrowed, and its value) and k (borrowed); -1 on error. */
static int piece_at(PyObject* pieces, Py_ssize_t i, PyObject** j, long long* jv, PyObject** k,
                    const char* fname) {
  PyObject* p = PyTuple_GET_ITEM(pieces, i);
  if (PyTuple_Check(p) && PyTuple_GET_SIZE(p) == 2 && PyLong_Check(PyTuple_GET_ITEM(p, 0)) &&
      PyLong_Check(PyTuple_GET_ITEM(p, 1))) {
    *j = PyTuple_GET_ITEM(p, 0);
    *k = PyTuple_GET_ITEM(p, 1);
    *jv = PyLong_AsLongLong(*j);
    return (*jv == -1 && PyErr_Occurred()) || chunk_range(*jv, fname, "chunk") < 0 ? -1 : 0;
  }
  PyErr_Format(PyExc_TypeError, "%s: pieces[%zd] = %R is not a (first chunk, chunks) pair of "
               "ints", fname, i, p);
  return -1;
}

/* The tuple of ``n`` new references (stolen; a NULL entry, a failed allocation, fails it);
 * NULL on error. */
static PyObject* steal_tuple(PyObject** fields, Py_ssize_t n) {
  int complete = 1;
  for (Py_ssize_t i = 0; i < n; ++i) complete &= fields[i] != NULL;
  PyObject* t = complete ? PyTuple_New(n) : NULL;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (t != NULL)
      PyTuple_SET_ITEM(t, i, fields[i]);
    else
      Py_XDECREF(fields[i]);
  }
  return t;
}

/* Append (t, len(items), rank, key, op, dst, srcs, tokens) to ``items``, stealing srcs and
 * tokens: the item's seq (a new reference), NULL on error. */
static PyObject* append_item(PyObject* items, double t, PyObject* rank, PyObject* key,
                             PyObject* op, PyObject* dst, PyObject* srcs, PyObject* tokens) {
  PyObject* seq = PyLong_FromSsize_t(PyList_GET_SIZE(items));
  PyObject* fields[8] = {PyFloat_FromDouble(t), Py_XNewRef(seq), Py_NewRef(rank),
                         Py_NewRef(key), Py_NewRef(op), Py_NewRef(dst),
                         srcs ? cx_untrack_atomic(srcs) : NULL,
                         tokens ? cx_untrack_atomic(tokens) : NULL};
  PyObject* item = steal_tuple(fields, 8);
  if (item == NULL || PyList_Append(items, item) < 0) Py_CLEAR(seq);
  Py_XDECREF(item);
  return seq;
}

/* The Python loops' per-piece dicts node -> (token, time, Ref), as arrays: entry v belongs to
 * piece stamp[v]; tokens and refs are owned. */
typedef struct {
  Py_ssize_t n;
  Py_ssize_t* stamp;
  double* time;
  PyObject** token;
  PyObject** ref;
} Nodes;

static int nodes_init(Nodes* t, long n) {
  t->n = n;
  t->stamp = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
  t->time = PyMem_Calloc((size_t)n, sizeof(double));
  t->token = PyMem_Calloc((size_t)n, sizeof(PyObject*));
  t->ref = PyMem_Calloc((size_t)n, sizeof(PyObject*));
  if (t->stamp == NULL || t->time == NULL || t->token == NULL || t->ref == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (long v = 0; v < n; ++v) t->stamp[v] = -1;
  return 0;
}

static void nodes_free(Nodes* t) {
  for (Py_ssize_t v = 0; t->token != NULL && v < t->n; ++v) Py_XDECREF(t->token[v]);
  for (Py_ssize_t v = 0; t->ref != NULL && v < t->n; ++v) Py_XDECREF(t->ref[v]);
  PyMem_Free(t->stamp);
  PyMem_Free(t->time);
  PyMem_Free(t->token);
  PyMem_Free(t->ref);
}

/* Node v's entry for piece i, stealing token and ref. */
static void nodes_set(Nodes* t, long v, Py_ssize_t i, PyObject* token, double time,
                      PyObject* ref) {
  Py_XSETREF(t->token[v], token);
  Py_XSETREF(t->ref[v], ref);
  t->time[v] = time;
  t->stamp[v] = i;
}

/* Whether node v has an entry for piece i; KeyError(v), as the dict lookup raises, if not. */
static int nodes_has(const Nodes* t, long v, Py_ssize_t i, PyObject* v_obj) {
  if (t->stamp[v] == i) return 1;
  PyErr_SetObject(PyExc_KeyError, v_obj);
  return 0;
}

/* What both loops share: the items, the share's root and pieces, the lane tuples (number,
 * turn) handed to the staging methods. Every reference is owned. */
typedef struct {
  const char* fname;
  PyTypeObject* Ref;
  PyObject *items, *root_obj, *pieces, *m_obj, *op;
  long root;
  Py_ssize_t m, nturns;
  PyObject** turn_key;
  Nodes nodes;
} Share;

static int read_share(Share* s, const char* fname, PyObject* items, PyObject* share,
                      PyObject* pieces, const char* op) {
  s->fname = fname;
  s->Ref = ref_type();
  if (s->Ref == NULL) return -1;
  if (!PyList_Check(items)) {
    PyErr_Format(PyExc_TypeError, "%s: items must be a list", fname);
    return -1;
  }
  s->items = Py_NewRef(items);
  s->root_obj = PyObject_GetAttrString(share, "root");
  if (s->root_obj == NULL || (s->root = node_id(s->root_obj, fname)) < 0) return -1;
  s->pieces = PySequence_Tuple(pieces);   /* its pairs stay ours whatever callbacks do */
  if (s->pieces == NULL) return -1;
  s->m = PyTuple_GET_SIZE(s->pieces);
  s->m_obj = PyLong_FromSsize_t(s->m);
  s->op = PyUnicode_InternFromString(op);
  return s->m_obj == NULL || s->op == NULL ? -1 : 0;
}

/* The lane tuples (number, turn) of ``nturns`` turns (buffers); -1 on error. */
static int turn_keys(Share* s, PyObject* number, Py_ssize_t nturns) {
  if (nturns < 1) {
    PyErr_Format(PyExc_ValueError, "%s: at least one turn (buffer) expected", s->fname);
    return -1;
  }
  s->turn_key = PyMem_Calloc((size_t)nturns, sizeof(PyObject*));
  if (s->turn_key == NULL) return PyErr_NoMemory(), -1;
  s->nturns = nturns;
  for (Py_ssize_t turn = 0; turn < nturns; ++turn) {
    PyObject* n = PyLong_FromSsize_t(turn);
    s->turn_key[turn] = n != NULL ? PyTuple_Pack(2, number, n) : NULL;
    Py_XDECREF(n);
    if (s->turn_key[turn] == NULL) return -1;
  }
  return 0;
}

static void share_free(Share* s) {
  Py_XDECREF(s->items);
  Py_XDECREF(s->root_obj);
  Py_XDECREF(s->pieces);
  Py_XDECREF(s->m_obj);
  Py_XDECREF(s->op);
  for (Py_ssize_t turn = 0; s->turn_key != NULL && turn < s->nturns; ++turn)
    Py_XDECREF(s->turn_key[turn]);
  PyMem_Free(s->turn_key);
  nodes_free(&s->nodes);
}

/* ---- broadcast ------------------------------------------------------------------------------ */

/* One entry of keyed[turn]: (parent, child, lane key, staged); references owned. */
typedef struct {
  long p, c;
  PyObject *p_obj, *c_obj, *key;
  int via_host;
} Edge;

typedef struct {
  Share s;
  PyObject *hop, *after;
  Chunks src, dst;
  double step;
  Py_ssize_t* first_edge; /* keyed[turn] is edges[first_edge[turn] .. first_edge[turn + 1]) */
  Edge* edges;
  Py_ssize_t nedges;
} Broadcast;

static int read_edge(Edge* e, PyObject* entry, const char* fname, long* most) {
  if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4) {
    PyErr_Format(PyExc_TypeError, "%s: keyed holds %R, not (parent, child, lane key, staged)",
                 fname, entry);
    return -1;
  }
  e->p_obj = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
  e->c_obj = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
  e->key = Py_NewRef(PyTuple_GET_ITEM(entry, 2));
  e->via_host = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 3));
  if (e->via_host < 0 || (e->p = node_id(e->p_obj, fname)) < 0 ||
      (e->c = node_id(e->c_obj, fname)) < 0)
    return -1;
  if (e->p > *most) *most = e->p;
  if (e->c > *most) *most = e->c;
  return 0;
}

/* keyed: per turn, a sequence of edges. */
static Py_ssize_t read_keyed(Broadcast* b, PyObject* keyed, long* most) {
  PyObject* turns = PySequence_Tuple(keyed);
  if (turns == NULL) return -1;
  Py_ssize_t nturns = PyTuple_GET_SIZE(turns), total = 0;
  PyObject** fast = PyMem_Calloc((size_t)(nturns ? nturns : 1), sizeof(PyObject*));
  int rc = fast == NULL ? (PyErr_NoMemory(), -1) : 0;
  for (Py_ssize_t turn = 0; rc == 0 && turn < nturns; ++turn) {
    fast[turn] = PySequence_Fast(PyTuple_GET_ITEM(turns, turn), "keyed: a sequence per turn");
    rc = fast[turn] == NULL ? -1 : 0;
    if (rc == 0) total += PySequence_Fast_GET_SIZE(fast[turn]);
  }
  if (rc == 0) {
    b->first_edge = PyMem_Calloc((size_t)nturns + 1, sizeof(Py_ssize_t));
    b->edges = PyMem_Calloc((size_t)(total ? total : 1), sizeof(Edge));
    if (b->first_edge == NULL || b->edges == NULL) rc = (PyErr_NoMemory(), -1);
  }
  for (Py_ssize_t turn = 0; rc == 0 && turn < nturns; ++turn) {
    b->first_edge[turn] = b->nedges;
    for (Py_ssize_t q = 0; rc == 0 && q < PySequence_Fast_GET_SIZE(fast[turn]); ++q)
      rc = read_edge(&b->edges[b->nedges++], PySequence_Fast_GET_ITEM(fast[turn], q),
                     b->s.fname, most);
    b->first_edge[turn + 1] = b->nedges;
  }
  for (Py_ssize_t turn = 0; fast != NULL && turn < nturns; ++turn) Py_XDECREF(fast[turn]);
  PyMem_Free(fast);
  Py_DECREF(turns);
  return rc < 0 ? -1 : nturns;
}

static void broadcast_free(Broadcast* b) {
  share_free(&b->s);
  Py_XDECREF(b->src.buf);
  Py_XDECREF(b->dst.buf);
  for (Py_ssize_t q = 0; b->edges != NULL && q < b->nedges; ++q) {
    Py_XDECREF(b->edges[q].p_obj);
    Py_XDECREF(b->edges[q].c_obj);
    Py_XDECREF(b->edges[q].key);
  }
  PyMem_Free(b->edges);
  PyMem_Free(b->first_edge);
}

/* after.get((root, j), (None, (i + 0.5) / m)) as a new token reference and a time. */
static int start_of(Broadcast* b, Py_ssize_t i, PyObject* j, PyObject** token, double* time) {
  PyObject* key = PyTuple_Pack(2, b->s.root_obj, j);
  PyObject* v = key != NULL ? PyDict_GetItemWithError(b->after, key) : NULL;
  Py_XDECREF(key);   /* v is the dict's */
  if (v == NULL) {
    if (PyErr_Occurred()) return -1;
    *token = Py_NewRef(Py_None);
    *time = ((double)i + 0.5) / (double)b->s.m;
    return 0;
  }
  if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2) {
    PyErr_Format(PyExc_ValueError, "%s: after holds %R, not a (token, time) pair", b->s.fname,
                 v);
    return -1;
  }
  *time = PyFloat_AsDouble(PyTuple_GET_ITEM(v, 1));
  if (*time == -1.0 && PyErr_Occurred()) return -1;
  *token = Py_NewRef(PyTuple_GET_ITEM(v, 0));
  return 0;
}

/* Edge e's direct copy of ``ref``, or hop(...) for a staged one: the seq (new reference). */
static PyObject* move_down(Broadcast* b, const Edge* e, Py_ssize_t turn, double t,
                           PyObject* ref) {
  PyObject* source = b->s.nodes.ref[e->p];
  PyObject* token = b->s.nodes.token[e->p];
  if (!e->via_host)
    return append_item(b->s.items, t, e->c_obj, e->key, b->s.op, ref, PyTuple_Pack(1, source),
                       PyTuple_Pack(1, token));
  PyObject* t_obj = PyFloat_FromDouble(t);
  if (t_obj == NULL) return NULL;
  PyObject* args[9] = {t_obj, b->s.m_obj, b->s.turn_key[turn], e->p_obj, e->c_obj, e->key,
                       ref, source, token};
  PyObject* seq = PyObject_Vectorcall(b->hop, args, 9, NULL);
  Py_DECREF(t_obj);
  return seq;
}

static int broadcast_piece(Broadcast* b, Py_ssize_t i) {
  PyObject *j, *k, *token;
  long long jv;
  double time;
  if (piece_at(b->s.pieces, i, &j, &jv, &k, b->s.fname) < 0 || start_of(b, i, j, &token, &time) < 0)
    return -1;
  PyObject* source = chunk_ref(b->s.Ref, b->s.root_obj, &b->src, jv, k);
  if (source == NULL) {
    Py_DECREF(token);
    return -1;
  }
  nodes_set(&b->s.nodes, b->s.root, i, token, time, source);
  Py_ssize_t turn = i % b->s.nturns;
  for (Py_ssize_t q = b->first_edge[turn]; q < b->first_edge[turn + 1]; ++q) {
    const Edge* e = &b->edges[q];
    if (!nodes_has(&b->s.nodes, e->p, i, e->p_obj)) return -1;
    double t = b->s.nodes.time[e->p] + b->step;
    PyObject* ref = chunk_ref(b->s.Ref, e->c_obj, &b->dst, jv, k);
    PyObject* seq = ref != NULL ? move_down(b, e, turn, t, ref) : NULL;
    if (seq == NULL) {
      Py_XDECREF(ref);
      return -1;
    }
    nodes_set(&b->s.nodes, e->c, i, seq, t, ref);
  }
  return 0;
}

PyObject* cx_tree_broadcast(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  static const char* fname = "tree_broadcast";
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "tree_broadcast(items, hop, number, share, pieces, keyed, "
                    "src, dst, after)");
    return NULL;
  }
  Broadcast b = {0};
  long most = 0;
  int rc = read_share(&b.s, fname, args[0], args[3], args[4], "copy");
  if (rc == 0 && !PyDict_Check(args[8])) {
    PyErr_Format(PyExc_TypeError, "%s: after must be a dict", fname);
    rc = -1;
  }
  if (rc == 0) {
    b.hop = args[1];
    b.after = args[8];
    b.step = 1.0 / (double)(b.s.m ? b.s.m : 1);
    most = b.s.root;
    rc = read_chunks(&b.src, args[6], b.s.root, fname, "src");
    rc = rc < 0 ? -1 : read_chunks(&b.dst, args[7], b.s.root, fname, "dst");
  }
  Py_ssize_t nturns = rc < 0 ? -1 : read_keyed(&b, args[5], &most);
  rc = nturns < 0 || turn_keys(&b.s, args[2], nturns) < 0 ? -1
                                                         : nodes_init(&b.s.nodes, most + 1);
  for (Py_ssize_t i = 0; rc == 0 && i < b.s.m; ++i) rc = broadcast_piece(&b, i);
  broadcast_free(&b);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

/* ---- reduce --------------------------------------------------------------------------------- */

/* One entry of a _ReduceShape's inner: (node, children, height, lane key, staged children);
 * its children are kids[first_kid .. first_kid + nkids) of the shape. References owned. */
typedef struct {
  long u;
  PyObject *u_obj, *key;
  double height;
  Py_ssize_t first_kid, nkids;
} Inner;

/* A _ReduceShape read: leaves, inner nodes children first, and per child whether it is staged
 * up to its parent (the frozenset is immutable, so one test serves every piece). */
typedef struct {
  Py_ssize_t nleaves, ninner, nkids;
  long* leaf;
  PyObject** leaf_obj;
  Inner* inner;
  long* kid;
  PyObject** kid_obj;
  char* staged;
  double top;
} Shape;

typedef struct {
  Share s;
  PyObject *fresh, *through_host, *done, *scratch;
  Chunks contrib, result;
  Shape* shapes;   /* one per turn */
  Py_ssize_t nshapes;
} Reduce;

static void shape_free(Shape* h) {
  for (Py_ssize_t q = 0; h->leaf_obj != NULL && q < h->nleaves; ++q) Py_XDECREF(h->leaf_obj[q]);
  for (Py_ssize_t q = 0; h->kid_obj != NULL && q < h->nkids; ++q) Py_XDECREF(h->kid_obj[q]);
  for (Py_ssize_t q = 0; h->inner != NULL && q < h->ninner; ++q) {
    Py_XDECREF(h->inner[q].u_obj);
    Py_XDECREF(h->inner[q].key);
  }
  PyMem_Free(h->leaf);
  PyMem_Free(h->leaf_obj);
  PyMem_Free(h->inner);
  PyMem_Free(h->kid);
  PyMem_Free(h->kid_obj);
  PyMem_Free(h->staged);
}

/* Allocates the shape's arrays for ``inner`` (a tuple), counting its children; -1 on error. */
static int shape_alloc(Shape* h, PyObject* inner, Py_ssize_t nleaves, const char* fname) {
  Py_ssize_t nkids = 0;
  for (Py_ssize_t q = 0; q < PyTuple_GET_SIZE(inner); ++q) {
    PyObject* entry = PyTuple_GET_ITEM(inner, q);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 5 ||
        !PyTuple_Check(PyTuple_GET_ITEM(entry, 1))) {
      PyErr_Format(PyExc_TypeError, "%s: a shape's inner holds %R, not (node, children tuple, "
                   "height, lane key, staged)", fname, entry);
      return -1;
    }
    nkids += PyTuple_GET_SIZE(PyTuple_GET_ITEM(entry, 1));
  }
  size_t one = 1;   /* calloc(0) may return NULL */
  h->leaf = PyMem_Calloc((size_t)nleaves + one, sizeof(long));
  h->leaf_obj = PyMem_Calloc((size_t)nleaves + one, sizeof(PyObject*));
  h->inner = PyMem_Calloc((size_t)PyTuple_GET_SIZE(inner) + one, sizeof(Inner));
  h->kid = PyMem_Calloc((size_t)nkids + one, sizeof(long));
  h->kid_obj = PyMem_Calloc((size_t)nkids + one, sizeof(PyObject*));
  h->staged = PyMem_Calloc((size_t)nkids + one, 1);
  if (h->leaf == NULL || h->leaf_obj == NULL || h->inner == NULL || h->kid == NULL ||
      h->kid_obj == NULL || h->staged == NULL)
    return PyErr_NoMemory(), -1;
  return 0;
}

/* inner[q] of the shape: node, children (and whether each is staged), height, key. */
static int read_inner(Shape* h, PyObject* entry, const char* fname, long* most) {
  Inner* in = &h->inner[h->ninner++];
  PyObject* kids = PyTuple_GET_ITEM(entry, 1);
  PyObject* staged = PyTuple_GET_ITEM(entry, 4);
  in->u_obj = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
  in->key = Py_NewRef(PyTuple_GET_ITEM(entry, 3));
  in->height = PyFloat_AsDouble(PyTuple_GET_ITEM(entry, 2));
  if ((in->height == -1.0 && PyErr_Occurred()) || (in->u = node_id(in->u_obj, fname)) < 0)
    return -1;
  if (in->u > *most) *most = in->u;
  in->first_kid = h->nkids;
  in->nkids = PyTuple_GET_SIZE(kids);
  for (Py_ssize_t q = 0; q < in->nkids; ++q) {
    Py_ssize_t at = h->nkids++;
    h->kid_obj[at] = Py_NewRef(PyTuple_GET_ITEM(kids, q));
    int is_staged = PySequence_Contains(staged, h->kid_obj[at]);
    if (is_staged < 0 || (h->kid[at] = node_id(h->kid_obj[at], fname)) < 0) return -1;
    h->staged[at] = (char)is_staged;
    if (h->kid[at] > *most) *most = h->kid[at];
  }
  return 0;
}

/* shape.<name> as a tuple (a new reference); NULL on error. */
static PyObject* tuple_attr(PyObject* obj, const char* name) {
  PyObject* v = PyObject_GetAttrString(obj, name);
  PyObject* t = v != NULL ? PySequence_Tuple(v) : NULL;
  Py_XDECREF(v);
  return t;
}

static int read_shape(Shape* h, PyObject* shape, const char* fname, long* most) {
  PyObject* leaves = tuple_attr(shape, "leaves");
  PyObject* inner = leaves != NULL ? tuple_attr(shape, "inner") : NULL;
  PyObject* top = inner != NULL ? PyObject_GetAttrString(shape, "top") : NULL;
  h->top = top != NULL ? PyFloat_AsDouble(top) : -1.0;
  int rc = top == NULL || (h->top == -1.0 && PyErr_Occurred()) ? -1 : 0;
  if (rc == 0) rc = shape_alloc(h, inner, PyTuple_GET_SIZE(leaves), fname);
  for (Py_ssize_t q = 0; rc == 0 && q < PyTuple_GET_SIZE(leaves); ++q) {
    h->leaf_obj[q] = Py_NewRef(PyTuple_GET_ITEM(leaves, q));
    h->nleaves = q + 1;
    rc = (h->leaf[q] = node_id(h->leaf_obj[q], fname)) < 0 ? -1 : 0;
    if (rc == 0 && h->leaf[q] > *most) *most = h->leaf[q];
  }
  for (Py_ssize_t q = 0; rc == 0 && q < PyTuple_GET_SIZE(inner); ++q)
    rc = read_inner(h, PyTuple_GET_ITEM(inner, q), fname, most);
  Py_XDECREF(leaves);
  Py_XDECREF(inner);
  Py_XDECREF(top);
  return rc;
}

/* shapes: a _ReduceShape per turn; returns the turns, -1 on error. */
static Py_ssize_t read_shapes(Reduce* r, PyObject* shapes, long* most) {
  PyObject* all = PySequence_Tuple(shapes);
  if (all == NULL) return -1;
  Py_ssize_t n = PyTuple_GET_SIZE(all);
  r->shapes = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Shape));
  int rc = r->shapes == NULL ? (PyErr_NoMemory(), -1) : 0;
  r->nshapes = rc == 0 ? n : 0;
  for (Py_ssize_t q = 0; rc == 0 && q < n; ++q)
    rc = read_shape(&r->shapes[q], PyTuple_GET_ITEM(all, q), r->s.fname, most);
  Py_DECREF(all);
  return rc < 0 ? -1 : n;
}

static void reduce_free(Reduce* r) {
  for (Py_ssize_t q = 0; q < r->nshapes; ++q) shape_free(&r->shapes[q]);
  PyMem_Free(r->shapes);
  share_free(&r->s);
  Py_XDECREF(r->scratch);
  Py_XDECREF(r->contrib.buf);
  Py_XDECREF(r->result.buf);
}

/* Child c's input to its parent u's reduction: partial[c], or for a staged child
 * through_host(t, m, (number, turn), c, u, *partial[c]). New references; -1 on error. */
static int child_input(Reduce* r, Py_ssize_t turn, double t, PyObject* c_obj, long c,
                       PyObject* u_obj, int staged, PyObject** ref, PyObject** token) {
  PyObject* mine = r->s.nodes.ref[c];
  PyObject* its = r->s.nodes.token[c];
  if (!staged) {
    *ref = Py_NewRef(mine);
    *token = Py_NewRef(its);
    return 0;
  }
  PyObject* t_obj = PyFloat_FromDouble(t);
  if (t_obj == NULL) return -1;
  PyObject* args[7] = {t_obj, r->s.m_obj, r->s.turn_key[turn], c_obj, u_obj, mine, its};
  PyObject* got = PyObject_Vectorcall(r->through_host, args, 7, NULL);
  Py_DECREF(t_obj);
  if (got == NULL) return -1;
  if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
    PyErr_Format(PyExc_TypeError, "%s: through_host returned %R, not a (Ref, token) pair",
                 r->s.fname, got);
    Py_DECREF(got);
    return -1;
  }
  *ref = Py_NewRef(PyTuple_GET_ITEM(got, 0));
  *token = Py_NewRef(PyTuple_GET_ITEM(got, 1));
  Py_DECREF(got);
  return 0;
}

/* The reduction at inner node ``in`` for piece i: own contribution first, then its children's
 * inputs, into a fresh scratch chunk (the root: into the result). */
static int reduce_node(Reduce* r, const Shape* h, const Inner* in, Py_ssize_t i, long long j,
                       PyObject* k) {
  PyObject* own = chunk_ref(r->s.Ref, in->u_obj, &r->contrib, j, k);
  if (own == NULL) return -1;
  PyObject* dst;
  if (in->u != r->s.root) {
    PyObject* args[3] = {r->scratch, in->u_obj, own};
    dst = PyObject_Vectorcall(r->fresh, args, 3, NULL);
  } else {
    dst = chunk_ref(r->s.Ref, in->u_obj, &r->result, j, k);
  }
  double t = ((double)i + 0.5 + in->height) / (double)r->s.m;
  PyObject* srcs = dst != NULL ? PyTuple_New(1 + in->nkids) : NULL;
  PyObject* tokens = srcs != NULL ? PyTuple_New(in->nkids) : NULL;
  if (tokens == NULL) {
    Py_DECREF(own);
    Py_XDECREF(srcs);
    Py_XDECREF(dst);
    return -1;
  }
  PyTuple_SET_ITEM(srcs, 0, own);
  Py_ssize_t turn = i % r->s.nturns;
  for (Py_ssize_t q = in->first_kid; q < in->first_kid + in->nkids; ++q) {
    PyObject *ref, *token;
    if (!nodes_has(&r->s.nodes, h->kid[q], i, h->kid_obj[q]) ||
        child_input(r, turn, t, h->kid_obj[q], h->kid[q], in->u_obj, h->staged[q], &ref,
                    &token) < 0) {
      Py_DECREF(srcs);   /* tuples release the entries set so far */
      Py_DECREF(tokens);
      Py_DECREF(dst);
      return -1;
    }
    PyTuple_SET_ITEM(srcs, 1 + q - in->first_kid, ref);
    PyTuple_SET_ITEM(tokens, q - in->first_kid, token);
  }
  PyObject* seq = append_item(r->s.items, t, in->u_obj, in->key, r->s.op, dst, srcs, tokens);
  if (seq == NULL) {
    Py_DECREF(dst);
    return -1;
  }
  nodes_set(&r->s.nodes, in->u, i, seq, t, dst);
  return 0;
}

/* done[root, j] = (partial[root]'s token, (i + 0.5 + top) / m). */
static int record_done(Reduce* r, const Shape* h, Py_ssize_t i, PyObject* j) {
  if (!nodes_has(&r->s.nodes, r->s.root, i, r->s.root_obj)) return -1;
  PyObject* key = PyTuple_Pack(2, r->s.root_obj, j);
  PyObject* at[2] = {Py_NewRef(r->s.nodes.token[r->s.root]),
                     PyFloat_FromDouble(((double)i + 0.5 + h->top) / (double)r->s.m)};
  PyObject* value = steal_tuple(at, 2);
  int rc = key != NULL && value != NULL ? PyDict_SetItem(r->done, key, value) : -1;
  Py_XDECREF(key);
  Py_XDECREF(value);
  return rc;
}

static int reduce_piece(Reduce* r, Py_ssize_t i) {
  PyObject *j, *k;
  long long jv;
  if (piece_at(r->s.pieces, i, &j, &jv, &k, r->s.fname) < 0) return -1;
  const Shape* h = &r->shapes[i % r->s.nturns];
  for (Py_ssize_t q = 0; q < h->nleaves; ++q) {
    PyObject* ref = chunk_ref(r->s.Ref, h->leaf_obj[q], &r->contrib, jv, k);
    if (ref == NULL) return -1;
    nodes_set(&r->s.nodes, h->leaf[q], i, Py_NewRef(Py_None), 0.0, ref);
  }
  for (Py_ssize_t q = 0; q < h->ninner; ++q)   /* children first */
    if (reduce_node(r, h, &h->inner[q], i, jv, k) < 0) return -1;
  return record_done(r, h, i, j);
}

PyObject* cx_tree_reduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  static const char* fname = "tree_reduce";
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError, "tree_reduce(items, fresh, through_host, number, share, "
                    "pieces, shapes, contrib, result, done)");
    return NULL;
  }
  Reduce r = {0};
  long most = 0;
  int rc = read_share(&r.s, fname, args[0], args[4], args[5], "reduce");
  if (rc == 0 && !PyDict_Check(args[9])) {
    PyErr_Format(PyExc_TypeError, "%s: done must be a dict", fname);
    rc = -1;
  }
  if (rc == 0) {
    r.fresh = args[1];
    r.through_host = args[2];
    r.done = args[9];
    most = r.s.root;
    r.scratch = PyUnicode_InternFromString("scratch");
    rc = r.scratch == NULL ? -1 : read_chunks(&r.contrib, args[7], r.s.root, fname, "contrib");
    rc = rc < 0 ? -1 : read_chunks(&r.result, args[8], r.s.root, fname, "result");
  }
  Py_ssize_t nturns = rc < 0 ? -1 : read_shapes(&r, args[6], &most);
  rc = nturns < 0 || turn_keys(&r.s, args[3], nturns) < 0 ? -1 : nodes_init(&r.s.nodes, most + 1);
  for (Py_ssize_t i = 0; rc == 0 && i < r.s.m; ++i) rc = reduce_piece(&r, i);
  reduce_free(&r);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}
