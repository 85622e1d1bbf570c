#!/usr/bin/env bash
# The training step's speed levers side by side, in one job under 10 minutes (issue 41's method:
# build each lever behind a recipe key on the CPU, measure them all in one job, then one GPU check):
#
#   bash benchmarks/device/levers.sh        on the GPU machine, with .whl/site-cp312.tar.xz (site.sh site)
#
# On the GPU, in this order (each step under its own time limit; everything lands in $OUT as it
# finishes, so a step cut short loses only itself):
#   ce       benchmarks/ce_kernel_bench.py: the LM-head loss's softmax part alone, FLA's kernels
#            against the one-pass kernel's configurations (kernels.cross_entropy);
#   bench_kda  benchmarks/step_bench.py, kda_300M: ours (defaults), the one-pass cross-entropy
#            (ours_ce_one_pass), the CUDA graph (ours_graph), ours again (the spread); LEVERS_BENCH_RUNS
#            names other step_bench variants (e.g. "ours ours_ce_one_pass"), LEVERS_BENCH_PRESETS
#            other presets (e.g. "kda_300M gdn_300M"), LEVERS_BENCH_LIMIT its seconds (170);
#   bench_hybrid  one process, micro 16: zebra_mamba_300M_hybrid, kda_300M and zebra_gdn_300M_hybrid,
#            each with the defaults and with both Mamba2 levers (ours_mamba_fast; refused on the
#            models without Mamba2, which is recorded);
#   curves   benchmarks/device/curves.sh: zebra_mamba_300M_hybrid trained LEVERS_CURVE_ITERS (200)
#            iterations at micro 16 with the defaults and with both Mamba2 levers off (fp32 scan,
#            eager glue) from the same seed, then `zebractl compare` (curves.compare.json);
#   fp8      (only when named) LEVERS_FP8_RECIPE (zebra_mamba_1B_hybrid_1gpu) at micro 16: step_bench's
#            ours, ours_fp8 (tensorwise) and ours_fp8_rowwise side by side (bench_fp8.json), then
#            curves.sh with kernels.fp8_mlp=LEVERS_FP8_MODE (rowwise) against bf16 over
#            LEVERS_CURVE_ITERS iterations (fp8_curves.*, fp8_curves.compare.json: issue 41 asks the
#            loss within 0.5%);
#   profile  benchmarks/profile_step.py of kda_300M, gdn_300M (micro M) and zebra_mamba_300M_hybrid
#            (micro 16), the defaults: profile_*.md and .json;
#   gputests  pytest -m gpu over LEVERS_PYTEST_ARGS (default: tests/generate tests/convert).
# Only when named in LEVERS_STEPS (not in the default list):
#   startup  benchmarks/startup_probe.py: train's start-up before setup, by stage (byte-compiled site),
#            FLA imported whole and lean (LEVERS_STARTUP_MODES), LEVERS_STARTUP_REPEAT rounds (default 1);
#   compiled  benchmarks/device/compiled_set.sh: the compiled kernels of gdn_300M and kda_300M
#            (this GPU's tuned set; on an H200 the H100's too) into $OUT and this tree's
#            kernel_configs/, so that the cold start after it seeds them;
#   coldstart  benchmarks/coldstart.py, kda_300M at micro M (LEVERS_COLDSTART_RECIPE and
#            LEVERS_COLDSTART_MICRO name others): the defaults (shipped: the compiled
#            kernels seeded) against kernels.shipped_compiled=false (old), alternated twice after
#            a throwaway run, each a fresh process with a fresh kernel cache
#            (LEVERS_COLDSTART_VARIANTS="NAME=SET[,SET] ..." and LEVERS_COLDSTART_ORDER=NAME,NAME,...
#            name others; LEVERS_COLDSTART_WARMED=NAME,...: those runs follow `zebractl warmup`;
#            LEVERS_COLDSTART_PRIME=0: no throwaway run first);
#   decode   benchmarks/decode_bench.py: kda_300M and zebra_mamba_1B_hybrid_1gpu at 1k/8k/32k, the
#            engine eager and graphed, FLA's class (kda_300M), the dense Llama and generate() before
#            the generation cache.
# Micro-batch: 64 on a GPU with more than 100 GB (H200), else 32 (H100) for the 300M models.
# LEVERS_QUICK=1: only tests and kda_300M's defaults against FLA's kernels (ours_fla_kernels) and
# FLA tuned; LEVERS_BUDGET (default 560 s): the whole job's seconds; LEVERS_STEPS: the steps to
# run, by name or the part before its first underscore (e.g. "bench curves"; default "ce bench
# curves profile"; the cold start and decode steps take a command each: LEVERS_STEPS="compiled coldstart",
# then LEVERS_STEPS=decode on the same warm machine). A second
# call on the same (warm) machine reuses the unpacked packages and data.
# Files in $OUT: levers.log (everything), bench_*.json, curve*, profile_*.md, tests.log.
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
  case " ${LEVERS_STEPS:-ce bench curves profile} " in *" ${name%%_*} "*|*" $name "*) ;; *) say "$name: not in LEVERS_STEPS"; return ;; esac
  left=$(( T0 + ${LEVERS_BUDGET:-560} - $(date +%s) ))  # the whole job ends inside one 10-minute command
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then say "$name: skipped, no time left"; return; fi
  say "$name (limit $limit s): $*"
  timeout -s TERM -k 15 "$limit" "$@" >> "$LOG" 2>&1
  say "$name: exit $?"
}

