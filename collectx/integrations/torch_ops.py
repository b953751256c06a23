"""Translation between torch.distributed's vocabulary and collectx's: reduce ops, tensor layout.

The communicator works on flat contiguous buffers; torch hands over lists of tensors that may be
strided, of uneven sizes, or split along dim 0. These helpers stage such tensors into flat buffers
and copy results back, so the process group methods stay short. Contiguous tensors are never
copied: :func:`host` hands the communicator a numpy view of the tensor's own memory.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..errors import ArgumentError, DTypeError

# Keyed by the RedOpType's integer value: hashing and comparing the enum itself costs about a
# microsecond per call. Values: (collectx op, whether torch passes a factor to multiply by first).
_RED = dist.ReduceOp.RedOpType
_OPS = {
    _RED.SUM.value: ("sum", False),
    _RED.AVG.value: ("avg", False),
    _RED.PRODUCT.value: ("prod", False),
    _RED.MIN.value: ("min", False),
    _RED.MAX.value: ("max", False),
    _RED.PREMUL_SUM.value: ("sum", True),   # the factor is applied before the sum
}

# torch dtypes whose tensors convert to numpy arrays (Tensor.numpy()) sharing their memory, and
# which the CPU communicator reduces natively, with their numpy names. bfloat16 has no numpy
# dtype: such tensors go to the communicator as they are (it views them as uint16 tagged
# bfloat16, also without a copy).
_NUMPY_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.int64: "int64", torch.int32: "int32", torch.int8: "int8",
                torch.uint8: "uint8"}
_NUMPY_DTYPES = frozenset(_NUMPY_NAMES)


def reduce_op(op) -> tuple[str, object | None]:
    """collectx op name and PREMUL_SUM factor (None otherwise) for a torch ``ReduceOp``.

    >>> reduce_op(dist.ReduceOp.MAX)
    ('max', None)
    >>> reduce_op(dist._make_nccl_premul_sum(0.5))
    ('sum', 0.5)
    """
    kind = op.op if type(op) is dist.ReduceOp else op
    found = _OPS.get(getattr(kind, "value", None))
    if found is None:
        raise DTypeError(f"reduce op {kind} is not supported by the collectx backend; expected "
                         f"SUM, AVG, PRODUCT, MIN, MAX or PREMUL_SUM. Use gloo for bitwise ops")
    name, premul = found
    return name, (getattr(op, "factor", None) if premul else None)


def premultiply(tensor: torch.Tensor, factor) -> None:
    """Scale ``tensor`` in place by a PREMUL_SUM factor (a number or a one-element tensor)."""
    if factor is None:
        return
    view = host(tensor)
    if isinstance(view, np.ndarray) and tensor.is_floating_point():
        # numpy, on this thread: see copy() for why not torch's mul_
        np.multiply(view, float(factor), out=view, casting="same_kind")
        return
    if isinstance(factor, torch.Tensor):
        factor = factor.to(device=tensor.device, dtype=tensor.dtype)
    tensor.mul_(factor)


def device_type(tensors: Sequence[torch.Tensor]) -> str:
    """The one device all ``tensors`` live on: ``"cpu"`` or ``"cuda:N"``; they must be dense
    (sparse ones have no flat buffer to move, and NCCL refuses them too)."""
    if any(t.layout is not torch.strided for t in tensors):
        raise ArgumentError(f"tensors of layout {sorted({str(t.layout) for t in tensors})}; "
                            f"expected dense (torch.strided) tensors. Convert with .to_dense()")
    if all(t.is_cpu for t in tensors):       # the common case, without building device objects
        return "cpu"
    devices = {str(t.device) for t in tensors}
    if len(devices) != 1 or not all(t.is_cuda for t in tensors):
        raise ArgumentError(f"tensors on devices {sorted(devices)}; expected all on cpu or all "
                            f"on one cuda device. Move them with .to() before the collective")
    device = devices.pop()
    # "cuda" without an index means the current device; the communicator needs to know which.
    return device if ":" in device else f"cuda:{torch.cuda.current_device()}"


def same_dtype(tensors: Sequence[torch.Tensor], what: str) -> torch.dtype:
    """The dtype shared by ``tensors``; raises naming the mix otherwise."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise DTypeError(f"{what}: tensors of dtypes {sorted(map(str, dtypes))}; expected one "
                         f"dtype. Cast them to a common dtype first")
    return dtypes.pop()


def host(tensor: torch.Tensor):
    """What the communicator should be handed for ``tensor``: a numpy view of its memory (no
    copy) when it is a contiguous CPU tensor of a numpy dtype, else the tensor itself.

    The communicator accepts tensors too, but converting one there costs tens of microseconds
    per call (dtype names, device objects), about as much as the whole collective at a few KiB;
    ``Tensor.numpy()`` costs a few. The view is used only while the call runs, so it never
    outlives the tensor.

    >>> t = torch.arange(4, dtype=torch.float32)
    >>> a = host(t)
    >>> type(a).__name__, a.ctypes.data == t.data_ptr()
    ('ndarray', True)
    >>> type(host(t[::2])).__name__
    'Tensor'
    """
    if tensor.dtype in _NUMPY_DTYPES and tensor.is_cpu and tensor.is_contiguous():
        try:
            return (tensor.detach() if tensor.requires_grad else tensor).numpy()
        except (RuntimeError, TypeError):  # a conj/neg view bit: let the communicator explain
            return tensor
    return tensor


