#!/usr/bin/env bash
# Test fedaug at the ends of its torch range (pyproject.toml): `make test-torch`, which CI runs after `make test`.
# For each torch release given (the Makefile's TORCH_ENDS): a virtual environment .venv-torch-<release> with that
# torch (PyPI's Linux wheel: a CUDA build, which runs on the CPU; no registry reachable here serves a CPU build of
# these releases), then fedaug[test] installed beside it under the constraint torch==<release>, so that pip fails
# rather than replace it, then the part of the test suite that exercises torch: every module imported, the install
# check, the numerics (seeded streams, batched and captured steps, the recorded runs of every method), attach
# hooks, the models' split points. The compiled CPU libraries, the Triton kernel and the optional extras are tested
# on the main environment (make test).
# `--download RELEASE...` (`make test-torch-download`) only fetches each release's wheels (with its requirements,
# about 2-2.5 GB from PyPI) into .venv-torch-wheels/<release>, so that CI can fetch them while `make test` keeps
# the CPUs busy; the installation takes them from there and then deletes them. (Installing them during `make test`
# too was tried: the suite ran 35 % slower, on two cores, no faster in all.) pip installs without compiling
# bytecode (`--no-compile`): Python compiles what the tests import, a fraction.
# Idempotent: a second call reuses each environment and only runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SUBSET=(
  tests/test_install.py tests/test_dependencies.py::test_a_core_install_imports_every_module_but_those_of_the_extras
  tests/core/test_rng.py tests/core/test_serialize.py tests/core/test_device.py
  tests/layers/test_attach.py tests/layers/test_mixing.py
  tests/engine/test_grouped.py tests/engine/test_graphed.py tests/engine/replay
  tests/models/test_split.py
)
download=0
if [ "${1:-}" = "--download" ]; then download=1; shift; fi

# The wheels of torch $1 and of its requirements, into .venv-torch-wheels/$1 (once).
fetch() {
  local dir=".venv-torch-wheels/$1"
  [ -f "$dir/.complete" ] && return
  mkdir -p "$dir"
  echo "torch==$1" > "$dir/constraints.txt"
  # PIP_CONSTRAINT replaces the constraint file of pip's own configuration (a machine may cap torch there).
  PIP_CONSTRAINT="$dir/constraints.txt" "$PY" -m pip download -q --disable-pip-version-check --dest "$dir" "torch==$1"
  touch "$dir/.complete"
}

# The environment .venv-torch-$1: torch $1 from its fetched wheels, fedaug[test] beside it (once; again after
# pyproject.toml changes).
install() {
  local release=$1 venv=".venv-torch-$1" start=$SECONDS
  local stamp="$venv/.fedaug-installed"
  [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && return
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  echo "torch==$release" > "$venv/constraints.txt"
  export PIP_CONSTRAINT="$venv/constraints.txt"
  if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null)" \
       != "$release" ]; then
    fetch "$release"
    "$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check --no-index \
      --find-links ".venv-torch-wheels/$release" "torch==$release"
    rm -rf ".venv-torch-wheels/$release"
  fi
  "$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check -e ".[test]"
  # Triton's interpreter before 3.7 (torch 2.11 pins 3.6) cannot run under numpy 2.4 (fedaug refuses
  # kernel="triton" on the CPU there, naming the fix): such an end takes numpy<2.4, so that its Triton tests run.
  if ! TRITON_INTERPRET=1 "$venv/bin/python" -c \
       "from fedaug.layers import triton_ffa as t; raise SystemExit(not t.interpreter_runs())" 2>/dev/null; then
    "$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check "numpy<2.4"
    echo "test-torch: triton $("$venv/bin/python" -c 'import triton; print(triton.__version__)')'s interpreter" \
         "needs numpy<2.4: installed numpy $("$venv/bin/python" -c 'import numpy; print(numpy.__version__)')"
  fi
  unset PIP_CONSTRAINT
  echo "test-torch: torch $release and fedaug[test] installed in $venv in $((SECONDS - start)) s" \
       "($(du -sh "$venv" | cut -f1))"
  touch "$stamp"
}

for release in "$@"; do
  venv=".venv-torch-$release"
  if [ "$download" = 1 ]; then
    [ -f "$venv/.fedaug-installed" ] || fetch "$release"
    continue
  fi
  install "$release"
  got=$("$venv/bin/python" -c "import torch; print(torch.__version__)")
  [ "${got%%+*}" = "$release" ] || { echo "test-torch: $venv holds torch $got, not $release" >&2; exit 1; }
  echo "test-torch: torch $got"
  "$venv/bin/python" -m pytest -q -n "${JOBS:-1}" --dist worksteal "${SUBSET[@]}"
done
