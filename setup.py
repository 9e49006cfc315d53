"""MBalancer: in-network load balancing of memcached hot keys (after Moyal, 2016)."""
from setuptools import find_packages, setup

setup(
    name="mbalancer",
    version="0.1.0",
    description="In-network load balancing of memcached hot keys: monitor, controller, data planes, experiments",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # tomllib
    # The top-level folders are the packages: controller/, monitor/, topologies/, experiments/, dataplanes/ (one
    # folder per kind of switch), plus mbalancer/ for the command line and the code the parts share.
    packages=find_packages(include=["mbalancer*", "controller*", "monitor*", "dataplanes*", "topologies*",
                                    "experiments*"]),
    package_data={"experiments": ["notebooks/*.ipynb"], "mbalancer": ["*.toml"], "dataplanes": ["bpf/src/*"]},
    install_requires=[
        "numpy>=1.24",
        "pymemcache>=4.0",
        # The P4Runtime driver (dataplanes/p4/driver.py): P4Runtime's Python bindings with a current protobuf. The
        # modules in the p4runtime wheel were written by an old protoc that no protobuf since 4.21 loads, so the install
        # regenerates them with the protoc of grpcio-tools 1.85 (install/p4runtime_bindings.py), whose code asks for
        # protobuf >= 7.35. p4runtime-shell, whose pins (p4runtime 1.4.1, protobuf 3.20, ipython 7) clash with these,
        # gets an environment of its own (install/python.sh).
        "p4runtime==1.6.0",
        "protobuf>=7.35",
        "grpcio>=1.50",
        "googleapis-common-protos>=1.63",
        # The controller's HTTP interface (controller/http_api.py): a maintained server whose reading of requests
        # is asynchronous, so slow or vanishing clients hold no thread and print no traceback.
        "waitress>=3.0",
        # /metrics (controller/metrics.py): Prometheus's own client library renders the text format.
        "prometheus-client>=0.17",
        # Leader election among controllers (controller/election.py): etcd's v3 API over its HTTP gateway (no
        # protobuf or gRPC of its own to clash with the P4Runtime bindings').
        "etcd3gw>=2.4",
    ],
    # What a switch box, a controller or a monitor does not need is in extras; `make install` (install/python.sh)
    # installs every one of them. A command that needs a missing one names it (mbalancer/cli.py, EXTRAS).
    extras_require={
        "testbed": ["mininet==2.3.0.dev6"],  # the Mininet topologies; uses Debian's mnexec (apt package mininet)
        "plots": ["matplotlib>=3.7"],  # the experiments' and the load generator's figures
        # The Ryu app and the OpenFlow driver (controller/ryu_app.py, dataplanes/openflow/). Ryu 4.34 builds only with
        # setuptools<68 (pinned in install/constraints.txt); its Python 3.11 patch is in controller/ryu_manager.py.
        "ryu": ["ryu==4.34"],
        "test": [
            "pytest>=7",
            "nbclient>=0.8",
            "nbformat>=5.9",
            "ipykernel>=6.25",
            "scapy>=2.5",  # tests write pcapng files and cross-check frame decoding
        ],
    },
    entry_points={"console_scripts": ["mbalancer = mbalancer.cli:main",
                                      "mbalancer-ryu-manager = controller.ryu_manager:main"]},
)
