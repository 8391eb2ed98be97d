#!/usr/bin/env bash
# Set up fedaug on a fresh machine: a virtual environment with torch 2.13.0 (CPU wheel) installed
# first, fedaug with its data, Flower, privacy, gpu (triton: the FFA layer's CUDA kernel, tested under Triton's
# interpreter without a GPU), tracking and test extras, and (as root) the optional Debian data packages.
# Idempotent: a second call only re-checks. Used by `make run` and `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }

stamp="$VENV/.fedaug-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # torch first, from the local CPU wheel; the constraint stops any dependency pulling another build.
  pip install -q --disable-pip-version-check "torch==2.13.0"
  echo "torch==2.13.0" > "$VENV/constraints.txt"
  pip install -q --disable-pip-version-check -c "$VENV/constraints.txt" -e ".[data,flower,privacy,gpu,tracking,test]"
  touch "$stamp"
fi
# The compiled CPU libraries, built once into ~/.cache/fedaug/kernels: the FFA layer's kernel (docs/fedfa.md)
# for runs that ask for it (method.options.fedfa.kernel = "on"; the default path is pure PyTorch), and the
# server's one-pass arithmetic on uploads (docs/engine.md), which runs use where it is built: same results.
"$VENV/bin/fedaug" kernel >/dev/null || echo "setup: the compiled libraries did not build (see above); runs with" \
  "kernel = \"on\" fail, the server takes its slower PyTorch path, and their tests are skipped until g++ is" \
  "installed" >&2

# Optional Debian data packages (see docs/data.md): Fashion-MNIST, espeak-ng (spoken digits), mricron-data (brain MRI);
# chromium renders `fedaug report` pages headless in tests/report/test_browser.py; g++ builds the FFA kernel.
debs=(dataset-fashion-mnist espeak-ng mricron-data chromium g++)
missing=()
for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null \
      || echo "setup: could not install ${missing[*]}; tests of datasets that need them are skipped," \
              "tests/report/test_browser.py fails without chromium" >&2
  else
    echo "setup: not root: not installing Debian packages ${missing[*]}; tests of datasets that need them" \
         "are skipped, tests/report/test_browser.py fails without chromium (apt-get install chromium)" >&2
  fi
fi
