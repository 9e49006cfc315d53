"""Monitor: capture memcached requests and find the hot keys with bounded memory.

heavy_hitters.py a windowed Space-Saving summary: top keys with error bounds in memory set by a parameter
pcapfile.py      read pcap and pcapng files
bpf.py           the classic BPF filter the kernel runs on the capture socket (port, interfaces, 1-in-k sampling)
capture.py       live capture: AF_PACKET socket with that filter
monitor.py       frames in, one report per interval out
outputs.py       what is done with a report: terminal view, JSON lines, HTTP push to the controller
cli.py           `mbalancer monitor`

Shared with the controller, below both: mbalancer/packets.py (frame -> memcached segment),
mbalancer/memcache/segment_keys.py (the keys a segment reads or writes) and mbalancer/monitor_report.py (the
report's fields, written here and read by the controller).
"""
