"""Buffers the sweep runs on: numpy arrays, or torch tensors where numpy has no dtype.

Communicators that own memory (collectx's shared windows, torch's devices) allocate through their
``empty``; the sweep only needs to write known values in and read results out, which the
functions here do for either kind.

>>> buf = alloc(None, 3, "int32")
>>> write(buf, [1, 2, 3]); read(buf).tolist()
[1.0, 2.0, 3.0]
>>> fill_tiled(buf, np.array([7.0, 8.0]), start=1); buf.tolist()
[8, 7, 8]
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, DTypeError
from .collectives import tile


def _torch():
    try:
        import torch
    except ImportError:
        raise DTypeError("bfloat16 and GPU buffers need torch (numpy has no bfloat16); install "
                         "it with `pip install collectx[torch]`, or pick another -d / --device")\
            from None
    return torch


def alloc(comm, n: int, dtype: str, device: str = "cpu"):
    """An ``n``-element buffer of ``dtype``: on the current GPU (torch) for ``device="cuda"``,
    else from ``comm.empty`` when the communicator has one, else numpy (torch for bfloat16)."""
    return alloc_where(comm, n, dtype, device)[0]


def alloc_where(comm, n: int, dtype: str, device: str = "cpu") -> tuple[object, str]:
    """:func:`alloc`'s buffer and where it came from: ``"device"``, ``"comm.empty"`` (the
    communicator's own memory: collectx's shared window) or ``"host"`` (ordinary memory). A
    communicator whose ``empty`` hands out ordinary memory says so in ``empty_kind``.

    >>> alloc_where(None, 2, "float32")[1]
    'host'
    """
    if device == "cuda":
        torch = _torch()
        return torch.empty(n, dtype=getattr(torch, dtype), device="cuda"), "device"
    maker = getattr(comm, "empty", None)
    if maker is not None:
        try:
            return maker((n,), dtype), getattr(comm, "empty_kind", "comm.empty")
        except (TypeError, DTypeError, ArgumentError):
            # No window memory for this dtype, or the window is full: ordinary memory works
            # too (the runtime stages it through the window).
            pass
    if dtype == "bfloat16":
        torch = _torch()
        return torch.empty(n, dtype=torch.bfloat16), "host"
    return np.empty(n, dtype=dtype), "host"


def read(buf) -> np.ndarray:
    """A float64 numpy copy of ``buf`` (numpy array or torch tensor, any device)."""
    if isinstance(buf, np.ndarray):
        return buf.astype(np.float64)
    return buf.detach().to("cpu").double().numpy()


def comparable(buf) -> np.ndarray:
    """``buf`` as numpy without a copy where possible (torch tensors: float64 on the host)."""
    return buf if isinstance(buf, np.ndarray) else read(buf)


def write(buf, values) -> None:
    """Copy ``values`` (any array-like) into ``buf``, converting to its dtype."""
    values = np.asarray(values, dtype=np.float64)
    if isinstance(buf, np.ndarray):
        buf[...] = values.astype(buf.dtype)
        return
    torch = _torch()
    buf.copy_(torch.from_numpy(values).to(buf.dtype))


def fill_tiled(buf, pattern: np.ndarray, start: int = 0) -> None:
    """Fill ``buf`` with the endless repetition of ``pattern`` from element ``start``, in place."""
    n = int(buf.shape[0])
    if isinstance(buf, np.ndarray):
        tile(pattern, start, n, out=buf)
        return
    torch = _torch()
    buf.copy_(torch.from_numpy(tile(pattern, start, n, np.float32)).to(buf.dtype))


def fill_garbage(buf) -> None:
    """Overwrite ``buf`` with a value no collective produces here, so stale output is wrong."""
    value = 251 if "uint" in str(buf.dtype) else -3
    if isinstance(buf, np.ndarray):
        buf.fill(value)
    else:
        buf.fill_(value)


def itemsize(dtype: str) -> int:
    """Bytes per element of a canonical dtype name (bfloat16 included)."""
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def wrong_count(got: np.ndarray, ref: np.ndarray, dtype: str, op: str) -> int:
    """Elements of ``got`` that differ from ``ref``; exact except for ``avg`` (a division).

    >>> wrong_count(np.array([1.0, 2.0, 5.0]), np.array([1.0, 2.0, 3.0]), "float32", "sum")
    1
    """
    if got.shape != ref.shape:
        return int(max(got.size, ref.size))
    if op != "avg":
        return int(np.count_nonzero(got != ref))
    expected, got = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
    if dtype.startswith(("int", "uint")):
        tol = 1.0
    else:
        tol = 4 * (2.0 ** -7 if dtype == "bfloat16" else float(np.finfo(dtype).eps))
        tol = tol * np.maximum(np.abs(expected), 1.0)
    return int(np.count_nonzero(~(np.abs(got - expected) <= tol)))
