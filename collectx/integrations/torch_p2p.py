"""Point-to-point send/recv for the torch backend, buffered through the group's torch store.

torch's ``isend`` may be issued before the peer posts its ``irecv`` (``batch_isend_irecv`` does
exactly that on both sides), so a send must not wait for its receiver; the Communicator's native
send does once about 1 MiB is in flight. ``send``/``recv`` are rare in data-parallel training, so
the bytes go through the store, which buffers any amount. Messages between a pair are matched by
order: the n-th send from ``a`` to ``b`` meets the n-th recv on ``b`` from ``a``, as in torch's
own semantics for one tag.
A send returns once the bytes are in the store (buffered), so send/recv orders cannot deadlock.
"""

from __future__ import annotations

import datetime
from collections import Counter

import torch

from ..errors import ArgumentError, Timeout
from .torch_ops import copy


class StoreP2P:
    """Order-matched messages between ranks, carried by a torch ``Store``.

    Parameters
    ----------
    store : torch.distributed.Store
        The group's store (keys go under ``prefix + "/p2p/"``).
    rank : int
        This rank.
    timeout_s : float
        How long a recv waits for its message.
    prefix : str
        Store key prefix that no other channel on ``store`` uses.
    """

    def __init__(self, store, rank: int, timeout_s: float, prefix: str = "collectx"):
        self._store = store
        self._prefix = prefix
        self._rank = rank
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._sent: Counter = Counter()
        self._received: Counter = Counter()

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Post a copy of contiguous CPU ``tensor`` for ``dst``."""
        self._sent[dst] += 1
        self._store.set(self._key(self._rank, dst, self._sent[dst]), _to_bytes(tensor))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Fill contiguous CPU ``tensor`` with the next message from ``src``."""
        self._received[src] += 1
        key = self._key(src, self._rank, self._received[src])
        try:
            self._store.wait([key], self._timeout)
        except RuntimeError as err:    # torch's DistStoreError on timeout
            raise Timeout(f"recv from rank {src}: no message after "
                          f"{self._timeout.total_seconds():.0f} s; expected a matching send. "
                          f"Check that rank {src} calls send to rank {self._rank}") from err
        payload = self._store.get(key)
        self._store.delete_key(key)        # keep the store small over long runs
        _from_bytes(tensor, payload, src)

    def _key(self, src: int, dst: int, seq: int) -> str:
        return f"{self._prefix}/p2p/{src}->{dst}/{seq}"


def _to_bytes(tensor: torch.Tensor) -> bytes:
    # A uint8 view covers every dtype (bfloat16 has no numpy equivalent).
    return tensor.detach().reshape(-1).view(torch.uint8).numpy().tobytes()


def _from_bytes(tensor: torch.Tensor, payload: bytes, src: int) -> None:
    nbytes = tensor.numel() * tensor.element_size()
    if len(payload) != nbytes:
        raise ArgumentError(f"recv from rank {src}: message of {len(payload)} bytes for a tensor "
                            f"of {nbytes} bytes; expected send and recv tensors of the same size "
                            f"and dtype")
    source = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    copy(tensor.reshape(-1).view(torch.uint8), source)
