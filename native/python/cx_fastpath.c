/* collectx._fastpath: the hot numpy-level entry points of collectx._native (reduce, copy) as a
 * small CPython extension.
 *
 * Why it exists: through cffi's ABI mode a reduce() call pays a libffi call plus one
 * ffi.from_buffer per array (about 0.5 us each on a slow core), several microseconds in all,
 * which is the whole run time of a 64 KiB kernel. Here a call costs one C function call and a few
 * flag reads per array.
 *
 * It does not link against libcollectx. collectx/_native.py stays the one loader (cffi ABI mode)
 * and hands the addresses of cx_reduce/cx_copy/cx_scale to bind(), so both paths always run the
 * same library, including one named by COLLECTX_NATIVE_LIB.
 *
 * The module also carries the planner's hot loops: schedule_arrays and word_arrays
 * (cx_schedule_arrays.c), the simulator's one-pass readers of a schedule's instructions (objects
 * or words); lower_words (cx_lower.c), the tree emitter's lowering of a packing straight to
 * words; max_flow and paths_ok (cx_maxflow.c), Lovász's construction's max-flows;
 * min_arborescence (cx_arborescence.c), the packing LP's pricing; grown_together (cx_grown.c)
 * and shallower (cx_shallower.c), Lovász's trees grown at once and then shortened;
 * pack_words and unpack_words (cx_unpack.c), a schedule's instructions as words and back;
 * shape_groups (cx_shapes.c), the simulator's instructions grouped by shape.
 *
 * Contract of reduce() and copy(): True when the call ran; False when nothing was touched and the
 * caller must take the fully checked Python path, which raises the precise, typed error. So every
 * unusual input only has to be recognised here, never explained: anything that is not a
 * C-contiguous, native-byte-order ndarray of a supported dtype, a read-only dst, mismatched
 * dtypes or lengths, an unknown op or dtype name, k < 1, and overlap (the library refuses it with
 * CX_ERR_ARG before writing anything).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <stddef.h>
#include <string.h>

/* Only the declarations (status codes, the executor's structs): nothing is linked. */
#include "../include/collectx.h"
#include "cx_schedule_arrays.h"
#include "cx_maxflow.h"
#include "cx_arborescence.h"
#include "cx_grown.h"
#include "cx_shallower.h"
#include "cx_shapes.h"
#include "cx_lower.h"
#include "cx_unpack.h"

/* Bumped when the Python-side contract changes; collectx/_native.py refuses other versions.
 * (FastCall is an addition the runtime looks up by name; reduce/copy are unchanged.) */
#define CX_FASTPATH_API 1
/* Version of FastCall's constructor and call signature; the engine builds FastCalls only of the
 * version it speaks, so a stale compiled module leaves the checked path in charge. */
#define CX_FASTCALL_API 3

/* Calls that move at least this many bytes (all inputs) release the GIL; below it the release
 * and re-acquire would cost more than the overlap they buy. */
#define RELEASE_GIL_BYTES ((Py_ssize_t)256 << 10)
/* Source pointers up to this count live on the stack. */
#define STACK_SRCS 16

typedef int (*reduce_fn)(void*, const void* const*, int, size_t, int, int);
typedef int (*copy_fn)(void*, const void*, size_t);
typedef int (*scale_fn)(void*, size_t, int, double);
typedef size_t (*dtype_bytes_fn)(int);

/* Set once by bind(); reduce()/copy() before bind() return False (checked path). */
static struct {
  reduce_fn reduce;
  copy_fn copy;
  scale_fn scale;
  dtype_bytes_fn dtype_bytes;
  PyObject* dtypes;   /* dict: dtype name -> cx_dtype code (collectx._native.DTYPES) */
  PyObject* ops;      /* dict: op name -> cx_op code (collectx._native.OPS) */
  PyObject* check_rc; /* collectx._native.check_rc: raises the typed error of a status */
  int avg;            /* cx_op code of "avg" */
  /* cx_dtype codes of the numpy types the kernels take natively; -1 when absent. */
  int int8, uint8, int32, int64, float16, float32, float64;
} g = {0};

/* The cx_dtype code of a native-byte-order numpy array, or -1 (unsupported: checked path). */
static int array_code(PyArrayObject* a) {
  if (PyArray_ISBYTESWAPPED(a)) return -1;
  switch (PyArray_TYPE(a)) {
    case NPY_BYTE: return g.int8;
    case NPY_UBYTE: return g.uint8;
    case NPY_INT:
    case NPY_LONG:
    case NPY_LONGLONG:
      /* C int/long/long long map to int32/int64 by width, whatever the platform. */
      if (PyArray_ITEMSIZE(a) == 4) return g.int32;
      if (PyArray_ITEMSIZE(a) == 8) return g.int64;
      return -1;
    case NPY_HALF: return g.float16;
    case NPY_FLOAT: return g.float32;
    case NPY_DOUBLE: return g.float64;
    default: return -1;
  }
}

