"""The native library (libcollectx) behind cffi, and numpy-level copy/reduce/scale on top of it.

The library is loaded in cffi ABI mode (``ffi.dlopen``): nothing is compiled at install time
for Python, and one ``.so`` serves every interpreter. Its C declarations come from the one
public header, ``collectx.h``, with preprocessor lines and the ``extern "C"`` guard removed.

Every entry point returns an ``int`` status; :func:`check_rc` turns failures into typed errors.
The numpy-level functions check everything first and touch nothing on bad input.

>>> import numpy as np
>>> a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
>>> reduce(np.empty_like(a), [a, b], op="sum")
array([1., 2., 3., 4.], dtype=float32)
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np

from .config import get_config
from .errors import (ArgumentError, DTypeError, NativeError, NativeUnavailable,
                     PeerFailure, Timeout)

_LIB_NAMES = ("libcollectx.so", "libcollectx.dylib")
_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent

# Mirrors the cx_dtype / cx_op enums of collectx.h (checked against the library in the tests).
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "int64": 3, "float16": 4, "bfloat16": 5,
          "float32": 6, "float64": 7}
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
_STATUS = {-1: ("CX_ERR_DTYPE", DTypeError), -2: ("CX_ERR_OP", DTypeError),
           -3: ("CX_ERR_ARG", ArgumentError), -4: ("CX_ERR_CUDA", NativeError),
           -5: ("CX_ERR_NO_CUDA", NativeError), -6: ("CX_ERR_NOMEM", NativeError),
           -7: ("CX_ERR_TIMEOUT", Timeout), -8: ("CX_ERR_PEER", PeerFailure),
           -9: ("CX_ERR_INTERNAL", NativeError)}


# ---- loading ---------------------------------------------------------------------------------
def candidate_paths(explicit: str | None = None) -> list[Path]:
    """Where libcollectx is looked for, in order.

    ``explicit`` (``COLLECTX_NATIVE_LIB``) first; then next to this module; then ``collectx/``
    under every ``sys.path`` entry (a source checkout finds the library ``pip install .`` put
    into site-packages); then the build folders of a source checkout.
    """
    found = [Path(explicit)] if explicit else []
    dirs = [_HERE] + [Path(p or ".") / "collectx" for p in sys.path]
    found += [d / name for d in dirs for name in _LIB_NAMES]
    found += sorted((_REPO / "build").glob("**/libcollectx.*"))
    return list(dict.fromkeys(found))


def _cdef_text(header: Path) -> str:
    """collectx.h without preprocessor lines and without the ``extern "C"`` guard blocks."""
    keep, in_guard = [], False
    for line in header.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#ifdef __cplusplus"):
            in_guard = True
        elif in_guard:
            in_guard = not stripped.startswith("#endif")
        elif not stripped.startswith("#"):
            keep.append(line)
    return "\n".join(keep)


def _find_header(lib_path: Path) -> Path:
    for p in (lib_path.parent / "collectx.h", _HERE / "collectx.h",
              _REPO / "native" / "include" / "collectx.h"):
        if p.is_file():
            return p
    raise NativeUnavailable(f"found {lib_path} but no collectx.h next to it or in "
                            f"{_REPO / 'native' / 'include'}; reinstall with `pip install .`")


@functools.lru_cache(maxsize=1)
def load():
    """Load libcollectx once; returns ``(ffi, lib, path)``.

    Raises
    ------
    NativeUnavailable
        No library was found, or the one found could not be loaded.
    """
    import cffi
    explicit = get_config().native_lib
    paths = candidate_paths(explicit)
    if explicit and not Path(explicit).is_file():
        raise NativeUnavailable(f"COLLECTX_NATIVE_LIB={explicit!r} is not a file; point it at a "
                                f"built libcollectx.so or unset it")
    lib_path = next((p for p in paths if p.is_file()), None)
    if lib_path is None:
        raise NativeUnavailable(
            "libcollectx was not found (looked next to collectx/_native.py, in collectx/ under "
            "sys.path and in build/); install with `pip install .` or run the dev build: "
            "`cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2`")
    ffi = cffi.FFI()
    ffi.cdef(_cdef_text(_find_header(lib_path)))
    try:
        lib = ffi.dlopen(str(lib_path))
    except OSError as exc:
        raise NativeUnavailable(f"could not load {lib_path}: {exc}; rebuild it with "
                                f"`pip install .` or the cmake dev build") from exc
    return ffi, lib, lib_path


def __getattr__(name):
    # `_native.ffi` / `_native.lib` load the library on first use, so importing never fails.
    if name in ("ffi", "lib"):
        ffi, lib, _ = load()
        return ffi if name == "ffi" else lib
    raise AttributeError(f"module 'collectx._native' has no attribute {name!r}")


def check_rc(rc: int, what: str = "native call") -> int:
    """Raise the collectx error for a failed native status; return ``rc`` when it is >= 0.

    >>> check_rc(0)
    0
    >>> check_rc(-3, "cx_reduce")
    Traceback (most recent call last):
    ...
    collectx.errors.ArgumentError: cx_reduce failed with CX_ERR_ARG (-3): the library refused its arguments
    """
    if rc >= 0:
        return rc
    name, cls = _STATUS.get(rc, ("unknown status", NativeError))
    hint = {ArgumentError: "the library refused its arguments",
            DTypeError: "unsupported dtype or op code",
            Timeout: "a peer did not answer before the deadline",
            PeerFailure: "a peer failed or aborted"}.get(cls, "see the library's status codes")
    message = f"{what} failed with {name} ({rc}): {hint}"
    raise cls(message, code=rc) if issubclass(cls, NativeError) else cls(message)


# ---- dtypes and pointers -----------------------------------------------------------------------
def dtype_code(dtype) -> int:
    """The ``cx_dtype`` code of a numpy dtype, dtype name, or torch dtype.

    ``bfloat16`` is accepted as a name, as ``ml_dtypes.bfloat16`` and as ``torch.bfloat16``.

    >>> dtype_code(np.float32), dtype_code("bfloat16")
    (6, 5)
    >>> dtype_code(np.bool_)
    Traceback (most recent call last):
    ...
    collectx.errors.DTypeError: dtype bool is not supported; expected one of int8, uint8, int32, int64, float16, bfloat16, float32, float64
    """
    name = _dtype_name(dtype)
    if name not in DTYPES:
        raise DTypeError(f"dtype {name} is not supported; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _dtype_name(dtype) -> str:
    text = str(dtype)
    if text.startswith("torch."):  # torch dtypes print as torch.float16, torch.bfloat16, ...
        return text[len("torch."):]
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    try:
        return np.dtype(dtype).name
    except TypeError:
        return text


def ptr(array):
    """A ``void*`` to the first byte of a numpy array (or any object with ``__array_interface__``).

    >>> ptr(np.zeros(2)) != load()[0].NULL
    True
    """
    ffi = load()[0]
    address = array.__array_interface__["data"][0]
    return ffi.cast("void *", address)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _buffer(ffi, a: np.ndarray):
    """Zero-copy ``char[]`` over an array's bytes (cheaper than reading its address)."""
    try:
        return ffi.from_buffer(a)
    except (TypeError, ValueError, BufferError):
        # numpy cannot export buffers of user dtypes (ml_dtypes.bfloat16): view the bytes.
        return ffi.from_buffer(a.reshape(-1).view(np.uint8))


