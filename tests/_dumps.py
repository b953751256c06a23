"""The real machine descriptions of ``topology/real/``, for tests that load or plan on them."""

from __future__ import annotations

from pathlib import Path

import collectx.topology as T

REAL = Path(__file__).resolve().parent.parent / "topology" / "real"


def load(name: str):
    """The topology of the dump ``topology/real/<name>``."""
    return T.load(REAL / name)
