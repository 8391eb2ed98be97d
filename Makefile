# The README's two commands: `make run` (the main job) and `make test` (the test suite).
# Both do all set-up themselves (scripts/setup.sh) on a fresh machine.
VENV ?= .venv
ARGS ?=

# The ends of pyproject's torch range, which `make test-torch` (CI, after `make test`) tests in environments of
# their own (scripts/test_torch.sh); tests/test_install.py checks that the range's bounds are these releases.
TORCH_ENDS ?= 2.11.0 2.15.0

.PHONY: setup run test test-torch test-torch-download bench

setup:
	@bash scripts/setup.sh

# The main job: FedAvg against FedAvg + FedRDN on Digits-4 (grid main_digits4, the two runs side by side
# where there are 2 cores), the comparison printed, then the HTML report. A second call reuses the finished runs.
MAIN_OUT ?= runs/main
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -ge 2 ] && echo 2 || echo 1)

run: setup
	$(VENV)/bin/fedaug compare main_digits4 --jobs $(JOBS) --out $(MAIN_OUT) $(ARGS)
	$(VENV)/bin/fedaug report $(MAIN_OUT)

# The suite spreads over JOBS processes (pytest-xdist), each test going to whichever process is free.
test: setup
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist worksteal $(ARGS)

test-torch:
	@JOBS=$(JOBS) bash scripts/test_torch.sh $(TORCH_ENDS)

test-torch-download:
	@bash scripts/test_torch.sh --download $(TORCH_ENDS)

bench: setup
	$(VENV)/bin/python benchmarks/bench_engine.py $(ARGS)