# Same-size integer dtypes: copies move bits, so any dtype (bfloat16, bool) copies as these.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor):
    """A numpy view of a CPU tensor's elements as same-size integers (any strides), or None."""
    kind = _BITS.get(tensor.element_size())
    if kind is None or not tensor.is_cpu:
        return None
    try:
        return tensor.detach().view(kind).numpy()
    except (RuntimeError, TypeError):  # conj/neg view bits and the like: torch copies those
        return None


def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[...] = src`` (same dtype and element count, any shapes and strides).

    CPU copies run in numpy on the calling thread. torch's ``copy_`` and ``cat`` split a large
    copy over the intra-op thread pool, and when the machine has more busy threads than cores
    (two ranks on two cores already do) the pool waits for descheduled threads: a 4 MiB
    ``torch.cat`` took 124 ms with 2 intra-op threads on a loaded 2-core machine, 0.18 ms as
    ``np.concatenate``. numpy also releases the GIL while it copies.
    """
    d = _bits(dst) if dst.dtype == src.dtype else None
    s = _bits(src) if d is not None else None
    if s is None:
        dst.copy_(src.reshape(dst.shape))
    else:
        np.copyto(d, s.reshape(d.shape))


def zero(tensor: torch.Tensor) -> None:
    """Fill ``tensor`` with zeros (numpy on CPU, for the reason given in :func:`copy`)."""
    view = _bits(tensor)
    if view is None:
        tensor.zero_()
    else:
        view.fill(0)


class Flat:
    """A contiguous version of ``tensor``, staged through a copy when it is strided.

    ``Flat(t).data`` is what the communicator reads and writes: ``t`` itself when it is
    contiguous (any shape; the communicator flattens it without a copy), else a 1-D staging
    copy, which :meth:`commit` copies back.
    """

    __slots__ = ("tensor", "staged", "data")

    def __init__(self, tensor: torch.Tensor, *, read: bool = True):
        self.tensor = tensor
        self.staged = not tensor.is_contiguous()
        if self.staged:
            self.data = torch.empty(tensor.numel(), dtype=tensor.dtype, device=tensor.device)
            if read:
                copy(self.data, tensor)
        else:
            self.data = tensor

    @property
    def buffer(self):
        """:attr:`data` as the communicator takes it best (see :func:`host`)."""
        return host(self.data)

    def commit(self) -> None:
        if self.staged:
            copy(self.tensor, self.data)


def empty(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A new 1-D buffer of ``numel`` elements with ``like``'s dtype and device.

    Not a buffer in the communicator's window heap (``Communicator.empty``), although the
    executor would then skip staging it: measured through all_reduce_coalesced on 2 ranks, the
    heap allocation and the zero-copy fence cost more than the staging copies they save up to
    4 MiB (e.g. 1 MiB: 7.0 ms against 3.7 ms, best of 25), and broke even at 16 MiB.
    """
    return torch.empty(numel, dtype=like.dtype, device=like.device)


def concat(parts: Sequence[torch.Tensor], pad_to: int | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Parts flattened end to end into one buffer (``out``, or a new one), each zero-padded to
    ``pad_to`` elements.

    >>> concat([torch.tensor([1, 2]), torch.tensor([3])], pad_to=3).tolist()
    [1, 2, 0, 3, 0, 0]
    """
    sizes = [p.numel() for p in parts]
    width = pad_to
    if out is None:
        out = empty(sum(sizes) if width is None else width * len(parts), parts[0])
    offset = 0
    for part, n in zip(parts, sizes):
        copy(out[offset:offset + n], part)
        if width is not None and n < width:
            zero(out[offset + n:offset + width])
        offset += n if width is None else width
    return out


def scatter_back(buffer: torch.Tensor, parts: Sequence[torch.Tensor],
                 stride: int | None = None) -> None:
    """Inverse of :func:`concat`: copy consecutive slices of ``buffer`` into ``parts``."""
    offset = 0
    for part in parts:
        n = part.numel()
        copy(part, buffer[offset:offset + n])
        offset += n if stride is None else stride


def split_rows(tensor: torch.Tensor, splits: Sequence[int], size: int) -> list[torch.Tensor]:
    """``tensor`` cut along dim 0 by ``splits`` (equal parts when ``splits`` is empty).

    >>> [p.tolist() for p in split_rows(torch.arange(3), [1, 2], 2)]
    [[0], [1, 2]]
    """
    rows = tensor.shape[0] if tensor.dim() else 1
    if not splits:
        if rows % size:
            raise ArgumentError(f"all_to_all: dim 0 of size {rows} does not split evenly over "
                                f"{size} ranks; pass split sizes")
        splits = [rows // size] * size
    if len(splits) != size or sum(splits) != rows:
        raise ArgumentError(f"all_to_all: split sizes {list(splits)} for dim 0 of size {rows}; "
                            f"expected {size} sizes summing to it")
    return list(torch.split(tensor.reshape(rows, -1) if not tensor.dim() else tensor,
                            list(splits), dim=0))
