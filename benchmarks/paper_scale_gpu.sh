#!/bin/bash
# The papers' own round counts in pieces that fit a GPU slot (issue 60; docs/benchmarks.md, "Paper-scale runs"):
# runs the paper-scale variants of the stand-in grids (fedaug compare GRID --scale paper: the paper's rounds and
# local epochs, the same data, seeds 0-4), packed, with CUDA graphs and deterministic kernels, for at most SECONDS,
# continuing what results/ holds, and leaves ONE tarball in $OUT (default ./paper-scale): every grid it touched,
# archived with the newest checkpoint of each unfinished cell. Run it from the repository's root. Merge the tarball
# into results/ here, then commit results/ (the next call, on a fresh machine with the repository's tracked files,
# continues each cell where it stopped):
#   fedaug archive paper_scale.tar.gz results
# The machine needs no data sources: the data travel as a bundle, written beforehand where the sources are and
# carried as .data-bundle (used when it exists, or where FEDAUG_DATA_BUNDLE names one):
#   fedaug data export $(python experiments/paper_scale.py grids) --scale paper --out .data-bundle
# Exit status: 0 every grid finished, 75 the time ran out first (call again), 2 a cell failed or a grid lacked data.
#   OUT=$OUT bash benchmarks/paper_scale_gpu.sh 540                                   # a 10-minute device call
#   DEVICE=cpu GRIDS="my_grid.toml" RESULTS=/tmp/r RUNS=/tmp/runs bash benchmarks/paper_scale_gpu.sh 120   # on a CPU
set -u
seconds=${1:?usage: paper_scale_gpu.sh SECONDS}
root=$(dirname "$0")/..
py=${PYTHON:-python3}
export PYTHONPATH=$root/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -z "${FEDAUG_DATA_BUNDLE:-}" ] && [ -d .data-bundle ]; then export FEDAUG_DATA_BUNDLE=.data-bundle; fi
read -r -a grids <<< "${GRIDS:-}"
exec "$py" "$root/experiments/paper_scale.py" run "$seconds" --out "${OUT:-paper-scale}" --device "${DEVICE:-cuda}" \
  --results "${RESULTS:-results}" --runs "${RUNS:-runs/compare}" ${grids[@]+--grids "${grids[@]}"}
