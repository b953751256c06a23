"""The native library (libcollectx) behind cffi, and numpy-level copy/reduce/scale on top of it.

The library is loaded in cffi ABI mode (``ffi.dlopen``), so one ``.so`` serves every interpreter
and :func:`load` is the one loader (``(ffi, lib, path)``; the runtime uses the same ``ffi``/``lib``).
Its C declarations come from the one public header, ``collectx.h``, with preprocessor lines and
the ``extern "C"`` guard removed.

``reduce`` and ``copy`` run the common call (plain C-contiguous arrays) through a fast path: the
compiled extension ``collectx._fastpath`` (native/python/cx_fastpath.c, built with the library
when Python headers and numpy are found) is handed the loaded library's function addresses and
costs a fraction of a microsecond per call; without it, cffi calls with cheap checks serve (a
few microseconds). Anything unusual goes to the fully checked path, which raises typed errors.

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
from .errors import (ArgumentError, DTypeError, Interrupted, NativeError, NativeUnavailable,
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
           -9: ("CX_ERR_INTERNAL", NativeError), -10: ("CX_ERR_INTERRUPTED", Interrupted)}


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
    if not a.dtype.isnative:
        raise DTypeError(f"dtype {a.dtype.str} is byte-swapped; the kernels take native byte "
                         f"order: convert with a.astype(a.dtype.newbyteorder('='))")
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


# ---- fast paths --------------------------------------------------------------------------------
# reduce() and copy() first try a fast path that recognises the common call (plain C-contiguous
# ndarrays of one supported dtype) with cheap reads only. For anything else it returns False
# having touched nothing, and the checked path below raises the precise error. Overlap is left to
# the library, which refuses it with CX_ERR_ARG before writing anything.
# Two implementations, chosen once when the library is loaded: the compiled module
# collectx._fastpath (native/python/cx_fastpath.c: one C call, a few flag reads per array) when
# it was built, else cffi calls with cheap checks (a libffi call and an ffi.from_buffer per array,
# several microseconds on a slow core). An older library without the overlap checks gets neither.
_FASTPATH_API = 1  # the contract version collectx._fastpath must declare (its API constant)
_CX_ERR_ARG = -3
_AVG = OPS["avg"]
_BUFFER_ERRORS = (TypeError, ValueError, BufferError)
_fast_kind = None  # "compiled", "cffi" or "none" once bound
_cffi_entry = None  # (backend from_buffer, char[] type, lib) for the cffi fast path


def _compiled_module(lib_dir: Path | None = None):
    """collectx._fastpath when it is built for this interpreter and speaks our contract.

    It is looked for in this package first, then next to the loaded libcollectx (``lib_dir``):
    a source checkout imports collectx from its tree while ``pip install .`` put the compiled
    module, like the library, into site-packages.
    """
    try:
        from . import _fastpath
    except ImportError:
        _fastpath = _module_beside(lib_dir or load()[2].parent)
    return _fastpath if getattr(_fastpath, "API", None) == _FASTPATH_API else None


@functools.lru_cache(maxsize=None)
def compiled_helper(name: str):
    """``collectx._fastpath.<name>`` (one of the planner's loops in C), or None when the
    compiled module or that function is missing: looked up once per process and name (a
    failed import searches the file system every time), so callers fall back to Python."""
    try:
        module = _compiled_module()
    except Exception:  # no compiled module, or no library to find it beside
        return None
    return getattr(module, name, None)


def _module_beside(folder: Path):
    import importlib.machinery
    import importlib.util

    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"_fastpath{suffix}"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"{__package__}._fastpath", path)
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except ImportError:
                return None
            sys.modules[spec.name] = module
            return module
    return None


def _bind_fast_paths(compiled: bool = True) -> str:
    """Bind ``_fast_reduce``/``_fast_copy`` to the loaded library; returns which kind is in use.

    ``compiled=False`` skips collectx._fastpath (the tests use it to run the cffi fallback).
    """
    global _fast_reduce, _fast_copy, _fast_kind, _cffi_entry
    ffi, lib, lib_path = load()
    probe = ffi.new("char[16]")
    module = _compiled_module(lib_path.parent) if compiled else None
    if lib.cx_copy(probe, probe + 4, 8) != _CX_ERR_ARG:
        _fast_reduce, _fast_copy, _fast_kind = _decline, _decline, "none"
    elif module is not None:
        def address(name):
            return int(ffi.cast("uintptr_t", getattr(lib, name)))
        module.bind(address("cx_reduce"), address("cx_copy"), address("cx_scale"),
                    address("cx_dtype_bytes"), DTYPES, OPS, check_rc)
        _fast_reduce, _fast_copy, _fast_kind = module.reduce, module.copy, "compiled"
    else:
        _cffi_entry = (ffi._backend.from_buffer, ffi.BCharA, lib)  # from_buffer minus a wrapper
        _fast_reduce, _fast_copy, _fast_kind = _reduce_cffi, _copy_cffi, "cffi"
    return _fast_kind


def _decline(*_args) -> bool:
    return False


def _reduce_first_call(dst, srcs, op, dtype) -> bool:
    _bind_fast_paths()
    return _fast_reduce(dst, srcs, op, dtype)


def _copy_first_call(dst, src) -> bool:
    _bind_fast_paths()
    return _fast_copy(dst, src)


# Rebound by _bind_fast_paths on the first call (loading the library is not done at import).
_fast_reduce = _reduce_first_call
_fast_copy = _copy_first_call


def _reduce_cffi(dst, srcs, op, dtype) -> bool:
    """The cffi fast path of ``reduce``: False means "use the checked path"."""
    if dtype is not None or type(dst) is not np.ndarray or type(srcs) is not list or not srcs:
        return False
    dt = dst.dtype
    code, op_code = _CODE_OF_DTYPE.get(dt), OPS.get(op) if type(op) is str else None
    if code is None or op_code is None:
        return False
    from_buffer, char_array, lib = _cffi_entry
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
    if lib.cx_reduce(out, bufs, k, n, code, op_code):
        return False  # refused before writing (an overlap): the checked path names it
    if op_code == _AVG and k > 1:
        check_rc(lib.cx_scale(out, n, code, 1.0 / k), "cx_scale")
    return True


def _copy_cffi(dst, src) -> bool:
    """The cffi fast path of ``copy``: False means "use the checked path"."""
    if type(dst) is not np.ndarray or type(src) is not np.ndarray or src.dtype != dst.dtype \
            or dst.dtype.hasobject:
        return False
    from_buffer, char_array, lib = _cffi_entry
    try:
        out, buf = from_buffer(char_array, dst, True), from_buffer(char_array, src, False)
    except _BUFFER_ERRORS:
        return False
    # A refusal (partial overlap) wrote nothing: the checked path names it.
    return len(out) == len(buf) and lib.cx_copy(out, buf, len(out)) == 0


# ---- numpy-level kernels -----------------------------------------------------------------------
def copy(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Copy ``src`` into ``dst`` (same dtype and length, no partial overlap); returns ``dst``.

    >>> copy(np.zeros(3, np.int32), np.arange(3, dtype=np.int32))
    array([0, 1, 2], dtype=int32)
    """
    if _fast_copy(dst, src):
        return dst
    dst, src = _check_output(dst), _as_array(src, "src")
    if dst.dtype.hasobject:
        raise DTypeError(f"dst is an array of {dst.dtype}: object references cannot be copied "
                         f"as bytes; use numpy.copyto")
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
        Unsupported dtype (bool, complex, ...), byte-swapped arrays, or an unsupported op.

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
    if _fast_reduce(dst, srcs, op, dtype):
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
    (bool), ``cuda_archs``, ``cuda_devices`` (int), ``library`` (path) and ``fast_path``
    (``"compiled"`` when collectx._fastpath serves reduce/copy, ``"cffi"`` without it).

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
    info["fast_path"] = _fast_kind or _bind_fast_paths()
    return info
