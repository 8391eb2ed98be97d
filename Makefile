# The README's two commands: `make run` (the main job) and `make test` (the test suite).
# Both do all set-up themselves (scripts/setup.sh) on a fresh machine.
VENV ?= .venv
ARGS ?=

.PHONY: setup run test bench

setup:
	@bash scripts/setup.sh

run: setup
	$(VENV)/bin/fedaug run $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest $(ARGS)

bench: setup
	$(VENV)/bin/python benchmarks/bench_engine.py $(ARGS)
