"""The data planes: the code that builds, loads and talks to each kind of switch MBalancer programs.

registry.py   every kind by name: its driver, switch nodes, build step and config section (read by all the rest)
ebpf/         the default: a tc eBPF program (bpf/), the bpf(2) layer and the control library over its maps
__main__.py   `python -m dataplanes build`: what `make install` runs to build every kind that has a build step

The drivers that turn the controller's decisions into table writes live in controller/drivers/, thin over these;
the switch nodes for Mininet and plain namespaces live in topologies/.
"""