# Fast path for the common numpy dtypes; dtype_code handles the rest (and the errors).
_CODE_OF_DTYPE = {np.dtype(name): code for name, code in DTYPES.items() if name != "bfloat16"}


def _array_code(a: np.ndarray, override: str | None) -> int:
    if override is None:
        code = _CODE_OF_DTYPE.get(a.dtype)
        return dtype_code(a.dtype) if code is None else code
    code = dtype_code(override)
    if a.dtype.itemsize != np.dtype(np.uint16 if override == "bfloat16" else override).itemsize:
        raise DTypeError(f"dtype={override!r} was asked for arrays of {a.dtype}: the element "
                         f"sizes differ; pass uint16 arrays for bfloat16 data")
    return code


# ---- argument checks (all before any native call, so bad input touches nothing) ---------------
def _as_array(x, role) -> np.ndarray:
    """``x`` if it is a C-contiguous ndarray; ``role`` (str or callable) names it in errors."""
    if isinstance(x, np.ndarray) and x.flags.c_contiguous:
        return x
    role = role() if callable(role) else role
    if not isinstance(x, np.ndarray):
        raise ArgumentError(f"{role} is a {type(x).__name__}; expected a numpy.ndarray "
                            f"(convert with numpy.asarray)")
    raise ArgumentError(f"{role} is not C-contiguous (strides {x.strides}); pass "
                        f"numpy.ascontiguousarray({role}) or a contiguous view")


