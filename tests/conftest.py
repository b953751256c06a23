"""Fixtures shared by several test files."""

from __future__ import annotations

import os

import pytest

# Several ranks as threads of this process share one GPU in the GPU tests; each needs its own
# hardware queue, or a kernel can wait behind a peer's spinning one. Read when CUDA starts.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


@pytest.fixture(params=["compiled", "cffi"])
def native_fast_path(request):
    """Runs a test once per fast path of collectx._native: the compiled module, then cffi calls."""
    from collectx import _native as nat

    if request.param == "compiled" and nat._compiled_module() is None:
        pytest.skip("collectx._fastpath is not built")
    assert nat._bind_fast_paths(compiled=request.param == "compiled") == request.param
    yield request.param
    nat._bind_fast_paths()
