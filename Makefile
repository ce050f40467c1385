# switchml-xdp: `make demo` and `make test` do all the set-up they need (as root).
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python


.PHONY: setup setup-torch setup-test demo test test-unit test-bpf test-lab bench bench-lab clean setup-vm vm-demo vm-test

# torch (the [torch] extra) only for the targets that use it: test and bench-lab
# (and `swml-lab train`: make setup-torch). demo, bench and the VM lab go without.
setup:
	bash scripts/setup.sh

setup-torch:
	bash scripts/setup.sh --torch

setup-test:
	bash scripts/setup.sh --vm --torch

demo: setup
	$(VENV)/bin/swml-lab demo -n 4 $(DEMO_ARGS)

# The tests in tiers, one folder each (docs/testing.md): tests/unit (no root, no
# namespaces, no BPF compiler: about a minute), tests/bpf (BPF_PROG_TEST_RUN),
# tests/lab (network namespaces), tests/vm (one VM lab run, ~3.5 min under TCG).
# `make test` runs the unit tier first and stops there if it fails; setup-test
# installs what every tier needs (qemu for the VMs, torch for the PyTorch tests).
test: setup-test
	$(PY) -m pytest -ra tests/unit $(PYTEST_ARGS)
	$(PY) -m pytest -ra tests/bpf tests/lab tests/vm $(PYTEST_ARGS)

# The fast loop while changing code: the unit tier alone.
test-unit: setup-torch
	$(PY) -m pytest -ra tests/unit $(PYTEST_ARGS)

test-bpf: setup
	$(PY) -m pytest -ra tests/bpf $(PYTEST_ARGS)

test-lab: setup-torch
	$(PY) -m pytest -ra tests/lab $(PYTEST_ARGS)

# The switch's cost per packet (kernel BPF stats) with afxdp workers, as README's table.
# The other benchmarks: python -m switchml_xdp.bench.NAME (switchml_xdp/bench/__init__.py lists them).
bench: setup
	$(PY) -m switchml_xdp.bench.switch_cost --backend afxdp $(BENCH_COST_ARGS)

# switchml-xdp (afxdp, udp), a user-space switch and Gloo on shaped lab links
# (about 25 minutes): lab_bench.{json,md} and PNG plots in a new
# ./swml-lab-bench-DATE-TIME/, or where BENCH_ARGS="--out DIR" says (README's
# figures: --out bench/results). Gloo needs torch (the package's [torch] extra);
# e.g. make bench-lab BENCH_ARGS="-n 2,4 --rate 100".
bench-lab: setup-torch
	$(VENV)/bin/swml-lab bench $(BENCH_ARGS)

# The lab in qemu VMs (switchml_xdp/lab/vm.py): switch VM + workers, virtio-net,
# native XDP; KVM where it works, else TCG (minutes). Lower priority than the rest.
# vm-test runs only the VM tier, tests/vm (make test runs it too).
setup-vm:
	bash scripts/setup.sh --vm

vm-demo: setup-vm
	nice -n 10 $(VENV)/bin/swml-lab vm -n 2 $(VM_ARGS)

vm-test: setup-vm
	nice -n 10 $(PY) -m pytest -ra tests/vm $(PYTEST_ARGS)

clean:
	-$(VENV)/bin/swml-lab down --all
	rm -rf $(VENV) build *.egg-info
