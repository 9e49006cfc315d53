"""Monitor: capture memcached requests and find the hot keys with bounded memory.

frames.py        link layer (Ethernet, VLAN, Linux cooked, raw IP) -> IPv4 -> UDP/TCP payload for the memcached port
requests.py      the get keys in a payload, through the shared protocol module (mbalancer.memcache)
heavy_hitters.py a windowed Space-Saving summary: top keys with error bounds in memory set by a parameter
pcapfile.py      read pcap and pcapng files
bpf.py           the classic BPF filter the kernel runs on the capture socket (port, 1-in-k sampling)
capture.py       live capture: AF_PACKET socket with that filter
monitor.py       frames in, one report per interval out
outputs.py       what is done with a report: terminal view, JSON lines, HTTP push to the controller
cli.py           `mbalancer monitor`
"""
