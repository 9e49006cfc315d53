"""The Linux BPF toolkit two data planes share: the C program (src/), built once as the eBPF switch and once with
-DMB_CLASSIFIER as the OpenFlow data plane's key classifier; building, loading, attaching and pinning it
(program.py); its maps as Python tables (tables.py), written through the bpf syscall (bpf_syscall.py); the records
`mbalancer switch attach` keeps of what it made on a box, and the pins-and-record step that ends every detach
(records.py).

It sits one floor below dataplanes/ebpf/ and dataplanes/openflow/ (as p4src/ does for dataplanes/p4/), so neither
data plane imports the other.
"""
