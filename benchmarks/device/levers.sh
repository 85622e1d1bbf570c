#!/usr/bin/env bash
# The training step's speed levers side by side, in one device call (issue 41's method: build each
# lever behind a recipe key on the CPU, measure them all in one job, then one GPU check):
#
#   bash benchmarks/device/levers.sh        device tool; carry .whl/site-cp312.tar.xz (site.sh site)
#
# On the GPU, in this order (each step under its own time limit; everything lands in $OUT as it
# finishes, so a step cut short loses only itself):
#   1. pytest -m gpu on the levers' kernels (tests/model/test_swiglu.py, test_rmsnorm.py);
#   2. benchmarks/step_bench.py, kda_300M: ours (defaults), each kernel lever alone, both, both with
#      the CUDA graph, FLA's class with our loss (fla_tuned), ours again (the spread);
#   3. the same for gdn_300M (ours, ours_fast, fla_tuned, ours again);
#   4. benchmarks/profile_step.py of kda_300M with both kernel levers (ours_fast);
#   5. zebra_mamba_300M_hybrid at micro 16 (defaults, ours_fast), and kda_300M's ours_fast at 16.
# Micro-batch: 64 on a GPU with more than 100 GB (H200), else 32 (H100) for the 300M models.
# LEVERS_QUICK=1: only 1 and kda_300M's defaults against FLA's kernels (ours_fla_kernels) and FLA
# tuned; LEVERS_BUDGET (default 560 s): the whole job's seconds.
# Files in $OUT: levers.log (everything), bench_*.json, profile_*.md, tests.log.
set -uo pipefail
export LC_ALL=C PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/levers-out}
mkdir -p "$OUT"
LOG=$OUT/levers.log
T0=$(date +%s)
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
run() {  # run LIMIT NAME CMD...: the command under timeout, its output appended to the log
  local limit=$1 name=$2 left; shift 2
  left=$(( T0 + ${LEVERS_BUDGET:-560} - $(date +%s) ))  # the whole job ends inside the device call
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then say "$name: skipped, no time left"; return; fi
  say "$name (limit $limit s): $*"
  timeout -s TERM -k 15 "$limit" "$@" >> "$LOG" 2>&1
  say "$name: exit $?"
}

D=/tmp/zdeps
mkdir -p "$D"
xz -T0 -dc .whl/site-cp312.tar.xz | tar -C "$D" -xf - || { say "unpack failed"; exit 1; }
export PYTHONPATH=$D/site312:$PWD ZEBRACTL_CACHE_DIR=/tmp/zcache
PY=python3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
M=32; [ "${MEM:-0}" -gt 100000 ] && M=64
say "setup done; micro $M for the 300M models; commit ${LEVERS_COMMIT:-unknown}"

run 75 tests "$PY" -m pytest -m gpu -p no:cacheprovider -p no:benchmark -q -rA \
  tests/model/test_swiglu.py tests/model/test_rmsnorm.py
cp "$LOG" "$OUT/tests.log"

if [ "${LEVERS_QUICK:-0}" = 1 ]; then  # the defaults against FLA's kernels and FLA tuned only
  run 230 bench_kda "$PY" benchmarks/step_bench.py --preset kda_300M --repeat-ours \
    --runs ours:$M ours_fla_kernels:$M fla_tuned:$M --json-out "$OUT/bench_kda.json"
else
run 230 bench_kda "$PY" benchmarks/step_bench.py --preset kda_300M --repeat-ours \
  --runs ours:$M ours_tiled_norm:$M ours_packed_swiglu:$M ours_fast:$M ours_fast_graph:$M \
  fla_tuned:$M --json-out "$OUT/bench_kda.json"
run 120 bench_gdn "$PY" benchmarks/step_bench.py --preset gdn_300M --repeat-ours \
  --runs ours:$M ours_fast:$M fla_tuned:$M --json-out "$OUT/bench_gdn.json"
for impl in ours_fast; do
  run 60 "profile_kda_$impl" "$PY" benchmarks/profile_step.py --preset kda_300M --micro $M \
    --impl $impl --out "/tmp/prof_$impl"
  cp "/tmp/prof_$impl/profile.md" "$OUT/profile_kda_$impl.md" 2>/dev/null
done
run 150 bench_hybrid "$PY" benchmarks/step_bench.py --preset zebra_mamba_300M_hybrid \
  --runs ours:16 ours_fast:16 --json-out "$OUT/bench_hybrid.json"
run 60 bench_kda16 "$PY" benchmarks/step_bench.py --preset kda_300M --runs ours_fast:16 \
  --json-out "$OUT/bench_kda16.json"
fi
say "done"
"$PY" benchmarks/device/levers_table.py < "$LOG" | tee "$OUT/table.txt"
