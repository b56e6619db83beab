"""INT4 reference (filled in by the INT4 work)."""
