"""A first-fit allocator over a rank's window heap, for ``Communicator.empty``.

Blocks are 64-byte aligned; a block returns to the free list when its array is garbage collected.

>>> h = Heap(1024)
>>> a, b = h.alloc(100), h.alloc(10)
>>> a, b
(0, 128)
>>> h.free(a); h.alloc(64)
0
"""

from __future__ import annotations

import threading

from ..errors import ArgumentError

ALIGN = 64


class Heap:
    """Offsets into a region of ``size`` bytes: ``alloc`` / ``free``. ``fix``: how to make
    room when an array does not fit."""

    def __init__(self, size: int, fix: str = "free arrays from empty()"):
        self.size, self.fix = size, fix
        self._free = [(0, size)]         # sorted (offset, length) holes
        self._used: dict[int, int] = {}
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> int:
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            for i, (off, length) in enumerate(self._free):
                if length >= need:
                    self._free[i:i + 1] = [(off + need, length - need)] if length > need else []
                    self._used[off] = need
                    return off
        raise ArgumentError(f"empty(): {nbytes} bytes do not fit in the {self.size}-byte window "
                            f"heap ({self.in_use} in use); expected at most the free space; "
                            f"{self.fix}")

    def free(self, off: int) -> None:
        with self._lock:
            length = self._used.pop(off)
            self._free.append((off, length))
            self._free.sort()
            merged = [self._free[0]]
            for o, n in self._free[1:]:
                po, pn = merged[-1]
                merged[-1:] = [(po, pn + n)] if po + pn == o else [(po, pn), (o, n)]
            self._free = merged

    @property
    def used(self) -> bool:
        """Whether any block is allocated (cheap: checked on every collective call)."""
        return bool(self._used)

    @property
    def in_use(self) -> int:
        return sum(self._used.values())
