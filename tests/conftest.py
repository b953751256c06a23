"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["compiled", "cffi"])
def native_fast_path(request):
    """Runs a test once per fast path of collectx._native: the compiled module, then cffi calls."""
    from collectx import _native as nat

    if request.param == "compiled" and nat._compiled_module() is None:
        pytest.skip("collectx._fastpath is not built")
    assert nat._bind_fast_paths(compiled=request.param == "compiled") == request.param
    yield request.param
    nat._bind_fast_paths()
