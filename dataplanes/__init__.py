"""The data planes: the code that builds, loads and talks to each kind of switch MBalancer programs.

One folder per data plane (its program or a pointer to it, control library, driver, switch nodes for plain
namespaces and Mininet), and below them what they share:

driver.py        the driver interface the controller core talks to
pipeline.py      what every pipeline shares: limits, switch counter names, weight encoding, trusted addresses
switch_nodes.py  what every switch node shares: setup commands, a Mininet link's far end
registry.py      every kind by name: its driver, switch nodes, build step and config section (read by all the rest)
bpf/             the Linux BPF toolkit under ebpf/ and openflow/: the C program, build/load/pin, map tables
ebpf/            the default: the BPF program on every port of a Linux switch
p4/              P4Runtime driver, client, entries and bmv2 runner for p4src/mbalancer.p4
openflow/        Open vSwitch driven by the Ryu app, with the BPF key classifier on its links
recording/       `none`: no switch, the slot book over tables kept in memory (dry runs, tests)
bridge/          a plain Linux bridge: the benchmarks' baseline
__main__.py      `python -m dataplanes build`: what `make install` runs to build every kind that has a build step

Adding a data plane is one folder here and one entry in registry.py; no data plane imports another.
"""
