"""Experiments: the imbalance-factor simulation, Mininet experiment runners, notebooks and benchmarks."""