/* The code of a name in one of the bound tables (exact str only), or -1. */
static int table_code(PyObject* table, PyObject* name) {
  if (!PyUnicode_CheckExact(name)) return -1;
  PyObject* code = PyDict_GetItemWithError(table, name); /* borrowed */
  if (code == NULL) {
    PyErr_Clear();
    return -1;
  }
  long value = PyLong_AsLong(code);
  if (value == -1 && PyErr_Occurred()) PyErr_Clear();
  return (int)value;
}

/* dst's cx_dtype code: its own type, or the `dtype=` name when the element sizes agree. */
static int dst_code(PyArrayObject* dst, PyObject* dtype) {
  if (dtype == Py_None) return array_code(dst);
  int code = table_code(g.dtypes, dtype);
  if (code < 0 || g.dtype_bytes((int)code) != (size_t)PyArray_ITEMSIZE(dst)) return -1;
  return code;
}

static int is_plain_array(PyObject* obj) {
  return PyArray_Check(obj) && PyArray_IS_C_CONTIGUOUS((PyArrayObject*)obj);
}

static int is_plain_output(PyObject* obj) {
  return is_plain_array(obj) && PyArray_ISWRITEABLE((PyArrayObject*)obj);
}

/* Same element type as dst: the same descriptor object (the common case) or an equivalent one. */
static int same_dtype(PyArrayObject* a, PyArrayObject* dst) {
  return PyArray_DESCR(a) == PyArray_DESCR(dst) || PyArray_EquivTypes(PyArray_DESCR(a),
                                                                      PyArray_DESCR(dst));
}

/* Fills ptrs[0..k) with the sources' data pointers; 0 when any source is off the fast path. */
static int gather_sources(PyObject* const* items, Py_ssize_t k, PyArrayObject* dst,
                          const void** ptrs) {
  npy_intp n = PyArray_SIZE(dst);
  for (Py_ssize_t i = 0; i < k; i++) {
    PyObject* obj = items[i];
    if (!is_plain_array(obj)) return 0;
    PyArrayObject* s = (PyArrayObject*)obj;
    if (PyArray_SIZE(s) != n || !same_dtype(s, dst)) return 0;
    ptrs[i] = PyArray_DATA(s);
  }
  return 1;
}

/* Runs cx_reduce, without the GIL for large calls. While the GIL is released another thread may
 * change the srcs list (and drop the last reference to a source), so the sources are held by a
 * tuple snapshot for the duration; a tuple is immutable and is held by its caller already. */
static int run_reduce(PyArrayObject* dst, PyObject* srcs, const void** ptrs, int k, int code,
                      int op) {
  size_t n = (size_t)PyArray_SIZE(dst);
  if ((Py_ssize_t)k * PyArray_NBYTES(dst) < RELEASE_GIL_BYTES)
    return g.reduce(PyArray_DATA(dst), ptrs, k, n, code, op);
  PyObject* hold = PyTuple_CheckExact(srcs) ? Py_NewRef(srcs) : PyList_AsTuple(srcs);
  if (hold == NULL) {
    PyErr_Clear();
    return g.reduce(PyArray_DATA(dst), ptrs, k, n, code, op); /* no memory: keep the GIL */
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = g.reduce(PyArray_DATA(dst), ptrs, k, n, code, op);
  Py_END_ALLOW_THREADS
  Py_DECREF(hold);
  return rc;
}

/* Raises the typed error of a failed status through collectx._native.check_rc; returns NULL. */
static PyObject* raise_status(int rc, const char* what) {
  PyObject* result = PyObject_CallFunction(g.check_rc, "is", rc, what);
  if (result != NULL) { /* check_rc returned: it did not see a failure; say so plainly */
    Py_DECREF(result);
    PyErr_Format(PyExc_SystemError, "%s failed with status %d but check_rc did not raise", what,
                 rc);
  }
  return NULL;
}

PyDoc_STRVAR(reduce_doc,
"reduce(dst, srcs, op, dtype) -> bool\n\n"
"dst = srcs[0] op srcs[1] op ... through cx_reduce (and cx_scale for avg). False when the\n"
"arguments are off the fast path; nothing was touched and the caller checks them fully.");

static PyObject* fast_reduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_Format(PyExc_TypeError, "reduce() takes 4 arguments (dst, srcs, op, dtype), got %zd",
                 nargs);
    return NULL;
  }
  PyObject *dst_obj = args[0], *srcs = args[1];
  if (g.reduce == NULL || !is_plain_output(dst_obj)) Py_RETURN_FALSE;
  PyArrayObject* dst = (PyArrayObject*)dst_obj;
  int code = dst_code(dst, args[3]);
  int op = table_code(g.ops, args[2]);
  if (code < 0 || op < 0) Py_RETURN_FALSE;
  Py_ssize_t k;
  PyObject* const* items;
  if (PyList_CheckExact(srcs)) {
    k = PyList_GET_SIZE(srcs);
    items = ((PyListObject*)srcs)->ob_item;
  } else if (PyTuple_CheckExact(srcs)) {
    k = PyTuple_GET_SIZE(srcs);
    items = ((PyTupleObject*)srcs)->ob_item;
  } else {
    Py_RETURN_FALSE;
  }
  if (k < 1 || k > INT_MAX) Py_RETURN_FALSE;
  const void* stack_ptrs[STACK_SRCS];
  const void** ptrs = stack_ptrs;
  if (k > STACK_SRCS && (ptrs = PyMem_Malloc((size_t)k * sizeof(void*))) == NULL)
    return PyErr_NoMemory();
  int rc = gather_sources(items, k, dst, ptrs) ? run_reduce(dst, srcs, ptrs, (int)k, code, op)
                                               : CX_ERR_ARG;
  if (ptrs != stack_ptrs) PyMem_Free(ptrs);
  /* Any refusal (overlap is CX_ERR_ARG) happened before a write: the checked path explains it. */
  if (rc != CX_OK) Py_RETURN_FALSE;
  if (op == g.avg && k > 1) {
    rc = g.scale(PyArray_DATA(dst), (size_t)PyArray_SIZE(dst), code, 1.0 / (double)k);
    if (rc != CX_OK) return raise_status(rc, "cx_scale"); /* dst is written: no fallback */
  }
  Py_RETURN_TRUE;
}

