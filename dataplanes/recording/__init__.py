"""The `none` data plane: no switch. Its driver records the tables a switch would hold (dry runs and tests)."""
