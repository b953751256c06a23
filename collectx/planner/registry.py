"""The planner registry: algorithm name -> planner function, and what each one supports.

Every planner has the signature
``plan_xxx(topo, ranks, collective, nbytes, *, root=0, inplace=False, nchunks=None) -> Schedule``
and declares the collectives it serves in a ``collectives`` attribute (or its module's
``SUPPORTED`` tuple). Optional algorithms (blink, forest) are registered when their module exists.

>>> "direct" in ALGORITHMS and supports("direct", "alltoall")
True
>>> supports("tree", "alltoall"), supports(lambda *a, **k: None, "alltoall")
(False, True)
>>> "fallback_ring" in candidates("allreduce"), supports("fallback_ring", "allreduce")
(False, True)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from typing import Callable

import networkx as nx

from ..errors import PlanError
from ..schedule.ir import COLLECTIVES, Schedule

PlannerFn = Callable[..., Schedule]

_CORE = {"direct": ("direct", "plan_direct"), "ring": ("ring", "plan_ring"),
         "tree": ("tree", "plan_tree")}
_OPTIONAL = {"blink": ("blink", "plan_blink"), "forest": ("forest", "plan_forest"),
             "hierarchical": ("hierarchical", "plan_hierarchical")}


def _load(table: dict, optional: bool) -> dict[str, PlannerFn]:
    found = {}
    for name, (module, attr) in table.items():
        full = f"{__package__}.{module}"
        if optional and importlib.util.find_spec(full) is None:
            continue
        try:
            fn = getattr(importlib.import_module(full), attr, None)
        except ImportError as exc:
            if not optional:
                raise
            # An optional algorithm that fails to import must not take the baseline planners
            # down with it (the runtime plans with them); say so loudly instead.
            warnings.warn(f"planner algorithm {name!r} is unavailable: {module}.py failed to "
                          f"import ({exc}); planning continues without it", RuntimeWarning,
                          stacklevel=2)
            continue
        if fn is not None:
            found[name] = fn
    return found


ALGORITHMS: dict[str, PlannerFn] = {**_load(_CORE, False), **_load(_OPTIONAL, True)}
# Baselines: plans other libraries would run, for comparison. ``algo=`` / ``--algo`` resolves
# them by name, but the cost model never considers them (they are never faster).
BASELINES: dict[str, PlannerFn] = _load({"fallback_ring": ("fallback_ring",
                                                             "plan_fallback_ring")}, True)


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
    fn = ALGORITHMS.get(algo) or BASELINES.get(algo)
    if fn is None:
        raise PlanError(f"unknown algorithm {algo!r}; expected one of "
                        f"{', '.join(sorted(ALGORITHMS))} (or a baseline: "
                        f"{', '.join(sorted(BASELINES))}) or a planner callable")
    return fn


def name_of(algo: str | PlannerFn) -> str:
    if isinstance(algo, str):
        return algo
    for name, fn in (*ALGORITHMS.items(), *BASELINES.items()):
        if fn is algo:
            return name
    return getattr(algo, "__name__", "custom").removeprefix("plan_")


def candidates(collective: str) -> list[str]:
    """Registered algorithms that serve ``collective``, in registry order."""
    return [name for name in ALGORITHMS if supports(name, collective)]


def call(algo: str | PlannerFn, topo: nx.DiGraph, ranks: tuple[str, ...], collective: str,
         nbytes: int, **kw) -> Schedule:
    """Run one planner after checking it supports ``collective``."""
    if not supports(algo, collective):
        raise PlanError(f"algorithm {name_of(algo)!r} does not support {collective}; it "
                        f"supports {', '.join(sorted(collectives_of(algo)))}")
    return resolve(algo)(topo, ranks, collective, nbytes, **kw)
