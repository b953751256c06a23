"""collectx.planner."""
