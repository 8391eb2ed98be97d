#!/bin/bash
# The CUDA checks of docs/benchmarks.md ("Devices and precision") in one run, on a machine with a GPU:
# the tests/gpu suite (4 processes), then bench_device.py (engine / bare / lean per model and precision),
# bench_ffa.py (FFA / InstanceNorm with the Triton kernel, kernel = "on", and without it; eager and captured in
# CUDA graphs), profile_round.py
# (where an engine round's time goes against the lean loop's: launches, host waits, fedaug's functions; it also
# names the GPU, torch and CUDA), measure_tolerances.py (each execution against eager steps on CUDA),
# bench_throughput.py --groups (a round's clients trained as batched groups, train.group_clients, against one at a
# time, issue 39), bench_throughput.py --graph (each client's step replayed from CUDA graphs, train.cuda_graph,
# against eager steps, issue 39), bench_throughput.py --defaults (FedFA against FedAvg under the default settings,
# issue 63), most wanted first; then, in a second call, bench_throughput.py (workers sharing the GPU) and the two
# steps of issue 62. Each step has its own time limit and log (in $OUT, default ./gpu-checks: a file a step, what
# a device call brings back), so one step that fails or overruns leaves the others' figures.
# Triton compiles the FFA kernel's variants on first use (in the tests and the benchmark's untimed warm-up steps).
# The limits of the first eight steps add up to 9.5 minutes (a device call may run 10; before bench_defaults took
# bench_throughput's place they took 6.5 minutes on an H100, docs/benchmarks.md); bench_throughput and the two steps
# of issue 62 after them, 6.5 minutes more, go in a second call (STEPS="bench_throughput bench_executions bench_pack");
# STEPS runs a subset, e.g. to rerun what overran with a larger LIMIT (seconds, for every step run).
#   OUT=gpu-checks PYTHON=.venv/bin/python bash benchmarks/gpu_checks.sh
#   STEPS="bench_grouped" LIMIT=400 bash benchmarks/gpu_checks.sh
set -u
out=${OUT:-gpu-checks}
py=${PYTHON:-python3}
mkdir -p "$out"
# the steps of one call when STEPS is not given (the first eight; the other three go in a second call)
FIRST="tests_gpu bench_device bench_ffa profile_round tolerances bench_grouped bench_graph bench_defaults"
export PYTHONPATH=src:.:benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS COMMAND...: run COMMAND under a limit, log to $out/NAME.txt
  local name=$1 limit=${LIMIT:-$2}; shift 2
  case " ${STEPS:-$FIRST} " in *" $name "*) ;; *) return 0 ;; esac
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0)) s" | tee -a "$out/$name.txt"
  tail -n 25 "$out/$name.txt"
}
step tests_gpu 150 "$py" -m pytest -p no:cacheprovider -q -rfEs -m gpu -n 4 tests/gpu
step bench_device 100 "$py" benchmarks/bench_device.py --devices cuda --threads 8 --repeats 3
# bench_ffa: 5 repeats (not 7) to leave room in its limit for the captured columns (3 captures and 5 x 3 x 6 replays
# a model, each replay cheaper than an eager step)
step bench_ffa 75 "$py" benchmarks/bench_ffa.py --device cuda --skip-comm --threads 8 --repeats 5
step profile_round 50 "$py" benchmarks/profile_round.py --device cuda --threads 8
step tolerances 50 "$py" benchmarks/measure_tolerances.py --device cuda --executions grouped captured --methods fedavg scaffold fedfa fedfa_kernel vfda fedrdn flea
step bench_grouped 65 "$py" benchmarks/bench_throughput.py --jobs G --groups 1 10 50 --device cuda --rounds 3 --repeats 1 --threads 8
step bench_graph 40 "$py" benchmarks/bench_throughput.py --jobs G --graph --device cuda --rounds 2 --repeats 1 --threads 8
# issue 63: FedFA against FedAvg as a user who sets only device = "cuda" gets them (cuda_graph and on_device "auto")
step bench_defaults 40 "$py" benchmarks/bench_throughput.py --jobs G --defaults --methods fedavg fedfa --device cuda --rounds 2 --repeats 1 --threads 8
step bench_throughput 40 "$py" benchmarks/bench_throughput.py --jobs W1 M --device cuda --workers 1 2 4 --rounds 2 --repeats 1 --workers-only
# issue 62, after the earlier figures (STEPS="bench_throughput bench_executions bench_pack" runs these three): each seed method one
# client at a time, in groups of 50, in groups of 50 captured, and 5 runs packed on job G; then FedFA Table 1's
# grid (7 methods x 5 seeds, one round each, its Digits-4 replaced by synthetic data of the same shapes: the GPU
# machine has none of the optional data) packed against its cells one at a time (docs/benchmarks.md extrapolates
# to 100 rounds from the packed round times)
step bench_executions 150 "$py" benchmarks/bench_throughput.py --jobs G --executions 50 5 --methods fedfa vfda fedrdn flea --device cuda --rounds 2 --repeats 1 --threads 8
step bench_pack 200 "$py" benchmarks/bench_pack.py --grid fedfa_table1_digits4 --seeds 0 1 2 3 4 --rounds 1 --repeats 1 --set device=cuda data.name=synthetic "data.options={num_clients = 4, samples_per_client = 1258, channels = 3, size = 28, num_classes = 10}"