PyDoc_STRVAR(copy_doc,
"copy(dst, src) -> bool\n\n"
"dst[:] = src through cx_copy. False when the arguments are off the fast path; nothing was\n"
"touched and the caller checks them fully.");

static PyObject* fast_copy(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_Format(PyExc_TypeError, "copy() takes 2 arguments (dst, src), got %zd", nargs);
    return NULL;
  }
  if (g.copy == NULL || !is_plain_output(args[0]) || !is_plain_array(args[1])) Py_RETURN_FALSE;
  PyArrayObject *dst = (PyArrayObject*)args[0], *src = (PyArrayObject*)args[1];
  /* Bytes are copied whatever the dtype, except object arrays (their references are counted). */
  if (PyDataType_REFCHK(PyArray_DESCR(dst)) || PyArray_SIZE(src) != PyArray_SIZE(dst) ||
      !same_dtype(src, dst))
    Py_RETURN_FALSE;
  size_t nbytes = (size_t)PyArray_NBYTES(dst);
  int rc;
  if ((Py_ssize_t)nbytes < RELEASE_GIL_BYTES) {
    rc = g.copy(PyArray_DATA(dst), PyArray_DATA(src), nbytes);
  } else {
    Py_BEGIN_ALLOW_THREADS
    rc = g.copy(PyArray_DATA(dst), PyArray_DATA(src), nbytes);
    Py_END_ALLOW_THREADS
  }
  if (rc != CX_OK) Py_RETURN_FALSE; /* partial overlap, refused before writing */
  Py_RETURN_TRUE;
}

/* A required int entry of a bound table. */
static int required_code(PyObject* table, const char* name, int* out) {
  PyObject* code = PyDict_GetItemString(table, name); /* borrowed, never raises */
  if (code == NULL) {
    PyErr_Format(PyExc_ValueError, "bind(): the table has no entry '%s'; expected the "
                 "collectx._native tables", name);
    return -1;
  }
  *out = (int)PyLong_AsLong(code);
  return PyErr_Occurred() ? -1 : 0;
}

static void* address_of(PyObject* obj) {
  void* p = PyLong_AsVoidPtr(obj);
  if (p == NULL && !PyErr_Occurred())
    PyErr_SetString(PyExc_ValueError, "bind(): a function address is 0; expected the addresses "
                    "of cx_reduce, cx_copy, cx_scale and cx_dtype_bytes");
  return p;
}

PyDoc_STRVAR(bind_doc,
"bind(reduce_addr, copy_addr, scale_addr, dtype_bytes_addr, dtypes, ops, check_rc)\n\n"
"Points the fast path at a loaded libcollectx: the addresses of cx_reduce, cx_copy, cx_scale and\n"
"cx_dtype_bytes, the name -> code tables (collectx._native.DTYPES, OPS) and check_rc.");

