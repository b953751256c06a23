"""collectx.cli."""
