"""Collection rules for the whole tree: the doctests of modules that need an optional package,
and no plan cache on disk.

``--doctest-modules`` imports every module under ``collectx/``. A few of them (the torch
backend) import an optional package at module level, so on a machine without it collection
would fail before any test ran. Such a module's doctests are skipped instead, with the install
command in the reason; any other import error still fails collection.
"""

from __future__ import annotations

import os

import pytest
from _pytest.doctest import DoctestModule

# Tests and doctests never read or write the user's plan cache (~/.cache/collectx), nor share one
# between tests (one that swaps the planner would read another's plans). Read once, by
# collectx.config.get_config, in this process and in the ranks it launches; tests of the cache
# pass their own directory.
os.environ["COLLECTX_CACHE_DIR"] = "off"

# Top-level packages that collectx only needs for an optional feature, and how to get them.
OPTIONAL_PACKAGES = {
    "torch": "pip install torch (the CPU build is enough)",
    "mpi4py": "apt-get install openmpi-bin libopenmpi-dev, then pip install mpi4py",
    "cupy": "pip install cupy-cuda13x (and an NVIDIA GPU)",
    "matplotlib": "pip install matplotlib",
}


class OptionalDoctestModule(DoctestModule):
    """A doctest module that skips when it cannot import an optional package."""

    def collect(self):
        try:
            self.obj  # the import; pytest wraps its error in a CollectError
        except self.CollectError as exc:
            cause = exc.__cause__
            top = getattr(cause, "name", None) or ""
            top = top.partition(".")[0]
            if not isinstance(cause, ModuleNotFoundError) or top not in OPTIONAL_PACKAGES:
                raise
            pytest.skip(f"{self.path.name} needs {top}: {OPTIONAL_PACKAGES[top]}")
        yield from super().collect()


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path, parent):
    collected = yield
    return [OptionalDoctestModule.from_parent(parent, path=file_path)
            if type(c) is DoctestModule else c for c in collected]