static PyObject* bind(PyObject* self, PyObject* args) {
  PyObject *a_reduce, *a_copy, *a_scale, *a_bytes, *dtypes, *ops, *check_rc;
  if (!PyArg_ParseTuple(args, "OOOOO!O!O:bind", &a_reduce, &a_copy, &a_scale, &a_bytes,
                        &PyDict_Type, &dtypes, &PyDict_Type, &ops, &check_rc))
    return NULL;
  void *f_reduce = address_of(a_reduce), *f_copy = NULL, *f_scale = NULL, *f_bytes = NULL;
  if (f_reduce == NULL || (f_copy = address_of(a_copy)) == NULL ||
      (f_scale = address_of(a_scale)) == NULL || (f_bytes = address_of(a_bytes)) == NULL)
    return NULL;
  int c[8];
  const char* names[8] = {"int8", "uint8", "int32", "int64", "float16", "float32", "float64",
                          NULL};
  for (int i = 0; names[i]; i++)
    if (required_code(dtypes, names[i], &c[i]) < 0) return NULL;
  int avg;
  if (required_code(ops, "avg", &avg) < 0) return NULL;
  Py_INCREF(dtypes);
  Py_INCREF(ops);
  Py_INCREF(check_rc);
  Py_XSETREF(g.dtypes, dtypes);
  Py_XSETREF(g.ops, ops);
  Py_XSETREF(g.check_rc, check_rc);
  g.int8 = c[0], g.uint8 = c[1], g.int32 = c[2], g.int64 = c[3];
  g.float16 = c[4], g.float32 = c[5], g.float64 = c[6];
  g.avg = avg;
  g.scale = (scale_fn)f_scale;
  g.dtype_bytes = (dtype_bytes_fn)f_bytes;
  g.copy = (copy_fn)f_copy;
  g.reduce = (reduce_fn)f_reduce;
  Py_RETURN_NONE;
}

/* ---- Lock: the engine's lock, also taken by FastCall without a Python call ------------------
 * `with lock:` blocks (without the GIL) until it is free; FastCall only tries it. */

typedef struct {
  PyObject_HEAD
  PyThread_type_lock lock;
  int locked;
} CxLock;

static PyObject* cxlock_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  CxLock* self = (CxLock*)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  if ((self->lock = PyThread_allocate_lock()) == NULL) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return (PyObject*)self;
}

static void cxlock_dealloc(CxLock* self) {
  if (self->lock != NULL) {
    if (self->locked) PyThread_release_lock(self->lock);
    PyThread_free_lock(self->lock);
  }
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static int cxlock_try(CxLock* self) {
  if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) return 0;
  self->locked = 1;
  return 1;
}

static void cxlock_release_held(CxLock* self) {
  self->locked = 0;
  PyThread_release_lock(self->lock);
}

static PyObject* cxlock_enter(CxLock* self, PyObject* unused) {
  if (!cxlock_try(self)) {
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
    self->locked = 1;
  }
  Py_RETURN_TRUE;
}

static PyObject* cxlock_exit(CxLock* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!self->locked) {
    PyErr_SetString(PyExc_RuntimeError, "Lock released while not held; expected a matching "
                    "acquire (use `with lock:`)");
    return NULL;
  }
  cxlock_release_held(self);
  Py_RETURN_FALSE;
}

static PyObject* cxlock_is_locked(CxLock* self, PyObject* unused) {
  return PyBool_FromLong(self->locked);
}

static PyMethodDef cxlock_methods[] = {
    {"__enter__", (PyCFunction)cxlock_enter, METH_NOARGS, "Acquire, waiting without the GIL."},
    {"__exit__", (PyCFunction)(void (*)(void))cxlock_exit, METH_FASTCALL, "Release."},
    {"acquire", (PyCFunction)cxlock_enter, METH_NOARGS, "Acquire, waiting without the GIL."},
    {"release", (PyCFunction)(void (*)(void))cxlock_exit, METH_FASTCALL, "Release."},
    {"locked", (PyCFunction)cxlock_is_locked, METH_NOARGS, "True while held."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CxLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectx._fastpath.Lock",
    .tp_basicsize = sizeof(CxLock),
    .tp_dealloc = (destructor)cxlock_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A non-reentrant lock that FastCall can try from C (see the engine).",
    .tp_methods = cxlock_methods,
    .tp_new = cxlock_new,
};

/* ---- FastCall: one prepared collective call of the CPU runtime, run in one C call ------------
 *
 * Why it exists: a small collective (allreduce, allgather, reduce_scatter) is dominated by the
 * Python around the executor (validation, the plan cache lookup, ffi.from_buffer, cffi's libffi
 * call, the result struct reads): several microseconds against about one of native work. The
 * runtime builds a FastCall for one call signature (collective, dtype, input and output element
 * counts, op, in place or not) once the checked path has run it, with the addresses of its cffi
 * structs (plan, window, call, result) and of the engine's sequence/epoch counters; a later call
 * with the same signature costs a few flag reads and cx_exec_run.
 *
 * Contract of a call fc(x, out, op[, root]): True when the collective ran; False when x, out, op
 * or root does not match (or the FastCall was disabled, or another thread holds the engine's
 * lock) and nothing was touched: the caller takes the checked path. The prepared call struct was
 * made for one layout of the user's buffers (its direct-chunk masks, in_private and the buffers
 * peers may read across processes were chosen for it), so a FastCall takes that layout only:
 *   same      out is None (or x itself): x is input and output (allreduce(x), broadcast's root)
 *   disjoint  a writable out disjoint from x
 *   in_at     x is block `unit` of out, exactly (allgather in place, NCCL style)
 *   out_at    out is block `unit` of x, exactly (reduce_scatter in place)
 *   in_only   x is only read and out is ignored, as the checked path ignores it (reduce on a
 *             rank that is not the root)
 *   out_only  out is None and x is only written (broadcast on a rank that is not the root)
 *
 * A failed collective raises through the engine's callback (on_failure(seq)), which maps the
 * result struct to the collectx exception, exactly as the checked path does. The GIL is released
 * around cx_exec_run: it may wait for peers, which can be threads of this process. */

typedef int (*exec_run_fn)(const cx_exec_plan*, const cx_exec_window*, const cx_exec_call*,
                           cx_exec_result*);

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  exec_run_fn run;
  const cx_exec_plan* plan;
  const cx_exec_window* win;
  cx_exec_call* call;
  cx_exec_result* res;
  unsigned long long* state; /* the engine's [seq, epoch], a cffi array it reads and writes too */
  PyArray_Descr* descr;      /* the dtype this call takes (compared by identity first) */
  npy_intp in_count;         /* elements of x */
  npy_intp out_count;        /* elements of out (layouts with an out) */
  int layout;                /* LAYOUT_* */
  npy_intp unit;             /* in_at / out_at: which block of the larger buffer */
  long root;                 /* the root the call struct was prepared for (0 when none) */
  PyObject* op;              /* op name (None for allgather, broadcast) */
  char* heap_lo;             /* this rank's window heap, whose arrays are used in place */
  char* heap_hi;
  CxLock* lock;              /* the engine's lock */
  PyObject* on_failure;      /* engine callback: raises the exception of res for call seq */
  PyObject* keep;            /* the cffi objects the pointers above point into */
  int enabled;
  unsigned long long calls;  /* collectives this object ran (tests assert the path is taken) */
} FastCall;