D=/tmp/zdeps
mkdir -p "$D"
if [ ! -f "$D/.unpacked" ]; then  # a warm machine keeps them from the previous call
  xz -T0 -dc .whl/site-cp312.tar.xz | tar -C "$D" -xf - || { say "unpack failed"; exit 1; }
  if [ -f .whl/gpu-data.tar.xz ]; then xz -T0 -dc .whl/gpu-data.tar.xz | tar -C "$D" -xf -; fi
  python3 -m compileall -q -j 0 "$D/site312" > /dev/null 2>&1  # what pip install does; not timed
  touch "$D/.unpacked"
fi
export PYTHONPATH=$D/site312:$PWD ZEBRACTL_CACHE_DIR=/tmp/zcache
PY=python3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
M=32; [ "${MEM:-0}" -gt 100000 ] && M=64
say "setup done; micro $M for the 300M models; commit ${LEVERS_COMMIT:-unknown}"

if [ "${LEVERS_QUICK:-0}" = 1 ]; then  # the defaults against FLA's kernels and FLA tuned only
  run 150 tests "$PY" -m pytest -m gpu -p no:cacheprovider -p no:benchmark -q -rA -s \
    tests/model/test_swiglu.py tests/model/test_rmsnorm.py tests/model/test_ssd.py
  cp "$LOG" "$OUT/tests.log"
  run 230 bench_kda "$PY" benchmarks/step_bench.py --preset kda_300M --repeat-ours \
    --runs ours:$M ours_fla_kernels:$M fla_tuned:$M --json-out "$OUT/bench_kda.json"
else
CURVE_ITERS=${LEVERS_CURVE_ITERS:-200}
DATA=$D/gpu_data
run 60 ce "$PY" benchmarks/ce_kernel_bench.py --json-out "$OUT/ce_kernel.json"
run "${LEVERS_BENCH_LIMIT:-170}" bench_kda "$PY" benchmarks/step_bench.py --preset ${LEVERS_BENCH_PRESETS:-kda_300M} --repeat-ours \
  --runs $(for v in ${LEVERS_BENCH_RUNS:-ours ours_ce_one_pass ours_graph}; do printf '%s:%s ' "$v" "$M"; done) \
  --json-out "$OUT/bench_kda.json"
run 220 bench_hybrid "$PY" benchmarks/step_bench.py --preset zebra_mamba_300M_hybrid kda_300M \
  zebra_gdn_300M_hybrid --runs ours:16 ours_mamba_fast:16 --json-out "$OUT/bench_hybrid.json"
run 300 curves bash benchmarks/device/curves.sh "$DATA" "$OUT" zebra_mamba_300M_hybrid \
  "$CURVE_ITERS" 16 --set kernels.ssd_precision=fp32 --set kernels.compile=none
