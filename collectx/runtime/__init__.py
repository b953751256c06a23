"""collectx.runtime."""