def _check_output(dst, role: str = "dst") -> np.ndarray:
    dst = _as_array(dst, role)
    if not dst.flags.writeable:
        raise ArgumentError(f"{role} is read-only; pass a writable array (e.g. a copy)")
    return dst


def _overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    if a.nbytes == 0 or b.nbytes == 0:
        return False
    pa, pb = _address(a), _address(b)
    return pa < pb + b.nbytes and pb < pa + a.nbytes


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return _address(a) == _address(b) and a.nbytes == b.nbytes


def _source_buffers(ffi, dst: np.ndarray, out, srcs) -> list:
    """Check ``srcs`` against ``dst`` (whose buffer is ``out``) and return their buffers.

    Overlap is tested on the cffi pointers: cheaper than reading each array's address.
    """
    if isinstance(srcs, np.ndarray) or not hasattr(srcs, "__len__"):
        raise ArgumentError("srcs must be a list of arrays; wrap a single array as [a]")
    if not len(srcs):
        raise ArgumentError("srcs is empty; expected at least one source array (k >= 1)")
    nbytes, bufs = dst.nbytes, []
    for i, s in enumerate(srcs):
        _as_array(s, lambda: f"srcs[{i}]")
        if s.dtype != dst.dtype or s.size != dst.size:
            raise ArgumentError(f"srcs[{i}] is {s.size} x {s.dtype} but dst is {dst.size} x "
                                f"{dst.dtype}; every source must match dst in dtype and length")
        buf = _buffer(ffi, s)
        if nbytes and buf < out + nbytes and out < buf + nbytes and not (i == 0 and buf == out):
            raise ArgumentError(f"dst overlaps srcs[{i}]; only srcs[0] may be dst itself "
                                f"(in-place accumulate). Use a separate output array")
        bufs.append(buf)
    return bufs


def _op_code(op: str) -> int:
    code = OPS.get(op) if isinstance(op, str) else None
    if code is None:
        raise DTypeError(f"op {op!r} is not supported; expected one of {', '.join(OPS)}")
    return code


# ---- fast path -------------------------------------------------------------------------------
# The common call (plain C-contiguous ndarrays of a numpy dtype) should cost little more than
# the cffi call itself, so it is checked with cheap reads only: cffi's backend from_buffer (one
# C call per array) refuses non-C-contiguous arrays and, for dst, read-only ones; equal byte
# lengths of equal dtypes mean equal element counts; the library refuses overlapping arguments
# (CX_ERR_ARG, before writing anything). Whenever anything is off the fast path returns False
# having touched nothing, and the fully checked path below raises the precise error.
_CX_ERR_ARG = -3
_AVG = OPS["avg"]
_OP_CODES = dict(OPS)
_BUFFER_ERRORS = (TypeError, ValueError, BufferError)
_fast = None  # (backend from_buffer, char[] type, lib); False when the library is too old


def _fast_entry():
    global _fast
    ffi, lib, _ = load()
    probe = ffi.new("char[16]")
    if lib.cx_copy(probe, probe + 4, 8) != _CX_ERR_ARG:
        _fast = False  # an older library without the overlap checks the fast path relies on
    else:
        _fast = (ffi._backend.from_buffer, ffi.BCharA, lib)  # ffi.from_buffer minus a wrapper
    return _fast