FP8_RECIPE=${LEVERS_FP8_RECIPE:-zebra_mamba_1B_hybrid_1gpu}
run 200 fp8_bench "$PY" benchmarks/step_bench.py --preset "$FP8_RECIPE" --repeat-ours \
  --runs ours:16 ours_fp8:16 ours_fp8_rowwise:16 --json-out "$OUT/bench_fp8.json"
CURVES_NAME=fp8_curves run 360 fp8_curves bash benchmarks/device/curves.sh "$DATA" "$OUT" \
  "$FP8_RECIPE" "$CURVE_ITERS" 16 --set kernels.fp8_mlp="${LEVERS_FP8_MODE:-rowwise}"
for spec in "kda_300M:$M:ours" "gdn_300M:$M:ours" "zebra_mamba_300M_hybrid:16:ours"; do
  IFS=: read -r preset micro impl <<< "$spec"
  run 100 "profile_${preset}_$impl" "$PY" benchmarks/profile_step.py --preset "$preset" \
    --micro "$micro" --impl "$impl" --out "/tmp/prof_${preset}"
  cp "/tmp/prof_${preset}/profile.md" "$OUT/profile_${preset}_${impl}_micro$micro.md" 2>/dev/null
  cp "/tmp/prof_${preset}/profile.json" "$OUT/profile_${preset}_${impl}_micro$micro.json" 2>/dev/null
done
fi
run 240 gputests "$PY" -m pytest -m gpu -p no:cacheprovider -p no:benchmark -q -rA \
  --junitxml "$OUT/gputests.junit.xml" ${LEVERS_PYTEST_ARGS:-tests/generate tests/convert}
# LEVERS_STARTUP_REPEAT=N: N rounds of the probe in each of LEVERS_STARTUP_MODES (default "plain
# lean": FLA imported whole, and as kernels.lean_fla_import does; "lazy": the compile wrappers
# deferred), alternated, all in startup_probe.jsonl (one JSON per line)
startup_rounds() {
  local i mode
  for i in $(seq 1 "${LEVERS_STARTUP_REPEAT:-1}"); do
    for mode in ${LEVERS_STARTUP_MODES:-plain lean}; do
      "$PY" benchmarks/startup_probe.py $([ $mode = plain ] || echo "--$mode") --json-out "/tmp/probe_$mode$i.json" \
        && tr -d '\n' < "/tmp/probe_$mode$i.json" >> "$OUT/startup_probe.jsonl" && echo >> "$OUT/startup_probe.jsonl"
    done
  done
}
export -f startup_rounds; export PY OUT LEVERS_STARTUP_REPEAT LEVERS_STARTUP_MODES
run 240 startup bash -c startup_rounds
run 300 compiled bash benchmarks/device/compiled_set.sh "$D/gpu_data" "$OUT"
run 540 coldstart "$PY" benchmarks/coldstart.py --recipe "${LEVERS_COLDSTART_RECIPE:-kda_300M}" --data "$D/gpu_data" $([ "${LEVERS_COLDSTART_PRIME:-1}" = 1 ] && echo --prime) --micro "${LEVERS_COLDSTART_MICRO:-$M}" \
  $(for v in ${LEVERS_COLDSTART_VARIANTS:-old=kernels.shipped_compiled=false shipped=}; do printf -- '--variant %s ' "$v"; done) \
  --order "${LEVERS_COLDSTART_ORDER:-old,shipped,old,shipped}" \
  ${LEVERS_COLDSTART_WARMED:+--warmed "$LEVERS_COLDSTART_WARMED"} --timeout 150 --json-out "$OUT/coldstart.json"
# the bench's own budget ends a minute before the step's limit, so its JSON is written
DECODE_BUDGET=$(( T0 + ${LEVERS_BUDGET:-560} - $(date +%s) - 60 ))
[ "$DECODE_BUDGET" -gt 330 ] && DECODE_BUDGET=330
run 400 decode "$PY" benchmarks/decode_bench.py --presets kda_300M zebra_mamba_1B_hybrid_1gpu \
  --impls ${LEVERS_DECODE_IMPLS:-engine engine_graph fla llama hf_generate_before} \
  --contexts 1024 8192 32768 --new-tokens 32 --budget-s "$DECODE_BUDGET" --json-out "$OUT/decode.json"
say "done"
"$PY" benchmarks/device/levers_table.py < "$LOG" | tee "$OUT/table.txt"
