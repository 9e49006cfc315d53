"""etcd for tests: the testbed's cluster (topologies/etcd.py), and why a test cannot run one here."""
from topologies.etcd import EtcdCluster, EtcdServer, available

__all__ = ["EtcdCluster", "EtcdServer", "available"]
