#!/usr/bin/env bash
# Set up fedaug on a fresh machine, in this order: (as root) the optional Debian packages, g++ among them; a
# virtual environment with torch 2.13.0 (CPU wheel) installed first, fedaug with its data, Flower, privacy, gpu
# (triton: the FFA layer's CUDA kernel, tested under Triton's interpreter without a GPU), tracking, ray (the Ray
# fleet, grids on Ray and Flower's simulation runtime, tested on a loopback cluster; 27 distributions, 84 MB of
# wheels, 266 MB installed) and test extras; then fedaug's compiled CPU libraries (`fedaug kernel`). Whatever it
# could not install or build is named on stderr with what that costs. Idempotent: a second call only re-checks.
# Used by `make run` and `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

# Optional Debian packages first (see docs/data.md), so that everything built below can use them:
# Fashion-MNIST, espeak-ng (spoken digits), mricron-data (brain MRI), chromium (renders `fedaug report` pages
# headless in tests/report/test_browser.py) and g++ (compiles fedaug's CPU libraries, next step).
declare -A cost=(
  [dataset-fashion-mnist]="the fashion_mnist data set and its tests are skipped"
  [espeak-ng]="the spoken_digits data set and its tests are skipped"
  [mricron-data]="brain_mri's colin27 and inia19 sites and their tests are skipped"
  [chromium]="tests/report/test_browser.py fails"
  [g++]="fedaug's compiled CPU libraries cannot be built (below)"
)
debs=(dataset-fashion-mnist espeak-ng mricron-data chromium g++)
missing=()
for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null || true
    why="apt-get failed"
  else
    why="not root"
  fi
  for d in "${missing[@]}"; do
    dpkg -s "$d" >/dev/null 2>&1 || echo "setup: Debian package $d is missing ($why; apt-get install $d): ${cost[$d]}" >&2
  done
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }

stamp="$VENV/.fedaug-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # torch first, from the local CPU wheel; the constraint stops any dependency pulling another build.
  # No bytecode compiled at install (--no-compile: a third of the time): Python compiles what is imported.
  pip install -q --no-compile --disable-pip-version-check "torch==2.13.0"
  echo "torch==2.13.0" > "$VENV/constraints.txt"
  pip install -q --no-compile --disable-pip-version-check -c "$VENV/constraints.txt" \
    -e ".[data,flower,privacy,gpu,tracking,ray,test]"
  touch "$stamp"
fi
# fedaug's compiled CPU libraries, built once into ~/.cache/fedaug/kernels: the FFA layer's kernel (docs/fedfa.md)
# for runs that ask for it (method.options.fedfa.kernel = "on"; the default path is pure PyTorch), and the
# server's one-pass arithmetic on uploads (docs/engine.md), which runs use where it is built: same results.
# `fedaug kernel` names each library it could not build, why, and what runs do without it.
"$VENV/bin/fedaug" kernel >/dev/null || echo "setup: fedaug's compiled libraries are not all built (above: which," \
  "why, and what runs do without them); their tests are skipped; fix that (apt-get install g++) and run" \
  "make setup again" >&2
