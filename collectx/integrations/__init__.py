"""collectx.integrations."""
