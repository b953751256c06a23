"""collectx.topology."""
