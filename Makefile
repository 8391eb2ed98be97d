# The README's two commands: `make run` (the main job) and `make test` (the test suite).
# Both do all set-up themselves (scripts/setup.sh) on a fresh machine.
VENV ?= .venv
ARGS ?=

.PHONY: setup run test bench

setup:
	@bash scripts/setup.sh

# The main job: FedAvg against FedAvg + FedRDN on Digits-4 (grid main_digits4, the two runs side by side
# where there are 2 cores), the comparison printed, then the HTML report. A second call reuses the finished runs.
MAIN_OUT ?= runs/main
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -ge 2 ] && echo 2 || echo 1)

run: setup
	$(VENV)/bin/fedaug compare main_digits4 --jobs $(JOBS) --out $(MAIN_OUT) $(ARGS)
	$(VENV)/bin/fedaug report $(MAIN_OUT)

test: setup
	$(VENV)/bin/python -m pytest $(ARGS)

bench: setup
	$(VENV)/bin/python benchmarks/bench_engine.py $(ARGS)
