# switchml-xdp: `make demo` and `make test` do all the set-up they need (as root).
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python


.PHONY: setup demo test bench clean

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/swml-lab demo -n 4 $(DEMO_ARGS)

test: setup
	$(PY) -m pytest -ra $(PYTEST_ARGS)

bench: setup
	$(PY) -m switchml_xdp.bench.switch_cost

clean:
	-$(VENV)/bin/swml-lab down --all
	rm -rf $(VENV) build *.egg-info