def _reduce_fast(dst: np.ndarray, srcs: list, op: str) -> bool:
    """Run ``reduce`` on plain arrays with cheap checks; False means "use the checked path"."""
    dt = dst.dtype
    code, op_code = _CODE_OF_DTYPE.get(dt), _OP_CODES.get(op)
    entry = _fast if _fast is not None else _fast_entry()
    if code is None or op_code is None or not entry or not srcs:
        return False
    from_buffer, char_array, lib = entry
    try:
        out = from_buffer(char_array, dst, True)
        nbytes, bufs = len(out), []
        for s in srcs:
            # `is` first: arrays of one builtin dtype share the dtype object (cheaper than ==).
            if type(s) is not np.ndarray or (s.dtype is not dt and s.dtype != dt):
                return False
            buf = from_buffer(char_array, s, False)
            if len(buf) != nbytes:
                return False
            bufs.append(buf)
    except _BUFFER_ERRORS:
        return False
    k, n = len(bufs), dst.size
    rc = lib.cx_reduce(out, bufs, k, n, code, op_code)
    if rc:
        if rc == _CX_ERR_ARG:
            return False  # an overlap: nothing was written, the checked path names it
        check_rc(rc, "cx_reduce")
    if op_code == _AVG and k > 1:
        check_rc(lib.cx_scale(out, n, code, 1.0 / k), "cx_scale")
    return True


def _copy_fast(dst: np.ndarray, src: np.ndarray) -> bool:
    """``copy`` on plain arrays with cheap checks; False means "use the checked path"."""
    entry = _fast if _fast is not None else _fast_entry()
    if not entry or src.dtype != dst.dtype:
        return False
    from_buffer, char_array, lib = entry
    try:
        out, buf = from_buffer(char_array, dst, True), from_buffer(char_array, src, False)
    except _BUFFER_ERRORS:
        return False
    if len(out) != len(buf):
        return False
    rc = lib.cx_copy(out, buf, len(out))
    if rc:
        if rc == _CX_ERR_ARG:
            return False  # partial overlap: nothing was written, the checked path names it
        check_rc(rc, "cx_copy")
    return True


