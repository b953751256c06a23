"""The planner: topology-aware schedules for every collective, and how good they are.

>>> from collectx.planner import ALGORITHMS, make_schedule
>>> "direct" in ALGORITHMS
True
>>> make_schedule(None, "allgather", 2, 1024).algorithm
'direct'
"""

from .api import Plan, allocation, make_schedule, plan
from .registry import ALGORITHMS, PlannerFn, candidates, supports

__all__ = ["ALGORITHMS", "Plan", "PlannerFn", "allocation", "candidates", "make_schedule", "plan",
           "supports"]
