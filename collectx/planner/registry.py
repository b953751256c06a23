"""The planner registry: algorithm name -> planner function, and what each one supports.

Every planner has the signature
``plan_xxx(topo, ranks, collective, nbytes, *, root=0, inplace=False, nchunks=None) -> Schedule``
(packed trees also take ``host``, ``beat_us`` and ``good_us``) and declares the collectives
it serves in ``collectives`` (or its module's ``SUPPORTED``). ``algo=`` may also be any
callable with that signature, such as a baseline kept for comparison in ``perf/``.

>>> "direct" in ALGORITHMS and supports("direct", "alltoall")
True
>>> supports("tree", "alltoall"), supports(lambda *a, **k: None, "alltoall")
(False, True)
"""

from __future__ import annotations

import sys
from typing import Callable

import networkx as nx

from ..errors import PlanError
from ..schedule.ir import COLLECTIVES, Schedule
from .direct import plan_direct
from .hierarchical import plan_hierarchical
from .ring import plan_ring
from .tree import plan_tree
from .trees import plan_blink, plan_forest

PlannerFn = Callable[..., Schedule]

# In the order candidates are tried: cheap to plan first (packed trees only run where their
# bound lets them beat those), and on ties the simpler schedule wins.
ALGORITHMS: dict[str, PlannerFn] = {"direct": plan_direct, "ring": plan_ring, "tree": plan_tree,
                                    "blink": plan_blink, "forest": plan_forest,
                                    "hierarchical": plan_hierarchical}


def collectives_of(algo: str | PlannerFn) -> frozenset[str]:
    """The collectives a registered name or planner callable declares it supports."""
    fn = resolve(algo)
    declared = getattr(fn, "collectives", None)
    if declared is None:
        declared = getattr(sys.modules.get(getattr(fn, "__module__", ""), None), "SUPPORTED",
                           COLLECTIVES)
    return frozenset(declared)


def supports(algo: str | PlannerFn, collective: str) -> bool:
    """Whether ``algo`` (a registered name or a planner callable) serves ``collective``."""
    return collective in collectives_of(algo)


def resolve(algo: str | PlannerFn) -> PlannerFn:
    """The planner function for a registered name (or the callable itself)."""
    if callable(algo):
        return algo
    fn = ALGORITHMS.get(algo)
    if fn is None:
        raise PlanError(f"unknown algorithm {algo!r}; expected one of "
                        f"{', '.join(sorted(ALGORITHMS))} or a planner callable")
    return fn


def name_of(algo: str | PlannerFn) -> str:
    if isinstance(algo, str):
        return algo
    for name, fn in ALGORITHMS.items():
        if fn is algo:
            return name
    return getattr(algo, "__name__", "custom").removeprefix("plan_")


def candidates(collective: str) -> list[str]:
    """Registered algorithms that serve ``collective``, in registry order (the hierarchical
    planner only serves clusters, which :func:`~.api.plan` sends it)."""
    return [name for name in ALGORITHMS if name != "hierarchical" and supports(name, collective)]


def call(algo: str | PlannerFn, topo: nx.DiGraph, ranks: tuple[str, ...], collective: str,
         nbytes: int, **kw) -> Schedule:
    """Run one planner after checking it supports ``collective``."""
    if not supports(algo, collective):
        raise PlanError(f"algorithm {name_of(algo)!r} does not support {collective}; it "
                        f"supports {', '.join(sorted(collectives_of(algo)))}")
    return resolve(algo)(topo, ranks, collective, nbytes, **kw)
