# Entry points: `make demo` (the main job) and `make test`. Both install what they need first and are idempotent:
# stamps under .venv/ record what was installed, so a second run only re-checks and goes straight to the work.
PYTHON ?= /usr/bin/python3
VENV   := .venv
PY     := $(VENV)/bin/python
OUT    ?= results
TRIALS ?=

.PHONY: all demo experiments faults simulation test test-unit install system venv bench clean p4 p4c

all: demo

# --- installation -------------------------------------------------------------------------------------------
system:
	@bash install/system.sh

# The virtualenv, reinstalled when the package definition or the pinned versions change (install/python.sh says
# how pins reach pip, build environments included).
$(VENV)/.installed: setup.py install/constraints.txt install/build-constraints.txt install/python.sh \
		install/p4runtime_bindings.py install/p4runtime-shell-constraints.txt | system
	PYTHON=$(PYTHON) bash install/python.sh $(VENV)
	@touch $@

venv: $(VENV)/.installed

# Every data plane with a build step (dataplanes/registry.py) is built here, never at run time: today the eBPF
# program (clang, from apt) and its TCP splitter (gcc, libbpf). The stamp follows the sources of every data plane.
DATAPLANES_BUILT := $(VENV)/.dataplanes-built
$(DATAPLANES_BUILT): $(wildcard dataplanes/bpf/src/*) $(wildcard dataplanes/ebpf/tcp/src/*) $(wildcard p4src/*.p4) dataplanes/registry.py | $(VENV)/.installed
	$(PY) -m dataplanes build
	@touch $@

install: system venv $(DATAPLANES_BUILT)

# The P4 toolchain, which no package registry has: PI + bmv2's simple_switch_grpc (how long: docs/install.md), and
# p4c (slower), built from pinned upstream sources into P4_PREFIX (default /usr/local); P4_SOURCES=DIR builds from
# sources already downloaded. Neither is needed by `make test` (the P4 tests skip without bmv2) nor by the other data
# planes.
p4: system
	bash install/p4.sh bmv2

p4c: system
	bash install/p4.sh p4c

# --- jobs ---------------------------------------------------------------------------------------------------
# The main job: the Mininet testbed, baseline against MBalancer at one point (about a minute).
demo: install
	$(VENV)/bin/mbalancer experiment demo --out $(OUT)/demo

# The thesis's chapter 5: Figs 5.1 and 5.2 (one sweep, about 4 minutes) and the 10-server ketama run.
experiments: install
	$(VENV)/bin/mbalancer experiment fig5.1 --out $(OUT)/chapter5
	$(VENV)/bin/mbalancer experiment fig5.2 --out $(OUT)/chapter5
	$(VENV)/bin/mbalancer experiment ketama10 --out $(OUT)/ketama10

# Faults under load (crash, hang, CPU hog, slow link, UDP wedge, controller kill, switch reload), about 6 minutes.
faults: install
	$(VENV)/bin/mbalancer faults --out $(OUT)/faults

# The imbalance-factor model (chapters 3 and 4.4): table and figures in seconds.
simulation: install
	$(VENV)/bin/mbalancer demo --out $(OUT)

# Every tier of tests (root for most): the tiers that make no network run beside the ones that do
# (tests/run_tiers.sh); test-unit: the unit tier only, no root needed, under a minute (tiers: tests/conftest.py,
# docs/testing.md).
test: install
	bash tests/run_tiers.sh $(VENV)/bin/python

test-unit: install
	$(VENV)/bin/python -m pytest -m unit

bench: install
	$(PY) experiments/benchmarks/bench_simulation.py $(if $(TRIALS),--trials $(TRIALS))
	$(PY) experiments/benchmarks/bench_load.py
	$(PY) experiments/benchmarks/bench_monitor.py
	$(PY) experiments/benchmarks/bench_controller.py
	$(PY) experiments/benchmarks/bench_controller_scale.py
	$(PY) experiments/benchmarks/bench_write_burst.py
	$(PY) experiments/benchmarks/bench_etcd_failover.py
	$(PY) experiments/benchmarks/bench_ebpf_program.py
	$(PY) experiments/benchmarks/bench_dataplane_sketch.py
	$(PY) experiments/benchmarks/bench_ebpf_switch.py --openflow
	$(PY) experiments/benchmarks/bench_p4_switch.py
	$(PY) experiments/benchmarks/bench_p4_sketch.py
	$(PY) experiments/benchmarks/bench_memcaslap.py

clean:
	rm -rf $(VENV) $(OUT) build dataplanes/*/build *.egg-info .pytest_cache
