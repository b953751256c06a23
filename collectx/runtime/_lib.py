"""The native library as the runtime sees it: ``ffi`` and ``lib`` with the executor entry points.

collectx/_native.py is the library's one loader; the runtime uses it when it is importable and
falls back to reading collectx.h itself (same rules: preprocessor and extern "C" lines dropped),
so the runtime does not depend on the loader's import order.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..errors import NativeUnavailable


@functools.lru_cache(maxsize=1)
def native():
    """``(ffi, lib)`` of libcollectx, with the CPU executor declared."""
    try:
        from .. import _native
        if hasattr(_native.lib, "cx_exec_run"):
            return _native.ffi, _native.lib
    except ImportError:
        pass
    except Exception as e:  # the loader itself failed: report why
        raise NativeUnavailable(f"collectx native library failed to load: {e}") from e
    return _load_here()


def _load_here():
    import cffi
    pkg = Path(__file__).resolve().parent.parent
    header = _find(pkg, "collectx.h", [pkg / "collectx.h",
                                       pkg.parent / "native" / "include" / "collectx.h"])
    so = _find(pkg, "libcollectx.so", [pkg / "libcollectx.so"])
    ffi = cffi.FFI()
    ffi.cdef(_cdef_text(header.read_text()))
    return ffi, ffi.dlopen(os.fspath(so))


def _find(pkg: Path, what: str, candidates: list[Path]) -> Path:
    for c in candidates:
        if c.exists():
            return c
    raise NativeUnavailable(f"{what} not found (looked in {', '.join(map(str, candidates))}); "
                            f"build it: cmake -S . -B build && cmake --build build -j2, or pip "
                            f"install the package")


def _cdef_text(text: str) -> str:
    # Preprocessor lines and the extern "C" guard go; the guard's closing brace is the only bare
    # "}" line (struct and enum bodies close with "} name;").
    drop = ('extern "C" {', "}")
    return "\n".join(line for line in text.splitlines()
                     if not line.lstrip().startswith("#") and line.strip() not in drop)