static PyObject* fastcall_call(FastCall* self, PyObject* const* args, size_t nargsf,
                               PyObject* kwnames);

/* Garbage-collected: on_failure is a bound method of the engine, which caches this object, so
 * the two form a cycle the collector must be able to see. */
static int fastcall_traverse(FastCall* self, visitproc visit, void* arg) {
  Py_VISIT(self->descr);
  Py_VISIT(self->op);
  Py_VISIT(self->lock);
  Py_VISIT(self->on_failure);
  Py_VISIT(self->keep);
  return 0;
}

static int fastcall_clear(FastCall* self) {
  self->enabled = 0; /* the pointers may die with `keep` */
  Py_CLEAR(self->descr);
  Py_CLEAR(self->op);
  Py_CLEAR(self->lock);
  Py_CLEAR(self->on_failure);
  Py_CLEAR(self->keep);
  return 0;
}

static void fastcall_dealloc(FastCall* self) {
  PyObject_GC_UnTrack(self);
  fastcall_clear(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* fastcall_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  FastCall* self = (FastCall*)type->tp_alloc(type, 0); /* zeroed: disabled until __init__ */
  if (self != NULL) self->vectorcall = (vectorcallfunc)fastcall_call;
  return (PyObject*)self;
}

static void* pointer_arg(PyObject* obj, const char* what) {
  void* p = PyLong_AsVoidPtr(obj);
  if (p == NULL && !PyErr_Occurred())
    PyErr_Format(PyExc_ValueError, "FastCall(): %s is 0; expected the address of a live struct",
                 what);
  return p;
}

enum { LAYOUT_SAME, LAYOUT_DISJOINT, LAYOUT_IN_AT, LAYOUT_OUT_AT, LAYOUT_IN_ONLY,
       LAYOUT_OUT_ONLY, LAYOUT_COUNT };
static const char* const layout_names[LAYOUT_COUNT] = {"same", "disjoint", "in_at", "out_at",
                                                        "in_only", "out_only"};

static int has_out(int layout) {
  return layout == LAYOUT_DISJOINT || layout == LAYOUT_IN_AT || layout == LAYOUT_OUT_AT;
}

static int layout_arg(const char* name) {
  for (int i = 0; i < LAYOUT_COUNT; i++)
    if (strcmp(name, layout_names[i]) == 0) return i;
  PyErr_Format(PyExc_ValueError, "FastCall(): layout '%s'; expected one of same, disjoint, "
               "in_at, out_at, in_only, out_only", name);
  return -1;
}

/* The out count argument: a count >= 0 for layouts with an out, else None. */
static int out_count_arg(PyObject* obj, int layout, npy_intp* out) {
  *out = -1;
  if (obj == Py_None && !has_out(layout)) return 0;
  Py_ssize_t n = obj == Py_None ? -1 : PyLong_AsSsize_t(obj);
  if (n == -1 && PyErr_Occurred()) return -1;
  if (n < 0 || !has_out(layout)) {
    PyErr_Format(PyExc_ValueError, "FastCall(): out_count %R with layout '%s'; expected a count "
                 ">= 0 for disjoint, in_at and out_at, None for the others", obj,
                 layout_names[layout]);
    return -1;
  }
  *out = n;
  return 0;
}

static int fastcall_init(FastCall* self, PyObject* args, PyObject* kwds) {
  PyObject *a_run, *a_plan, *a_win, *a_call, *a_res, *a_state, *a_lo, *a_hi;
  PyObject *descr, *a_out_count, *op, *lock, *on_failure, *keep;
  Py_ssize_t in_count, unit;
  const char* layout_name;
  long root;
  npy_intp out_count;
  if (!PyArg_ParseTuple(args, "OOOOOOOOO!nOOO!OOsnl:FastCall", &a_run, &a_plan, &a_win, &a_call,
                        &a_res, &a_state, &a_lo, &a_hi, &PyArrayDescr_Type, &descr, &in_count,
                        &a_out_count, &op, &CxLockType, &lock, &on_failure, &keep, &layout_name,
                        &unit, &root))
    return -1;
  if (in_count < 0 || unit < 0) {
    PyErr_SetString(PyExc_ValueError, "FastCall(): in_count and unit must be >= 0");
    return -1;
  }
  int layout = layout_arg(layout_name);
  if (layout < 0 || out_count_arg(a_out_count, layout, &out_count) < 0) return -1;
  if (op != Py_None && !PyUnicode_CheckExact(op)) {
    PyErr_SetString(PyExc_TypeError, "FastCall(): op must be an op name (str) or None");
    return -1;
  }
  void* p[6];
  PyObject* objs[6] = {a_run, a_plan, a_win, a_call, a_res, a_state};
  const char* names[6] = {"run", "plan", "window", "call", "result", "state"};
  for (int i = 0; i < 6; i++)
    if ((p[i] = pointer_arg(objs[i], names[i])) == NULL) return -1;
  char* lo = PyLong_AsVoidPtr(a_lo);
  char* hi = PyLong_AsVoidPtr(a_hi);
  if (PyErr_Occurred()) return -1;
  if (!PyCallable_Check(on_failure)) {
    PyErr_SetString(PyExc_TypeError, "FastCall(): on_failure must be callable");
    return -1;
  }
  self->run = (exec_run_fn)p[0];
  self->plan = p[1];
  self->win = p[2];
  self->call = p[3];
  self->res = p[4];
  self->state = p[5];
  self->heap_lo = lo;
  self->heap_hi = hi;
  self->in_count = (npy_intp)in_count;
  self->out_count = out_count;
  self->layout = layout;
  self->unit = (npy_intp)unit;
  self->root = root;
  Py_INCREF(descr);
  Py_INCREF(op);
  Py_INCREF(lock);
  Py_INCREF(on_failure);
  Py_INCREF(keep);
  Py_XSETREF(self->descr, (PyArray_Descr*)descr);
  Py_XSETREF(self->op, op);
  Py_XSETREF(self->lock, (CxLock*)lock);
  Py_XSETREF(self->on_failure, on_failure);
  Py_XSETREF(self->keep, keep);
  self->enabled = 1;
  return 0;
}

/* Whether obj is an array this call takes as it is: exact ndarray, C-contiguous, writable when
 * written, the same dtype (native byte order; an equivalent descriptor counts) and `count`
 * elements, not straddling the edge of this rank's heap. */
static int fastcall_accepts_array(FastCall* self, PyObject* obj, npy_intp count, int written) {
  if (!PyArray_CheckExact(obj)) return 0;
  PyArrayObject* a = (PyArrayObject*)obj;
  if (!PyArray_IS_C_CONTIGUOUS(a) || (written && !PyArray_ISWRITEABLE(a)) ||
      PyArray_SIZE(a) != count)
    return 0;
  if (PyArray_DESCR(a) != self->descr && !PyArray_EquivTypes(PyArray_DESCR(a), self->descr))
    return 0;
  char *data = PyArray_DATA(a), *end = data + PyArray_NBYTES(a);
  int inside = data >= self->heap_lo && end <= self->heap_hi;
  return inside || !(data < self->heap_hi && end > self->heap_lo);
}

/* The byte offset of buf (of a call's accepted arrays) in this rank's heap, or -1 outside it: as
 * the checked path codes in_heap / out_heap. */
static long long heap_offset(FastCall* self, const char* buf) {
  return buf && buf >= self->heap_lo && buf < self->heap_hi ? (long long)(buf - self->heap_lo)
                                                            : -1;
}

/* Whether two accepted (C-contiguous) arrays occupy disjoint bytes. Equal start addresses count
 * as overlapping even when empty: the checked path may call those the same memory. */
static int disjoint(PyArrayObject* a, PyArrayObject* b) {
  char *pa = PyArray_DATA(a), *pb = PyArray_DATA(b);
  if (pa == pb) return 0;
  return pa + PyArray_NBYTES(a) <= pb || pb + PyArray_NBYTES(b) <= pa;
}

/* Whether `small` lies exactly at block `unit` of `big` (blocks of small's size). */
static int at_block(PyArrayObject* small, PyArrayObject* big, npy_intp unit) {
  return PyArray_NBYTES(small) > 0 &&
         (char*)PyArray_DATA(small) == (char*)PyArray_DATA(big) + unit * PyArray_NBYTES(small);
}

/* Whether (x, out) is in the layout this call was built for (see the contract above). */
static int fastcall_accepts(FastCall* self, PyObject* x, PyObject* out) {
  switch (self->layout) {
    case LAYOUT_SAME:
      return (out == Py_None || out == x) && fastcall_accepts_array(self, x, self->in_count, 1);
    case LAYOUT_OUT_ONLY:
      return out == Py_None && fastcall_accepts_array(self, x, self->in_count, 1);
    case LAYOUT_IN_ONLY:
      return fastcall_accepts_array(self, x, self->in_count, 0);
    default:
      break;
  }
  if (!fastcall_accepts_array(self, x, self->in_count, 0) ||
      !fastcall_accepts_array(self, out, self->out_count, 1))
    return 0;
  PyArrayObject *a = (PyArrayObject*)x, *b = (PyArrayObject*)out;
  if (self->layout == LAYOUT_IN_AT) return at_block(a, b, self->unit);
  if (self->layout == LAYOUT_OUT_AT) return at_block(b, a, self->unit);
  return disjoint(a, b);
}

/* The optional fourth argument: absent (the call has no root: 0), or an int equal to root. */
static int same_root(FastCall* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 4) return self->root == 0;
  if (!PyLong_CheckExact(args[3])) return 0;
  int overflow;
  long root = PyLong_AsLongAndOverflow(args[3], &overflow);
  return !overflow && root == self->root;
}

