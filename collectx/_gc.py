"""Pausing Python's cyclic garbage collector while the planner builds large object graphs.

Why: a plan allocates hundreds of thousands of small tuples (refs, instructions, routes) that
stay alive until it returns. Each allocation burst triggers collections that traverse every
live object again, and on an 8-GPU DGX-1 allocation that was 40% of the planning time. Plans
create no reference cycles worth collecting early (everything is freed by reference counting
when the call returns), so automatic collection is paused for the call and resumed after.
"""

from __future__ import annotations

import functools
import gc
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def paused(fn: F) -> F:
    """Decorator: run ``fn`` with automatic garbage collection off, restoring the previous state.

    Nesting is safe: only the outermost call that found collection enabled turns it back on.

    >>> @paused
    ... def busy():
    ...     return gc.isenabled()
    >>> busy(), gc.isenabled()
    (False, True)
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return wrapper  # type: ignore[return-value]
