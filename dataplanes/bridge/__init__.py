"""The `bridge` data plane: a plain Linux bridge, forwarding only (no MBalancer): the benchmarks' baseline."""
