"""The load generator: Zipf-popular keys from C closed-loop memcached clients, every request recorded.

spec.py      Workload: what to run (servers, keys, alpha, clients, hash, mix, duration); checked with clear errors
keystream.py the sequence of (key, get or set) the clients draw from, Zipf-distributed and reproducible by seed
engine.py    C clients, each blocking on one request at a time (as the thesis's web servers), multiplexed on epoll
records.py   one row per request, the JSON summary and the CSV
plot.py      per-server load, latency CDF and throughput over time as PNG
populate.py  fill the servers with every key over TCP before a run
cli.py       `mbalancer load`
"""
