#!/usr/bin/env bash
# The training step's speed levers side by side, in one job under 10 minutes (issue 41's method:
# build each lever behind a recipe key on the CPU, measure them all in one job, then one GPU check):
#
#   bash benchmarks/device/levers.sh        on the GPU machine, with .whl/site-cp312.tar.xz (site.sh site)
#
# On the GPU, in this order (each step under its own time limit; everything lands in $OUT as it
# finishes, so a step cut short loses only itself):
#   1. pytest -m gpu on the levers' kernels (tests/model/test_swiglu.py, test_rmsnorm.py,
#      test_ssd.py);
#   2. benchmarks/step_bench.py, kda_300M: ours (defaults), both kernel levers (ours_fast), both with
#      the CUDA graph, FLA's class with our loss (fla_tuned), ours again (the spread);
#   3. zebra_mamba_300M_hybrid at micro 16: defaults, Mamba2's scan on bf16 operands, the compiled
#      glue, everything (ours_mamba_fast); kda_300M's ours_fast at 16 (the pure model's step);
#   4. gdn_300M (ours, ours_fast, fla_tuned);
#   5. benchmarks/profile_step.py of kda_300M (ours_fast) and the hybrid (ours_mamba_fast).
# Micro-batch: 64 on a GPU with more than 100 GB (H200), else 32 (H100) for the 300M models.
# LEVERS_QUICK=1: only 1 and kda_300M's defaults against FLA's kernels (ours_fla_kernels) and FLA
# tuned; LEVERS_BUDGET (default 560 s): the whole job's seconds; LEVERS_STEPS: the steps to run,
# by name or the part before its first underscore (e.g. "tests bench_hybrid bench_kda16"; default all).
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
  case " ${LEVERS_STEPS:-$name} " in *" ${name%%_*} "*|*" $name "*) ;; *) say "$name: not in LEVERS_STEPS"; return ;; esac
  left=$(( T0 + ${LEVERS_BUDGET:-560} - $(date +%s) ))  # the whole job ends inside one 10-minute command
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

run 150 tests "$PY" -m pytest -m gpu -p no:cacheprovider -p no:benchmark -q -rA -s \
  tests/model/test_swiglu.py tests/model/test_rmsnorm.py tests/model/test_ssd.py
cp "$LOG" "$OUT/tests.log"

if [ "${LEVERS_QUICK:-0}" = 1 ]; then  # the defaults against FLA's kernels and FLA tuned only
  run 230 bench_kda "$PY" benchmarks/step_bench.py --preset kda_300M --repeat-ours \
    --runs ours:$M ours_fla_kernels:$M fla_tuned:$M --json-out "$OUT/bench_kda.json"
else
run 170 bench_kda "$PY" benchmarks/step_bench.py --preset kda_300M --repeat-ours \
  --runs ours:$M ours_fast:$M ours_fast_graph:$M fla_tuned:$M --json-out "$OUT/bench_kda.json"
run 170 bench_hybrid "$PY" benchmarks/step_bench.py --preset zebra_mamba_300M_hybrid \
  --runs ours:16 ours_ssd_mixed:16 ours_glue:16 ours_mamba_fast:16 --json-out "$OUT/bench_hybrid.json"
run 50 bench_kda16 "$PY" benchmarks/step_bench.py --preset kda_300M --runs ours_fast:16 \
  --json-out "$OUT/bench_kda16.json"
run 90 bench_gdn "$PY" benchmarks/step_bench.py --preset gdn_300M \
  --runs ours:$M ours_fast:$M fla_tuned:$M --json-out "$OUT/bench_gdn.json"
for spec in "kda_300M:$M:ours_fast" "zebra_mamba_300M_hybrid:16:ours_mamba_fast"; do
  IFS=: read -r preset micro impl <<< "$spec"
  run 45 "profile_${preset}_$impl" "$PY" benchmarks/profile_step.py --preset "$preset" \
    --micro "$micro" --impl "$impl" --out "/tmp/prof_${preset}"
  cp "/tmp/prof_${preset}/profile.md" "$OUT/profile_${preset}_${impl}_micro$micro.md" 2>/dev/null
done
fi
say "done"
"$PY" benchmarks/device/levers_table.py < "$LOG" | tee "$OUT/table.txt"