static int same_op(FastCall* self, PyObject* op) {
  if (op == self->op) return 1;
  return self->op != Py_None && PyUnicode_CheckExact(op) && PyUnicode_Compare(op, self->op) == 0;
}

/* Sets the exception of a failed call: the engine's callback raises it (under the lock, as on the
 * checked path). */
static void raise_failure(FastCall* self, unsigned long long seq) {
  PyObject* seq_obj = PyLong_FromUnsignedLongLong(seq);
  PyObject* r = seq_obj ? PyObject_CallOneArg(self->on_failure, seq_obj) : NULL;
  Py_XDECREF(seq_obj);
  if (r != NULL) {
    Py_DECREF(r);
    PyErr_Format(PyExc_SystemError, "FastCall: status %d but on_failure did not raise",
                 self->res->status);
  }
}

static PyObject* fastcall_call(FastCall* self, PyObject* const* args, size_t nargsf,
                               PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs < 3 || nargs > 4 || kwnames != NULL) {
    PyErr_Format(PyExc_TypeError, "FastCall takes 3 or 4 positional arguments (x, out, op[, "
                 "root]), got %zd", nargs);
    return NULL;
  }
  PyObject *x = args[0], *out = args[1];
  if (!self->enabled || !fastcall_accepts(self, x, out) || !same_op(self, args[2]) ||
      !same_root(self, args, nargs))
    Py_RETURN_FALSE;
  if (!cxlock_try(self->lock))
    Py_RETURN_FALSE; /* another thread runs a collective: the checked path waits for it */
  void* data = PyArray_DATA((PyArrayObject*)x);
  cx_exec_call* c = self->call;
  unsigned long long seq = self->state[0];
  /* As the checked path passes them: no input on a broadcast's receivers, no output on a
   * reduce's non-roots, x for both when in place. */
  c->user_in = self->layout == LAYOUT_OUT_ONLY ? NULL : data;
  c->user_out = self->layout == LAYOUT_IN_ONLY ? NULL
                : has_out(self->layout)        ? PyArray_DATA((PyArrayObject*)out)
                                               : data;
  c->seq = seq;
  c->epoch = self->state[1];
  /* As collectx/runtime/engine.py input_heap codes them: an input that shares memory with the
   * output is staged, unless the output is x itself and peers may read the input in place
   * (cma_in: as across processes, every read of an input chunk comes before every write). */
  c->out_heap = heap_offset(self, (const char*)c->user_out);
  if (self->layout == LAYOUT_SAME)
    c->in_heap = c->cma_in ? c->out_heap : -1;
  else if (self->layout == LAYOUT_IN_AT || self->layout == LAYOUT_OUT_AT)
    c->in_heap = -1;
  else
    c->in_heap = heap_offset(self, (const char*)c->user_in);
  Py_BEGIN_ALLOW_THREADS
  self->run(self->plan, self->win, c, self->res);
  Py_END_ALLOW_THREADS
  self->state[0] = seq + 1;
  self->state[1] += self->res->epochs_used;
  self->calls++;
  int failed = self->res->status != CX_EXEC_OK;
  if (failed) raise_failure(self, seq); /* under the lock, as on the checked path */
  cxlock_release_held(self->lock);
  if (failed) return NULL;
  Py_RETURN_TRUE;
}

