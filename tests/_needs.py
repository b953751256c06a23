"""Optional packages and programs some tests need, and how to install them.

A test that needs one skips with the install command in its reason, so a bare machine (Python
and a C++ compiler) passes the suite and says what more would run.
"""

from __future__ import annotations

import shutil

import pytest

INSTALL = {
    "torch": "pip install torch (the CPU build is enough)",
    "mpi4py": "apt-get install openmpi-bin libopenmpi-dev, then pip install mpi4py",
    "mpirun": "apt-get install openmpi-bin libopenmpi-dev",
    "cupy": "pip install cupy-cuda13x (and an NVIDIA GPU)",
    "matplotlib": "pip install matplotlib",
    "nvcc": "the CUDA toolkit (nvcc on PATH), then pip install . again",
}


def reason(what: str) -> str:
    """The skip reason for a missing package or program: what it is and how to get it."""
    top = what.partition(".")[0]
    return f"needs {top}: {INSTALL[top]}"


def module(name: str):
    """``name`` imported, or the test skipped with the install command."""
    return pytest.importorskip(name, reason=reason(name))


def program(name: str) -> str | None:
    """Why ``name`` cannot run here (not on PATH), or None when it can."""
    return None if shutil.which(name) else reason(name)
