# switchml-xdp: `make demo` and `make test` do all the set-up they need (as root).
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python


.PHONY: setup demo test bench bench-lab clean

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/swml-lab demo -n 4 $(DEMO_ARGS)

test: setup
	$(PY) -m pytest -ra $(PYTEST_ARGS)

# The switch's cost per packet (kernel BPF stats) with afxdp workers, as README's table.
bench: setup
	$(PY) -m switchml_xdp.bench.switch_cost --backend afxdp $(BENCH_COST_ARGS)

# switchml-xdp (afxdp, udp), a user-space switch and Gloo on shaped lab links
# (about 25 minutes): lab_bench.{json,md} and PNG plots in a new
# ./swml-lab-bench-DATE-TIME/, or where BENCH_ARGS="--out DIR" says (README's
# figures: --out bench/results). Gloo needs torch (the package's [torch] extra);
# e.g. make bench-lab BENCH_ARGS="-n 2,4 --rate 100".
bench-lab: setup
	$(VENV)/bin/swml-lab bench $(BENCH_ARGS)

clean:
	-$(VENV)/bin/swml-lab down --all
	rm -rf $(VENV) build *.egg-info
