"""What the communicator accepts as a buffer: numpy arrays, torch CPU tensors, DLPack and
buffer-protocol objects, seen as C-contiguous numpy arrays plus a native dtype code.

bfloat16 has no numpy dtype: torch bfloat16 tensors (and ``ml_dtypes.bfloat16`` arrays) are
viewed as uint16 with the ``CX_BFLOAT16`` code, so the kernels still reduce them as bfloat16.

>>> import numpy as np
>>> a, code = as_array(np.ones(3, np.float32), "x")
>>> a.dtype, code == DTYPE_CODES["float32"]
(dtype('float32'), True)
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, DTypeError, integral

DTYPE_CODES = {"int8": 0, "uint8": 1, "int32": 2, "int64": 3, "float16": 4, "bfloat16": 5,
               "float32": 6, "float64": 7}
OP_CODES = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
# dtype -> code by dtype object: dtype.name is slow, and this runs on every call
_CODE_OF = {np.dtype(n): c for n, c in DTYPE_CODES.items() if n != "bfloat16"}
_TORCH_BF16 = "torch.bfloat16"


def as_array(x, what: str, writable: bool = False) -> tuple[np.ndarray, int]:
    """``x`` as a 1-D C-contiguous numpy view (no copy) and its dtype code.

    Raises :class:`~collectx.errors.ArgumentError` for non-contiguous or read-only buffers
    (``writable``), :class:`~collectx.errors.DTypeError` for unsupported dtypes.
    """
    if type(x) is np.ndarray and x.flags.c_contiguous and (x.flags.writeable or not writable):
        code = _CODE_OF.get(x.dtype)  # fast path: a plain contiguous numpy array
        if code is not None:
            return (x if x.ndim == 1 else x.reshape(-1)), code
    arr, bf16 = _to_numpy(x, what)
    if not arr.flags.c_contiguous:
        raise ArgumentError(f"{what}: got a non-contiguous array (strides {arr.strides}); "
                            f"expected a C-contiguous buffer; pass np.ascontiguousarray(x) or "
                            f"x.contiguous()")
    if writable and not arr.flags.writeable:
        raise ArgumentError(f"{what}: got a read-only buffer; expected a writable one for the "
                            f"result; pass a copy (x.copy())")
    name = "bfloat16" if bf16 else arr.dtype.name
    if name not in DTYPE_CODES:
        raise DTypeError(f"{what}: dtype {name} is not supported; expected one of "
                         f"{', '.join(DTYPE_CODES)}")
    if not arr.dtype.isnative:   # '>f4' is named float32 too; summed as '<f4' it is garbage
        raise DTypeError(f"{what}: dtype {arr.dtype.str} is byte-swapped; expected native byte "
                         f"order; convert with x.astype(x.dtype.newbyteorder('='))")
    return arr.reshape(-1), DTYPE_CODES[name]


def _to_numpy(x, what: str) -> tuple[np.ndarray, bool]:
    if isinstance(x, np.ndarray):
        if x.dtype.name == "bfloat16":   # ml_dtypes
            return x.view(np.uint16), True
        return x, False
    mod = type(x).__module__
    if mod.startswith("torch"):
        return _torch_to_numpy(x, what)
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x), False
        except (BufferError, TypeError, RuntimeError) as e:
            raise ArgumentError(f"{what}: DLPack export failed ({e}); expected a CPU array") from e
    try:
        return np.asarray(memoryview(x)), False
    except TypeError:
        raise ArgumentError(f"{what}: got {type(x).__name__}; expected a numpy array, a torch "
                            f"CPU tensor, or an object with the buffer protocol or DLPack") from None


def _torch_to_numpy(t, what: str) -> tuple[np.ndarray, bool]:
    import torch
    if t.device.type != "cpu":
        raise ArgumentError(f"{what}: tensor on {t.device}; the CPU communicator takes CPU tensors")
    t = t.detach()
    if str(t.dtype) == _TORCH_BF16:
        return t.view(torch.int16).numpy().view(np.uint16), True
    try:
        return t.numpy(), False
    except TypeError as e:
        raise DTypeError(f"{what}: torch dtype {t.dtype} is not supported; expected one of "
                         f"{', '.join(DTYPE_CODES)}") from e


def empty_like_shape(x, n: int, arr: np.ndarray, code: int):
    """A fresh buffer of ``n`` elements of ``x``'s kind (torch tensor for torch input)."""
    if type(x).__module__.startswith("torch"):
        import torch
        return torch.empty(n, dtype=x.dtype)
    if code == DTYPE_CODES["bfloat16"] and isinstance(x, np.ndarray):
        return np.empty(n, dtype=x.dtype)
    return np.empty(n, dtype=arr.dtype)


def op_code(op: str) -> int:
    """The native code of a reduction op name; ArgumentError for anything else."""
    if op not in OP_CODES:
        raise ArgumentError(f"op={op!r}: expected one of {', '.join(OP_CODES)}")
    return OP_CODES[op]


def check_rank(value, size: int, what: str = "root", other_than: int | None = None) -> int:
    """``value`` (argument ``what``) as an int where it is a rank of a world of ``size``, and not
    ``other_than`` where given (a peer, not this rank): a Python or numpy integer, not a bool.
    Else ArgumentError.

    >>> check_rank(np.int64(1), 2)
    1
    >>> check_rank(True, 2)
    Traceback (most recent call last):
    ...
    collectx.errors.ArgumentError: root=True: expected a rank in 0..1 (an int, not a bool)
    """
    rank = integral(value)
    if rank is None or not 0 <= rank < size or rank == other_than:
        which = "a rank" if other_than is None else "another rank"
        this = "" if other_than is None else f"not this rank, {other_than}; "
        raise ArgumentError(f"{what}={value!r}: expected {which} in 0..{size - 1} "
                            f"({this}an int, not a bool)")
    return rank


def check_world(rank, size) -> tuple[int, int]:
    """``(rank, size)`` as ints where ``0 <= rank < size`` (Python or numpy integers, not bools),
    else ArgumentError."""
    r, n = integral(rank), integral(size)
    if r is None or n is None or not 0 <= r < n:
        raise ArgumentError(f"rank={rank!r}, size={size!r}: expected integers with "
                            f"0 <= rank < size")
    return r, n