static PyObject* fastcall_disable(FastCall* self, PyObject* unused) {
  self->enabled = 0;
  Py_RETURN_NONE;
}

static PyObject* fastcall_get_calls(FastCall* self, void* unused) {
  return PyLong_FromUnsignedLongLong(self->calls);
}

static PyObject* fastcall_get_enabled(FastCall* self, void* unused) {
  return PyBool_FromLong(self->enabled);
}

static PyMethodDef fastcall_methods[] = {
    {"disable", (PyCFunction)fastcall_disable, METH_NOARGS,
     "Decline every later call (the engine is poisoned or its window unmapped)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fastcall_getset[] = {
    {"calls", (getter)fastcall_get_calls, NULL, "collectives run through this object", NULL},
    {"enabled", (getter)fastcall_get_enabled, NULL, "False once disable() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(fastcall_doc,
"FastCall(run, plan, window, call, result, state, heap_lo, heap_hi, dtype, in_count,\n"
"         out_count, op, lock, on_failure, keep, layout, unit, root)\n\n"
"One prepared collective call (see the comment in native/python/cx_fastpath.c). The first six\n"
"are addresses: cx_exec_run, the cx_exec_plan, cx_exec_window, cx_exec_call and cx_exec_result\n"
"structs, and the engine's unsigned long long [seq, epoch]; heap_lo/heap_hi bound this rank's\n"
"window heap, whose arrays the call uses in place. layout: same, disjoint, in_at, out_at,\n"
"in_only or out_only; out_count: None for the layouts without an out. op: the op name, or\n"
"None (allgather, broadcast).\n"
"fc(x, out, op[, root]) -> True when it ran, False when x/out/op/root do not match (nothing\n"
"touched).");

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectx._fastpath.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_dealloc = (destructor)fastcall_dealloc,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)fastcall_traverse,
    .tp_clear = (inquiry)fastcall_clear,
    .tp_free = PyObject_GC_Del,
    .tp_doc = fastcall_doc,
    .tp_methods = fastcall_methods,
    .tp_getset = fastcall_getset,
    .tp_init = (initproc)fastcall_init,
    .tp_new = fastcall_new,
};

