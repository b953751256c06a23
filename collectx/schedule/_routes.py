"""The simulator's view of routes: :mod:`collectx.topology.routes`, plus the fair-share memo the
simulator keeps with each topology's routes (the same mixes of transfers recur across the
schedules planned on one machine)."""

from __future__ import annotations

from ..topology.routes import Routes, routes_for
from ._fairshare import RouteClasses

__all__ = ["Routes", "route_classes", "routes_for"]


def route_classes(routes: Routes) -> RouteClasses:
    """The route classes and fair shares memoized for ``routes``' topology."""
    found = routes.attached.get("classes")
    if found is None:   # setdefault: threads that ask first at once all get the one kept
        found = routes.attached.setdefault("classes", RouteClasses())
    return found
