"""The eBPF switch's TCP path: clients' TCP connections to memcached servers, taken by the TCP splitter on the
switch's machine and their gets balanced as the pipeline decides (path.py; docs/dataplanes/tcp.md)."""