static PyMethodDef methods[] = {
    {"reduce", (PyCFunction)(void (*)(void))fast_reduce, METH_FASTCALL, reduce_doc},
    {"copy", (PyCFunction)(void (*)(void))fast_copy, METH_FASTCALL, copy_doc},
    {"bind", bind, METH_VARARGS, bind_doc},
    {"schedule_arrays", cx_schedule_arrays, METH_O, CX_SCHEDULE_ARRAYS_DOC},
    {"word_arrays", cx_word_arrays, METH_VARARGS, CX_WORD_ARRAYS_DOC},
    {"lower_words", (PyCFunction)(void (*)(void))cx_lower_words, METH_FASTCALL,
     CX_LOWER_WORDS_DOC},
    {"max_flow", (PyCFunction)(void (*)(void))cx_max_flow, METH_FASTCALL, CX_MAX_FLOW_DOC},
    {"paths_ok", (PyCFunction)(void (*)(void))cx_paths_ok, METH_FASTCALL, CX_PATHS_OK_DOC},
    {"min_arborescence", (PyCFunction)(void (*)(void))cx_min_arborescence, METH_FASTCALL,
     CX_MIN_ARBORESCENCE_DOC},
    {"grown_together", (PyCFunction)(void (*)(void))cx_grown_together, METH_FASTCALL,
     CX_GROWN_TOGETHER_DOC},
    {"shallower", (PyCFunction)(void (*)(void))cx_shallower, METH_FASTCALL, CX_SHALLOWER_DOC},
    {"shape_groups", (PyCFunction)(void (*)(void))cx_shape_groups, METH_FASTCALL,
     CX_SHAPE_GROUPS_DOC},
    {"pack_words", cx_pack_words, METH_VARARGS, CX_PACK_WORDS_DOC},
    {"unpack_words", cx_unpack_words, METH_VARARGS, CX_UNPACK_WORDS_DOC},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "collectx._fastpath",
    "Compiled fast path of collectx._native.reduce/copy (see native/python/cx_fastpath.c).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
  import_array();
  if (PyType_Ready(&FastCallType) < 0 || PyType_Ready(&CxLockType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m != NULL && (PyModule_AddIntConstant(m, "API", CX_FASTPATH_API) < 0 ||
                    PyModule_AddIntConstant(m, "FASTCALL_API", CX_FASTCALL_API) < 0 ||
                    PyModule_AddObjectRef(m, "FastCall", (PyObject*)&FastCallType) < 0 ||
                    PyModule_AddObjectRef(m, "Lock", (PyObject*)&CxLockType) < 0))
    Py_CLEAR(m);
  return m;
}