# ---- numpy-level kernels -----------------------------------------------------------------------
def copy(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Copy ``src`` into ``dst`` (same dtype and length, no partial overlap); returns ``dst``.

    >>> copy(np.zeros(3, np.int32), np.arange(3, dtype=np.int32))
    array([0, 1, 2], dtype=int32)
    """
    if type(dst) is np.ndarray and type(src) is np.ndarray and _copy_fast(dst, src):
        return dst
    dst, src = _check_output(dst), _as_array(src, "src")
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ArgumentError(f"src is {src.size} x {src.dtype} but dst is {dst.size} x "
                            f"{dst.dtype}; copy needs the same dtype and length")
    if _overlaps(dst, src) and not _same_memory(dst, src):
        raise ArgumentError("dst and src overlap partially; copy through a temporary array")
    ffi, lib, _ = load()
    check_rc(lib.cx_copy(_buffer(ffi, dst), _buffer(ffi, src), dst.nbytes), "cx_copy")
    return dst


def reduce(dst: np.ndarray, srcs, op: str = "sum", *, dtype: str | None = None) -> np.ndarray:
    """``dst = srcs[0] op srcs[1] op ...`` elementwise, left to right, in one pass; returns ``dst``.

    Parameters
    ----------
    dst : numpy.ndarray
        Writable, C-contiguous output. It may be ``srcs[0]`` itself (accumulate in place); any
        other overlap with a source is refused.
    srcs : list of numpy.ndarray
        ``k >= 1`` C-contiguous arrays of dst's dtype and length (``k == 1`` copies).
    op : {"sum", "prod", "min", "max", "avg"}
        ``avg`` sums, then divides by ``k`` (integers truncate toward zero, like NCCL).
    dtype : str, optional
        Reinterpret the arrays, e.g. ``"bfloat16"`` for uint16 arrays holding bfloat16 bits.

    Returns
    -------
    numpy.ndarray
        ``dst``.

    Raises
    ------
    ArgumentError
        Mismatched dtypes or lengths, non-contiguous or read-only dst, overlap, ``k < 1``.
    DTypeError
        Unsupported dtype (bool, complex, ...) or op.

    Notes
    -----
    Integers wrap around like numpy; float16/bfloat16 accumulate in float32 and round once;
    float32/float64 follow the left-to-right order exactly. O(k * n), memory bound.

    Examples
    --------
    >>> a = np.array([1, 5, 3], dtype=np.int8)
    >>> reduce(a, [a, np.array([4, 2, 127], dtype=np.int8)], op="max")
    array([  4,   5, 127], dtype=int8)
    >>> reduce(np.empty(2), [np.array([1., 2.]), np.array([3., 5.])], op="avg")
    array([2. , 3.5])
    """
    if dtype is None and type(dst) is np.ndarray and type(srcs) is list and type(op) is str:
        if _reduce_fast(dst, srcs, op):
            return dst
    dst = _check_output(dst)
    code, op_code = _array_code(dst, dtype), _op_code(op)
    ffi, lib, _ = load()
    out = _buffer(ffi, dst)
    bufs = _source_buffers(ffi, dst, out, srcs)
    check_rc(lib.cx_reduce(out, bufs, len(bufs), dst.size, code, op_code), "cx_reduce")
    if op == "avg" and len(bufs) > 1:
        check_rc(lib.cx_scale(out, dst.size, code, 1.0 / len(bufs)), "cx_scale")
    return dst


def scale(dst: np.ndarray, factor: float, *, dtype: str | None = None) -> np.ndarray:
    """``dst *= factor`` in place; for integers factor must be ``1/d`` and ``dst //= d``
    truncating toward zero (NCCL's integer average). Returns ``dst``.

    >>> scale(np.array([1., 3.], dtype=np.float32), 0.5)
    array([0.5, 1.5], dtype=float32)
    >>> scale(np.array([7, -7], dtype=np.int32), 1 / 2)
    array([ 3, -3], dtype=int32)
    """
    dst = _check_output(dst)
    code = _array_code(dst, dtype)
    factor = float(factor)
    if np.issubdtype(dst.dtype, np.integer) and dtype is None:
        divisor = round(1.0 / factor) if factor > 0 else 0
        if divisor < 1 or abs(1.0 / factor - divisor) > 1e-6 * divisor:
            raise ArgumentError(f"factor {factor} for {dst.dtype}: integer arrays can only be "
                                f"divided by a whole number d (factor = 1/d)")
    ffi, lib, _ = load()
    check_rc(lib.cx_scale(_buffer(ffi, dst), dst.size, code, factor), "cx_scale")
    return dst


# ---- build facts ---------------------------------------------------------------------------------
def cuda_available() -> bool:
    """True when libcollectx has CUDA objects and sees at least one device; never raises."""
    try:
        return load()[1].cx_cuda_available() > 0
    except NativeUnavailable:
        return False


def build_info() -> dict:
    """What the loaded library was built with and what it found at run time.

    Keys: ``version``, ``compiler``, ``isa`` (vector ISA chosen for this CPU), ``cuda_objects``
    (bool), ``cuda_archs``, ``cuda_devices`` (int) and ``library`` (path).

    >>> sorted(build_info())[:3]
    ['compiler', 'cuda_archs', 'cuda_devices']
    """
    ffi, lib, path = load()
    buf = ffi.new("char[]", 512)
    check_rc(lib.cx_build_info(buf, len(buf)), "cx_build_info")
    info = dict(item.split("=", 1) for item in ffi.string(buf).decode().split(";"))
    info["cuda_objects"] = info.get("cuda_objects") == "1"
    info["cuda_devices"] = max(lib.cx_cuda_available(), 0)
    info["library"] = str(path)
    return info
