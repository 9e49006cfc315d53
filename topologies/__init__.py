"""Mininet topologies and switch nodes for MBalancer experiments."""
