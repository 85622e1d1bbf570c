#!/usr/bin/env bash
# The GPU check (issue 25): one job on one GPU that runs the GPU tests, measures throughput
# against FLA's own classes, checks loss parity with FLA and evaluates, then writes ONE record
# (check_record.py) named DATE-COMMIT.json. benchmarks/device/README.md ("The check") says more.
#
#   bash benchmarks/device/check.sh start [OUTDIR]  remote machine, first command: copy the tree to
#                                                   /tmp/zrepo, unpack .whl/*.tar.xz, seed the kernel
#                                                   cache, launch the job under setsid; ~60 s
#   bash benchmarks/device/check.sh wait SECONDS    then, once or more: follow the job until done or
#                                                   SECONDS pass (well under the runner's command
#                                                   limit: <= 580 for 10 minutes), copy the record,
#                                                   logs.tgz and key files to $OUT, print the table
#   bash benchmarks/device/check.sh local [OUTDIR]  the machine with one CUDA GPU and the packages
#                                                   installed (no tarballs): the same job, foreground
# For a GPU machine reached through a command runner that may cut a command after some minutes:
# start and wait each return well within such a limit while the job runs detached between them.
# OUTDIR: where the finished job copies its files. When $OUT is set (the folder a runner brings
# back), the `wait` command copies into its own $OUT instead; otherwise the default is
# benchmarks/results/gpu-check/local-<UTC date>.
#
# TIME BUDGET (a fresh H200, start included): CHECK_BUDGET=720 s counted from the start of `start`.
# Every step runs under `timeout` for the smaller of its cap and what is left of the budget less a
# 20 s reserve for the record; a step with under 10 s left is skipped (recorded, with the reason).
#   setup   <=  60 s  copy, unpack the three tarballs in parallel (xz -T0), byte-compile the site,
#                     nvidia-smi, versions, a fresh ZEBRACTL_CACHE_DIR seeded with the shipped
#                     tuned kernel configurations (zebractl's kernel_cache.configure(), checked)
#   perf    ~= 270 s  ALONE on the GPU, first (nothing else runs until it ends):
#                     zebractl train kda_300M (cap 150) and gdn_300M (cap 120) through the CLI, micro
#                     = global = 64, 4 iterations, tokens/s + MFU of iterations 2-4; these warm the
#                     kernel cache for the shapes; then benchmarks/step_bench.py --runs
#                     fla_shipped:64 fla_tuned:64 per recipe (cap 120 each): FLA's classes FLA's way;
#                     with CHECK_PERF_EXTRA (default on) also bench_micro16 (cap 300), stall_kda_300M
#                     (cap 120) and, over 100 GB, the 1B hybrids as shipped (cap 300 each): up to
#                     17 minutes more, so a full check on an H200 wants CHECK_BUDGET ~1500
#   then side by side on an H200 (parity's own throughput is not a claim, so sharing the GPU is
#   acceptable; on a GPU under 100 GB parity and eval run first, then the tests, one at a time):
#     tests ~= 390 s  pytest -m gpu tests/model tests/convert tests/train (cap: the rest of the
#                     budget; stopped with SIGTERM -> KeyboardInterrupt, so the junit XML of the
#                     tests that ran is still written). ~529 s cold on the last fresh machine: it
#                     is the phase the budget cuts unless it gets faster (two xdist workers by default)
#     parity ~= 180 s train kda_300M micro 16 / global 64, 30 iterations (cap 180), then
#                     zebractl compare RUN --fla --assert --json (cap 200; trains FLA's class)
#     eval   ~=  60 s after parity: zebractl eval PARITY_RUN --tasks arc_easy --limit 100 (cap 150)
#   record  <=   5 s  check_record.py write; files to OUTDIR
#   60 + 270 + max(390, 240) = 720 s. Commands: start (~60 s) + wait 560 + wait ~120.
#
# Knobs (environment):
#   PHASES="perf tests parity eval"  which phases (default these, always in this order); a phase
#                                    that fails does not stop the others. memory (after perf, alone
#                                    on the GPU) only when named: PHASES=memory CHECK_BUDGET=0
#   CHECK_MEMORY_RUNS="RECIPE[:MICRO|fit[:MODE[:SET,...]]] ..."  the memory phase's runs (default:
#                                    the one-GPU 1B/3B recipes as shipped, the 8B's blocks at depth
#                                    4 and 8, three runs of other recompute modes; issue 27)
#                                    (in a SET, @JOB is the job folder and @CHAT CHECK_CHAT_DATA:
#                                    issue 29's SFT row trains a run from another's checkpoint)
#   CHECK_MEMORY_ITERS=20  CHECK_MEMORY_CAP=300 (seconds per run)
#   CHECK_CHAT_DATA=DIR   a `zebractl prepare --format chat` dataset (absolute path) for @CHAT
#   CHECK_BUDGET=720      overall seconds (0: no overall deadline, the caps alone)
#   CHECK_CAP_SCALE=1     multiply every cap (a slower GPU, locally)
#   CHECK_XDIST=3         pytest -n N --dist load (0 or empty: one process). Two workers (loadfile)
#                         ran 18 of the 19 GPU tests on the H200 on 2026-12-02, none failing; the
#                         slowest test alone took 217 s, so three share the rest
#   CHECK_DRY_RUN=1       setup runs; every GPU command is written to its log instead of run
#   CHECK_FORCE=1         run the GPU phases even where no CUDA GPU was found
#   CHECK_PYTHON=python3  the interpreter (local mode: e.g. .venv/bin/python)
#   CHECK_DATA=DIR        local mode: a prepared dataset (default gpu_data/ or data/demo/)
#   CHECK_CACHE_DIR=DIR   reuse this ZEBRACTL_CACHE_DIR instead of a fresh one (not wiped)
#   CHECK_FLA_VARIANTS="fla_shipped fla_tuned"   step_bench.py's FLA variants (none: no step_bench)
#   CHECK_PERF_EXTRA=1    the perf phase also times zebra_mamba_300M_hybrid, kda_300M and
#                         zebra_gdn_300M_hybrid at micro 16 in one process (bench_micro16) and the
#                         default checkpoint save's training pause (stall_kda_300M) and, on a GPU
#                         over 100 GB, CHECK_PERF_BIG as shipped (4 iterations each); 0: not;
#                         stall: only stall_kda_300M
#   CHECK_PERF_BIG="zebra_mamba_1B_hybrid_1gpu zebra_kda_1B_hybrid_1gpu"   those recipes (empty: none)
#   CHECK_PERF_RECIPES="kda_300M gdn_300M"   the perf phase's recipes (one of them: a shorter job; the
#                         record then says the other was not measured)
#   CHECK_PERF_MICRO=64 (32 on a GPU under 100 GB)   CHECK_EVAL_TASK=arc_easy   CHECK_EVAL_LIMIT=100 (0: no --limit)
#   CHECK_EVAL_CAP=150    CHECK_EVAL_BATCH= (e.g. auto)   the seed suite once, on a warm machine:
#     PHASES="parity eval" CHECK_EVAL_TASK=seed CHECK_EVAL_LIMIT=0 CHECK_EVAL_BATCH=auto \
#     CHECK_EVAL_CAP=600 CHECK_BUDGET=0 bash benchmarks/device/check.sh start
#   or, right after a check on the same (still warm) machine, without training again:
#     CHECK_JOB=/tmp/zseed CHECK_EVAL_RUN=/tmp/zcheck/runs/parity_kda_300M PHASES=eval ... start
#   CHECK_PYTEST_ARGS=    extra pytest arguments, shell words (e.g. "-k 'lm_head or fp8'")
#   CHECK_COMMIT=         the commit, where the tree has no .git (the record says so otherwise)
#   CHECK_JOB=/tmp/zcheck the job folder (logs, runs, the record before it is copied)
set -uo pipefail
export LC_ALL=C PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
JOB=${CHECK_JOB:-/tmp/zcheck}
R=/tmp/zrepo  # the device job's copy of the tree
D=/tmp/zdeps  # the unpacked tarballs: site312/, eval312/, gpu_data/
RESERVE=20
MIN_STEP=10
ALL_PHASES="perf tests parity eval"  # PHASES unset: these
KNOWN_PHASES="perf memory tests parity eval"  # memory: only when named (issue 27's big models)
# the one-GPU recipes as shipped; the 8B's blocks at depth 4 and 8 as its 8-GPU recipe trains them
# (issue 27: the difference is one block's share); recompute modes the shipped ones do not use
MEMORY_RUNS="zebra_kda_1B_hybrid_1gpu zebra_gdn_1B_hybrid_1gpu zebra_mamba_1B_hybrid_1gpu zebra_mamba_3B_hybrid_1gpu zebra_mamba_8B_hybrid:::model.num_blocks=4 zebra_mamba_8B_hybrid:::model.num_blocks=8 zebra_kda_1B_hybrid_1gpu:fit:selective:schedule.iterations=8 zebra_mamba_3B_hybrid_1gpu:fit:full:schedule.iterations=6 zebra_mamba_1B_hybrid_1gpu:fit::data.seq_length=8192,schedule.iterations=8"
PERF_RECIPES=${CHECK_PERF_RECIPES:-kda_300M gdn_300M}  # the perf phase's recipes (the record expects these two)
# with CHECK_PERF_EXTRA, on a GPU over 100 GB: these recipes as shipped, 4 iterations each
PERF_BIG=${CHECK_PERF_BIG-zebra_mamba_1B_hybrid_1gpu zebra_kda_1B_hybrid_1gpu}
PARITY_RECIPE=kda_300M

now() { date +%s; }
progress() {
  local t; t=$(now)
  printf '%s +%ss %s\n' "$(date +%H:%M:%S)" "$(( t - ${T0:-t} ))" "$*" | tee -a "$JOB/progress.txt"
}
# timestamps on each line of a log (EPOCHREALTIME: bash 5; `date` otherwise)
stamp() {
  local line t us
  while IFS= read -r line || [ -n "$line" ]; do
    if [ -n "${EPOCHREALTIME:-}" ]; then
      t=$EPOCHREALTIME us=${EPOCHREALTIME#*.}
      printf '%(%H:%M:%S)T.%s %s\n' "${t%.*}" "${us:0:3}" "$line"
    else
      printf '%s %s\n' "$(date +%H:%M:%S.%3N)" "$line"
    fi
  done
}
clean() { printf '%s' "$*" | tr '\t\n\r' '   ' | cut -c1-600; }
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
meta() { printf '%s=%s\n' "$1" "$(clean "$2")" >> "$JOB/meta.env"; }
envvar() { printf 'export %s=%q\n' "$1" "$2" >> "$JOB/env.sh"; }

# step PHASE NAME CAP SIGNAL CMD...: run CMD under timeout (the smaller of CAP x CHECK_CAP_SCALE
# and the budget left less the reserve); stdout -> logs/NAME.out, stderr (timestamped) ->
# logs/NAME.log (MERGE=1: both to the log). One line in steps.tsv. Returns CMD's exit code, 124 at
# the time limit, 125 when not run.
step() {
  local phase=$1 name=$2 cap=$3 sig=$4; shift 4
  local limit=$(( cap * ${CHECK_CAP_SCALE:-1} )) left status reason="" rc t0 secs
  if [ "${BUDGET:-0}" -gt 0 ]; then
    left=$(( DEADLINE - $(now) - RESERVE ))
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  if [ "$limit" -lt "$MIN_STEP" ]; then
    printf '%s\t%s\tskipped\t\t0\t%s\t%s\n' "$phase" "$name" "$limit" \
      "no time left in the ${BUDGET} s budget" >> "$JOB/steps.tsv"
    progress "$phase: $name skipped (no time left in the budget)"
    return 125
  fi
  progress "$phase: $name (limit ${limit} s)"
  { printf '$'; printf ' %q' "$@"; echo; } > "$JOB/logs/$name.cmd"  # the exact command
  t0=$(now)
  if [ "${MERGE:-0}" = 1 ]; then
    { timeout -s "$sig" -k 30 "$limit" "$@" 2>&1 < /dev/null | stamp > "$JOB/logs/$name.log"
      rc=${PIPESTATUS[0]}; }
  else
    { timeout -s "$sig" -k 30 "$limit" "$@" 2>&1 1>&3 3>&- < /dev/null | stamp > "$JOB/logs/$name.log"
      rc=${PIPESTATUS[0]}; } 3> "$JOB/logs/$name.out"
  fi
  secs=$(( $(now) - t0 ))
  if [ "$rc" = 0 ]; then status=ok
  elif { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ "$secs" -ge $(( limit - 1 )) ]; then
    status=timeout rc=124 reason="stopped at the time limit ($limit s)"
  else status=failed reason="exit $rc"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$phase" "$name" "$status" "$rc" "$secs" "$limit" \
    "$reason" >> "$JOB/steps.tsv"
  progress "$phase: $name $status (rc $rc, ${secs} s)"
  return "$rc"
}
# gpu_step: step, or in a dry run the command written to its log and not run
gpu_step() {
  if [ "${DRY:-0}" = 1 ]; then
    local phase=$1 name=$2; shift 4
    printf 'DRY RUN (CHECK_DRY_RUN=1), not run:\n$ %s\n' "$*" > "$JOB/logs/$name.log"
    printf '%s\t%s\tdry\t\t0\t\tdry run\n' "$phase" "$name" >> "$JOB/steps.tsv"
    progress "$phase: $name (dry run: not run)"
    return 0
  fi
  step "$@"
}

# phases.tsv: phase, status, t0, t1, reason
phase_end() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(now)" "$(clean "${4:-}")" >> "$JOB/phases.tsv"
  progress "== $1 $2${4:+: $(clean "$4" | cut -c1-200)}"
}
# fails[]: why each step of the current phase failed; the phase's status from them
verdict() {  # verdict PHASE T0
  if [ "${DRY:-0}" = 1 ]; then phase_end "$1" skipped "$2" "dry run (CHECK_DRY_RUN=1): commands in logs/, none run"
  elif [ "${#fails[@]}" -eq 0 ]; then phase_end "$1" ok "$2"
  else phase_end "$1" failed "$2" "$(printf '%s; ' "${fails[@]}" | sed 's/; $//')"
  fi
}
why() {  # why STEP RC: one reason for a failed step
  case $2 in
    124) echo "$1 stopped at its time limit" ;;
    125) echo "$1 not run: no time left in the budget" ;;
    *) echo "$1 exited $2" ;;
  esac
}
need_gpu() {  # need_gpu PHASE T0: false (and the phase recorded as skipped) without a GPU
  [ "${GPU_OK:-0}" = 1 ] || [ "${CHECK_FORCE:-0}" = 1 ] || [ "${DRY:-0}" = 1 ] && return 0
  phase_end "$1" skipped "$2" "no CUDA GPU: ${GPU_REASON:-unknown} (CHECK_FORCE=1 runs it anyway)"
  return 1
}
need_data() {
  [ -n "${DATA:-}" ] && [ -d "$DATA" ] && return 0
  [ "${DRY:-0}" = 1 ] && return 0
  phase_end "$1" skipped "$2" "no prepared dataset (device: .whl/gpu-data.tar.xz; local: CHECK_DATA, gpu_data/ or \`zebractl prepare --demo --output data/demo\`)"
  return 1
}
train_args() {  # the data overrides every training run of the check shares
  TRAIN=(--set "data.paths=[{path: $DATA}]" --set data.tokenizer=null
         --set parallelism.num_gpus=1 --set validation=null --set logging.tensorboard=false
         --set logging.interval=1 --set checkpoint.interval=100000 --set checkpoint.keep_last=1)
}

gpu_mib() {  # the first GPU's memory in MiB (0 when unknown)
  local m; m=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  echo "${m:-0}"
}

phase_perf() {
  # micro 64 fits the 300M models on an H200 (141 GB); an 80 GB GPU (H100) takes 32
  local default_micro=64; [ "$(gpu_mib)" -lt 100000 ] && default_micro=32
  local t0; t0=$(now); local fails=() rc recipe micro=${CHECK_PERF_MICRO:-$default_micro} runs=() v
  need_gpu perf "$t0" && need_data perf "$t0" || return 0
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader \
    > "$JOB/gpu_apps_before_perf.csv" 2>/dev/null
  train_args
  local cap
  for recipe in $PERF_RECIPES; do
    cap=150; [ "$recipe" = kda_300M ] || cap=120
    gpu_step perf "perf_$recipe" "$cap" TERM "$PY" -m zebractl train "$recipe" "${TRAIN[@]}" \
      --set batch.micro="$micro" --set batch.global="$micro" --set schedule.iterations=4 \
      --set schedule.warmup_iterations=1 --set checkpoint.enabled=false \
      --output "$JOB/runs/perf_$recipe" --json
    rc=$?; [ $rc = 0 ] || fails+=("$(why "perf_$recipe" $rc)")
  done
  for v in $FLA_VARIANTS; do [ "$v" = none ] || runs+=("$v:$micro"); done
  for recipe in $PERF_RECIPES; do
    [ ${#runs[@]} -gt 0 ] || break  # CHECK_FLA_VARIANTS=none: no FLA side by side
    gpu_step perf "bench_$recipe" 120 TERM "$PY" benchmarks/step_bench.py --preset "$recipe" \
      --runs "${runs[@]}" --json-out "$JOB/bench_$recipe.json"
    rc=$?; [ $rc = 0 ] || fails+=("$(why "bench_$recipe" $rc)")
  done
  local extra=${CHECK_PERF_EXTRA:-1}
  if [ "$extra" = 1 ]; then
    # the hybrids against the pure KDA model at micro 16, one process, defaults (issue 41)
    gpu_step perf bench_micro16 300 TERM "$PY" benchmarks/step_bench.py --preset \
      zebra_mamba_300M_hybrid kda_300M zebra_gdn_300M_hybrid --runs ours:16 \
      --json-out "$JOB/bench_micro16.json"
    rc=$?; [ $rc = 0 ] || fails+=("$(why bench_micro16 $rc)")
  fi
  if [ "$extra" = 1 ] || [ "$extra" = stall ]; then
    # the default checkpoint save's training pause: a save every 3 of 9 iterations
    gpu_step perf stall_kda_300M 120 TERM "$PY" -m zebractl train kda_300M "${TRAIN[@]}" \
      --set batch.micro="$micro" --set batch.global="$micro" --set schedule.iterations=9 \
      --set schedule.warmup_iterations=1 --set checkpoint.interval=3 \
      --output "$JOB/runs/stall_kda_300M" --json
    rc=$?; [ $rc = 0 ] || fails+=("$(why stall_kda_300M $rc)")
  fi
  if [ "$extra" = 1 ]; then
    # the one-GPU 1B hybrids as shipped (their micro- and global batch, seq): they need > 80 GB
    if [ "$(gpu_mib)" -ge 100000 ]; then
      for recipe in $PERF_BIG; do
        gpu_step perf "perf_$recipe" 300 TERM "$PY" -m zebractl train "$recipe" "${TRAIN[@]}" \
          --set schedule.iterations=4 --set schedule.warmup_iterations=1 \
          --set checkpoint.enabled=false --output "$JOB/runs/perf_$recipe" --json
        rc=$?; [ $rc = 0 ] || fails+=("$(why "perf_$recipe" $rc)")
      done
    else
      echo "needs a GPU of more than 80 GB (this one: $(gpu_mib) MiB)" > "$JOB/perf_big_skipped.txt"
    fi
  fi
  verdict perf "$t0"
}

# memory (issue 27): each run of CHECK_MEMORY_RUNS ("RECIPE:MICRO:MODE[:SET,SET...]"; MICRO empty:
# the recipe's, "fit": the largest micro-batch `zebractl plan --fit` finds for this GPU; MODE empty:
# the recipe's recompute.mode) trains CHECK_MEMORY_ITERS iterations on one GPU with global = micro
# (no accumulation: the peak is one micro-batch's either way); its plan (`zebractl plan --json`, the
# same settings) is written beside it, and, for a run of the recipe as shipped (MICRO and MODE empty),
# `zebractl train RECIPE --check --json` too. A run that dies of CUDA OOM is tried once more at 3/4
# of its micro-batch (both runs recorded). record_memory.py puts peak memory, tokens/s, the plan's
# error and the check's memory verdict into the record. No checkpoint is written
# (checkpoint.enabled=false: the 3B's final save took 127 s on the H200, 47 GB of the 64 GB disk).
memory_run() {  # memory_run RECIPE MICRO MODE EXTRA: one training run (fails[] on failure)
  local recipe=$1 micro=$2 mode=$3 extra=$4 name sets=() x rc shipped=no
  [ -z "$micro$mode$extra" ] && shipped=yes  # the recipe as shipped (its --check ran before)
  sets=(--set "schedule.iterations=${CHECK_MEMORY_ITERS:-20}" --set schedule.warmup_iterations=1
        --set checkpoint.enabled=false)
  [ -n "$mode" ] && sets+=(--set "recompute.mode=$mode")
  local IFS_=$IFS; IFS=,; for x in $extra; do sets+=(--set "$x"); done; IFS=$IFS_
  if [ "$micro" = fit ]; then
    micro=$("$PY" -m zebractl plan "$recipe" "${TRAIN[@]}" "${sets[@]}" --gpu-memory "${gib:-139.8}" --json 2>> "$JOB/logs/memory_plan.log" \
      | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["fit"]["micro"] or "")' 2>> "$JOB/logs/memory_plan.log")
    [ -n "$micro" ] || { fails+=("$recipe: plan --fit found no micro-batch"); return 1; }
  elif [ -z "$micro" ]; then
    micro=$("$PY" -m zebractl config show "$recipe" "${TRAIN[@]}" "${sets[@]}" --json 2>> "$JOB/logs/memory_plan.log" \
      | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["config"]["batch"]["micro"])' 2>> "$JOB/logs/memory_plan.log")
    [ -n "$micro" ] || { fails+=("$recipe: config show gave no micro-batch"); return 1; }
  fi
  sets+=(--set "batch.micro=$micro" --set "batch.global=$micro")
  name="memory_${recipe}_m${micro}_${mode:-shipped}${extra:+_$(printf '%s' "$extra" | tr -c 'A-Za-z0-9=\n' '_')}"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$recipe" "$micro" "${mode:-shipped}" "$extra" "$shipped" >> "$JOB/memory_runs.tsv"
  "$PY" -m zebractl plan "$recipe" "${TRAIN[@]}" "${sets[@]}" --json > "$JOB/$name.plan.json" 2>> "$JOB/logs/memory_plan.log"
  gpu_step memory "$name" "${CHECK_MEMORY_CAP:-300}" TERM "$PY" -m zebractl train "$recipe" "${TRAIN[@]}" "${sets[@]}" \
    --output "$JOB/runs/$name" --json
  rc=$?
  [ $rc = 0 ] && return 0
  fails+=("$(why "$name" $rc)")
  if [ "${5:-}" != retry ] && [ "$micro" -gt 1 ] && grep -qi 'out of memory' "$JOB/logs/$name.log" 2>/dev/null; then
    memory_run "$recipe" $(( micro * 3 / 4 )) "$mode" "$extra" retry
  fi
  return $rc
}

phase_memory() {
  local t0; t0=$(now); local fails=() spec recipe micro mode extra gib
  need_gpu memory "$t0" && need_data memory "$t0" || return 0
  train_args
  gib=$(awk -F', ' 'NR==1 {printf "%.1f", $2 / 1024}' "$JOB/gpu.csv" 2>/dev/null)
  : > "$JOB/memory_runs.tsv"
  for spec in ${CHECK_MEMORY_RUNS:-$MEMORY_RUNS}; do
    IFS=: read -r recipe micro mode extra <<< "$spec"
    extra=${extra//@JOB/$JOB}
    if [[ $extra == *@CHAT* ]]; then
      [ -d "${CHECK_CHAT_DATA:-}" ] || { fails+=("$recipe: @CHAT without a CHECK_CHAT_DATA folder"); continue; }
      extra=${extra//@CHAT/$CHECK_CHAT_DATA}
    fi
    if [ -z "$micro$mode$extra" ]; then  # as shipped: its pre-flight check first
      gpu_step memory "check_$recipe" 90 TERM "$PY" -m zebractl train "$recipe" "${TRAIN[@]}" \
        --output "$JOB/runs/check_$recipe" --check --json
      [ $? = 0 ] || fails+=("check_$recipe: zebractl train --check failed")
      cp "$JOB/logs/check_$recipe.out" "$JOB/check_$recipe.json" 2>/dev/null
    fi
    memory_run "$recipe" "$micro" "$mode" "$extra"
  done
  verdict memory "$t0"
}

# -p no:benchmark: the image's pytest-benchmark plugin warns under xdist, and the suite's
# filterwarnings=error turned that into an INTERNALERROR (the check at 539629e, 2026-12-02); no test uses it.
# pytest stopped by timeout's SIGTERM stops as on Ctrl-C (KeyboardInterrupt), so the junit XML of
# the tests that ran is written; SIGINT is re-armed too (a background job starts with it ignored)
PYTEST_MAIN='import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.default_int_handler)
import pytest
sys.exit(pytest.main(sys.argv[1:]))'

phase_tests() {
  local t0; t0=$(now); local fails=() rc xd=() extra=()
  need_gpu tests "$t0" || return 0
  eval "extra=(${CHECK_PYTEST_ARGS:-})"  # shell words: CHECK_PYTEST_ARGS="-k 'lm_head or fp8'"
  # --dist load, not loadfile: each GPU test of tests/convert trains its own tiny preset, and under
  # loadfile the four ran one after another on one worker (364 s of the 359 s of the check at d6dce37)
  case $CHECK_XDIST in ''|0|off|no) ;; *) xd=(-n "$CHECK_XDIST" --dist load) ;; esac
  rm -rf /tmp/zpt
  MERGE=1 gpu_step tests tests 900 TERM "$PY" -c "$PYTEST_MAIN" -m gpu tests/model tests/convert \
    tests/generate tests/train -p no:cacheprovider -p no:benchmark --basetemp=/tmp/zpt -rA -v --junitxml="$JOB/junit.xml" \
    ${xd[@]+"${xd[@]}"} ${extra[@]+"${extra[@]}"}
  rc=$?
  case $rc in
    0) ;;
    1) fails+=("tests failed") ;;  # check_record.py names them from the junit XML
    5) fails+=("pytest collected no tests") ;;
    *) fails+=("$(why pytest $rc)") ;;
  esac
  verdict tests "$t0"
}

phase_parity() {
  local t0; t0=$(now); local fails=() rc run=$JOB/runs/parity_$PARITY_RECIPE
  need_gpu parity "$t0" && need_data parity "$t0" || return 0
  train_args
  gpu_step parity parity_train 180 TERM "$PY" -m zebractl train "$PARITY_RECIPE" "${TRAIN[@]}" \
    --set batch.micro=16 --set batch.global=64 --set schedule.iterations=30 \
    --set schedule.warmup_iterations=3 --output "$run" --json
  rc=$?
  if [ $rc = 0 ]; then
    gpu_step parity parity_compare 200 TERM "$PY" -m zebractl compare "$run" --fla --assert --json
    rc=$?
    case $rc in 0) ;; 3) fails+=("compare: outside tolerance") ;; *) fails+=("$(why parity_compare $rc)") ;; esac
    rm -rf "$run-fla-reference/checkpoints"
  else
    fails+=("$(why parity_train $rc); compare not run")
  fi
  verdict parity "$t0"
}

phase_eval() {
  local t0; t0=$(now); local fails=() rc run=${CHECK_EVAL_RUN:-$JOB/runs/parity_$PARITY_RECIPE}
  if [ "${EVAL_OK:-0}" != 1 ]; then phase_end eval skipped "$t0" "$EVAL_REASON"; return 0; fi
  need_gpu eval "$t0" || return 0
  if [ "${DRY:-0}" != 1 ] && [ -z "${CHECK_EVAL_RUN:-}" ] && ! ls "$run"/checkpoints/iter_* > /dev/null 2>&1; then
    phase_end eval skipped "$t0" "no checkpoint in $run (the parity run did not finish, or PHASES lacks parity; CHECK_EVAL_RUN names another run)"
    return 0
  fi
  ( export PYTHONPATH=$PYTHONPATH${EVAL_PATH:+:$EVAL_PATH}
    lim=(); [ "$EVAL_LIMIT" = 0 ] || lim=(--limit "$EVAL_LIMIT")
    bs=(); [ -z "${CHECK_EVAL_BATCH:-}" ] || bs=(--batch-size "$CHECK_EVAL_BATCH")
    gpu_step eval eval "${CHECK_EVAL_CAP:-150}" TERM "$PY" -m zebractl eval "$run" --tasks "$EVAL_TASK" \
      "${lim[@]}" ${bs[@]+"${bs[@]}"} --device cuda --dtype bf16 --json )
  rc=$?; [ $rc = 0 ] || fails+=("$(why eval $rc)")
  verdict eval "$t0"
}

# ---- setup (both modes): identity of the source, the record's metadata, probes

source_info() {  # source_info TREE
  local commit dirty="" fp
  if [ -n "${CHECK_COMMIT:-}" ]; then
    # the device copy's .git (if any) may be an older checkout than this tree: its
    # status would list committed changes as dirty; the tree fingerprint identifies the tree
    commit=$CHECK_COMMIT; : > "$JOB/dirty.txt"
  elif commit=$(git -C "$1" rev-parse --short HEAD 2>/dev/null); then
    git -C "$1" status --porcelain 2>/dev/null > "$JOB/dirty.txt"
    if [ -s "$JOB/dirty.txt" ]; then dirty=1; else dirty=0; fi
  else
    commit=${CHECK_COMMIT:-nogit}; : > "$JOB/dirty.txt"
  fi
  [ -n "${CHECK_COMMIT:-}" ] && commit=$CHECK_COMMIT
  fp=$("${PY:-python3}" "$HERE/check_record.py" fingerprint "$1" 2>/dev/null)
  printf 'COMMIT=%s\nDIRTY=%s\nFINGERPRINT=%s\n' "$commit" "$dirty" "$fp" > "$JOB/source.env"
}

begin() {  # begin MODE: the job folder, meta.env, env.sh
  T0=$(now)
  case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac  # the job cd's
  if [ -n "${CHECK_CACHE_DIR:-}" ]; then CACHE=$CHECK_CACHE_DIR; else CACHE=$JOB/zcache; fi
  rm -rf "$JOB" && mkdir -p "$JOB/logs" "$JOB/runs" "$JOB/out" "$CACHE" || exit 1
  : > "$JOB/steps.tsv"; : > "$JOB/phases.tsv"; : > "$JOB/progress.txt"
  PHASES=${PHASES:-$ALL_PHASES}
  local p; for p in $PHASES; do
    case " $KNOWN_PHASES " in *" $p "*) ;; *) echo "PHASES: unknown phase $p (known: $KNOWN_PHASES)" >&2; exit 2 ;; esac
  done
  BUDGET=${CHECK_BUDGET:-720}; DEADLINE=$(( T0 + BUDGET ))
  DRY=${CHECK_DRY_RUN:-0}
  FLA_VARIANTS=${CHECK_FLA_VARIANTS:-fla_shipped fla_tuned}
  EVAL_TASK=${CHECK_EVAL_TASK:-arc_easy}; EVAL_LIMIT=${CHECK_EVAL_LIMIT:-100}
  meta MODE "$1"; meta DATE "$(date -u +%Y-%m-%dT%H:%M:%SZ)"; meta T0 "$T0"; meta BUDGET "$BUDGET"
  CHECK_XDIST=${CHECK_XDIST-3}  # unset: three workers; set and empty: one process
  meta PHASES "$PHASES"; meta XDIST "$CHECK_XDIST"; meta DRY_RUN "$DRY"
  meta FLA_VARIANTS "$FLA_VARIANTS"; meta EVAL_TASK "$EVAL_TASK"; meta EVAL_LIMIT "$EVAL_LIMIT"
  meta PERF_RECIPES "$PERF_RECIPES"
  meta HOST "$(hostname 2>/dev/null)"
  progress "check $1: phases $PHASES, budget ${BUDGET} s, job $JOB"
}

# the GPU, the versions, and the kernel cache: a fresh ZEBRACTL_CACHE_DIR that zebractl's
# kernel_cache.configure() points Triton/TileLang at and seeds with the shipped tuned
# configurations; checked here and seeded explicitly if configure() left it empty. Every later
# process (tests included, which never call configure()) gets the same TRITON_CACHE_DIR.
KC_PROBE='import json, os, shlex, sys
env_file, out_file = sys.argv[1:3]
def dump(doc):
    with open(out_file, "w") as f:
        json.dump(doc, f, indent=1)
try:
    from zebractl.runtime import kernel_cache as kc
    c = kc.configure()
except Exception as exc:
    dump({"cuda": None, "error": f"{type(exc).__name__}: {exc}"[:400]})
    sys.exit(1)
if c is None:
    dump({"cuda": False, "reason": "torch.cuda.is_available() is False"})
    sys.exit(0)
explicit = 0
if c.shipped and kc.entries(c.triton)["tuned"] == 0:
    (c.triton / ".zebractl-seeded").unlink(missing_ok=True)
    explicit = kc.seed(c.triton, kc.SHIPPED / c.shipped)
import torch
dump({"cuda": True, "device": torch.cuda.get_device_name(), "stack": c.stack.key,
      "triton": str(c.triton), "tilelang": str(c.tilelang), "sources": c.sources,
      "shipped": c.shipped, "seeded": c.seeded + explicit, "seeded_explicitly": explicit,
      "entries": kc.entries(c.triton), "describe": c.describe()})
with open(env_file, "a") as f:
    for k in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "TRITON_CACHE_AUTOTUNING"):
        f.write(f"export {k}={shlex.quote(os.environ[k])}\n")'

probe() {  # sets GPU_OK / GPU_REASON; writes gpu.csv, versions.json, kernel_cache.json
  local rc
  if ! command -v nvidia-smi > /dev/null; then GPU_REASON="no nvidia-smi"; : > "$JOB/gpu.csv"
  elif nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits \
      > "$JOB/gpu.csv" 2> "$JOB/logs/nvidia-smi.log"; then GPU_REASON=""
  else GPU_REASON="nvidia-smi failed: $(head -c 200 "$JOB/logs/nvidia-smi.log")"; : > "$JOB/gpu.csv"
  fi
  PYTHONPATH=$PYTHONPATH${EVAL_PATH:+:$EVAL_PATH} "$PY" "$HERE/check_record.py" versions \
    > "$JOB/versions.json" 2> "$JOB/logs/versions.log"
  unset TRITON_CACHE_DIR TILELANG_CACHE_DIR TRITON_CACHE_AUTOTUNING
  export ZEBRACTL_CACHE_DIR=$CACHE
  step setup setup_kernel_cache 120 TERM "$PY" -c "$KC_PROBE" "$JOB/env.sh" "$JOB/kernel_cache.json"
  rc=$?
  if "$PY" -c "import json,sys; sys.exit(0 if json.load(open('$JOB/kernel_cache.json')).get('cuda') else 1)" 2>/dev/null; then
    GPU_OK=1
  else
    GPU_OK=0
    [ -n "$GPU_REASON" ] || GPU_REASON=$("$PY" -c "import json; d=json.load(open('$JOB/kernel_cache.json')); print(d.get('reason') or d.get('error'))" 2>/dev/null || echo "the kernel-cache probe failed (rc $rc)")
  fi
  meta GPU_OK "$GPU_OK"; meta GPU_REASON "$GPU_REASON"
  progress "setup: GPU $(head -1 "$JOB/gpu.csv" 2>/dev/null) ok=$GPU_OK ${GPU_REASON}; $("$PY" -c "import json; print(json.load(open('$JOB/kernel_cache.json')).get('describe',''))" 2>/dev/null)"
}

write_env() {  # everything the job (a fresh bash under setsid, or this one) needs
  local v
  for v in MODE REPO SRC JOB T0 BUDGET DEADLINE DRY PY PHASES PYTHONPATH ZEBRACTL_CACHE_DIR DATA \
      ZEBRACTL_TEST_DATA EVAL_OK EVAL_REASON EVAL_PATH EVAL_TASK EVAL_LIMIT GPU_OK GPU_REASON \
      SETUP_OK SETUP_REASON OUTDIR FLA_VARIANTS CHECK_FORCE CHECK_XDIST CHECK_CAP_SCALE \
      CHECK_EVAL_CAP CHECK_EVAL_BATCH \
      CHECK_PYTEST_ARGS CHECK_EVAL_RUN CHECK_PERF_MICRO CHECK_PERF_RECIPES CHECK_MEMORY_RUNS CHECK_MEMORY_ITERS \
      CHECK_MEMORY_CAP CHECK_CHAT_DATA; do
    envvar "$v" "${!v:-}"
  done
}

setup_device() {
  local t0; t0=$(now); local fails=() f pids=() rc
  SETUP_OK=1 SETUP_REASON=""
  source_info "$SRC"
  # a re-synced working tree must not change the running job: it runs from this copy
  rm -rf "$R" && mkdir -p "$R"
  step setup setup_copy 60 TERM bash -c 'tar -C "$1" --exclude=./.whl --exclude=./.venv \
      --exclude=./.git --exclude=./runs --exclude=__pycache__ --exclude=./.pytest_cache \
      --exclude=./.ruff_cache --exclude=./data --exclude=./.gl \
      --exclude="./benchmarks/results/gpu-check/local-*" -cf - . | tar -C "$2" -xf -' _ "$SRC" "$R" \
    || { SETUP_OK=0; SETUP_REASON="copying the tree to $R failed"; }
  REPO=$R
  rm -rf "$D" && mkdir -p "$D"
  for f in site-cp312 eval-cp312 gpu-data; do
    if [ -f "$SRC/.whl/$f.tar.xz" ]; then
      ( xz -T0 -dc "$SRC/.whl/$f.tar.xz" | tar -C "$D" -xf - ) > "$JOB/logs/unpack_$f.log" 2>&1 &
      pids+=($!)
    else
      echo "missing: .whl/$f.tar.xz" >> "$JOB/logs/unpack.log"
    fi
  done
  for f in "${pids[@]}"; do wait "$f" || echo "an unpack failed (see logs/unpack_*.log)" >> "$JOB/logs/unpack.log"; done
  progress "setup: unpacked $(ls "$D" | tr '\n' ' ')($(( $(now) - t0 )) s since start)"
  if [ -d "$D/site312" ]; then
    # what `pip install` does after unpacking (imports were seconds slower without it)
    step setup setup_compile 60 TERM bash -c '"$1" -m compileall -q -j 16 "${@:2}" > /dev/null 2>&1; exit 0' \
      _ "$PY" "$D/site312" $([ -d "$D/eval312" ] && echo "$D/eval312")
    PYTHONPATH=$D/site312:$R
  else
    PYTHONPATH=$R
    if [ "$DRY" = 1 ]; then echo "dry run: no .whl/site-cp312.tar.xz, continuing" >> "$JOB/logs/unpack.log"
    else SETUP_OK=0; SETUP_REASON="no site packages: .whl/site-cp312.tar.xz missing or not unpacked (carry .whl)"
    fi
  fi
  export PYTHONPATH
  if [ -d "$D/eval312" ]; then
    EVAL_OK=1 EVAL_REASON="" EVAL_PATH=$D/eval312
  else
    EVAL_OK=0 EVAL_PATH="" EVAL_REASON="no .whl/eval-cp312.tar.xz (the lm-eval stack was not carried)"
  fi
  if [ -d "$D/gpu_data" ]; then DATA=$D/gpu_data
  elif [ -d "$SRC/gpu_data" ]; then DATA=$SRC/gpu_data  # copied unpacked, with the tree
  else DATA=""
  fi
  ZEBRACTL_TEST_DATA=$DATA
  cd "$R" || exit 1
  probe
  if [ "$SETUP_OK" = 1 ]; then phase_end setup ok "$t0"; else phase_end setup failed "$t0" "$SETUP_REASON"; fi
  write_env
}

setup_local() {
  local t0; t0=$(now); local fails=()
  SETUP_OK=1 SETUP_REASON="" REPO=$SRC
  source_info "$SRC"
  export PYTHONPATH=$SRC${PYTHONPATH:+:$PYTHONPATH}
  DATA=${CHECK_DATA:-${ZEBRACTL_TEST_DATA:-}}
  if [ -z "$DATA" ]; then
    for d in "$SRC/gpu_data" "$SRC/data/demo"; do [ -d "$d" ] && { DATA=$d; break; }; done
  fi
  [ -n "$DATA" ] && DATA=$(cd "$DATA" 2>/dev/null && pwd)
  ZEBRACTL_TEST_DATA=$DATA  # empty: the tests prepare the demo corpus themselves
  EVAL_PATH=""
  if "$PY" -c "import lm_eval, datasets" > /dev/null 2>&1; then EVAL_OK=1 EVAL_REASON=""
  else EVAL_OK=0 EVAL_REASON="lm_eval (or datasets) is not importable: pip install 'zebractl[eval]' and the eval data package"
  fi
  cd "$SRC" || exit 1
  probe
  if ! "$PY" -c "import zebractl" > /dev/null 2>&1; then SETUP_OK=0 SETUP_REASON="$PY cannot import zebractl"; fi
  if [ "$SETUP_OK" = 1 ]; then phase_end setup ok "$t0"; else phase_end setup failed "$t0" "$SETUP_REASON"; fi
  write_env
}

# ---- the job (after setup; under setsid on the device, in the foreground locally)

job() {
  set +u  # an unset variable must not end the job before its record is written
  trap '[ -f "$JOB/DONE" ] || finish' EXIT
  # shellcheck disable=SC1091
  source "$JOB/env.sh"; cd "$REPO" || exit 1
  export PYTHONPATH ZEBRACTL_CACHE_DIR ZEBRACTL_TEST_DATA
  [ "$MODE" = device ] && echo $$ > "$JOB/pid"
  progress "job started (pid $$)"
  if [ "$SETUP_OK" != 1 ]; then
    local p; for p in $PHASES; do phase_end "$p" skipped "$(now)" "setup failed: $SETUP_REASON"; done
  else
    has perf && phase_perf  # alone on the GPU
    has memory && phase_memory  # alone too: its peaks are the claim
    local tests_pid=""
    if [ "$(gpu_mib)" -lt 100000 ]; then  # 80 GB: parity's two runs and the tests do not fit together
      has parity && phase_parity
      has eval && phase_eval
      has tests && phase_tests
    else
      if has tests; then phase_tests & tests_pid=$!; fi
      has parity && phase_parity
      has eval && phase_eval
      [ -n "$tests_pid" ] && wait "$tests_pid"
    fi
  fi
  finish
}

collect() {  # collect DEST [--partial]: the record and at most 8 more files into DEST
  local dest=$1 partial=${2:-} rec size
  mkdir -p "$dest"
  rec=$("$PY" "$HERE/check_record.py" write "$JOB" "$dest" $partial 2> "$JOB/logs/record.log") \
    || { echo "check_record.py failed: $(tail -3 "$JOB/logs/record.log")"; return 1; }
  "$PY" "$HERE/check_record.py" summary "$rec" > "$dest/summary.txt" 2>> "$JOB/logs/record.log"
  cp "$JOB/progress.txt" "$dest/progress.txt" 2>/dev/null
  [ -f "$JOB/junit.xml" ] && cp "$JOB/junit.xml" "$dest/junit.xml"
  local md; md=$(ls "$JOB"/runs/parity_*/reports/compare-*/compare.md 2>/dev/null | head -1)
  [ -n "$md" ] && cp "$md" "$dest/compare.md"
  # every autotune winner the job's kernel cache holds, in the shipped archives' layout
  # (<hash>/<kernel>.autotune.json): what may be added to zebractl/runtime/kernel_configs later
  local tdir; tdir=$("$PY" -c "import json; print(json.load(open('$JOB/kernel_cache.json')).get('triton') or '')" 2>/dev/null)
  if [ -n "$tdir" ] && [ -d "$tdir" ]; then
    ( cd "$tdir" && find . -mindepth 2 -maxdepth 2 -name '*.autotune.json' | sed 's|^\./||' | sort \
        | tar cJf "$dest/autotune.tar.xz" -T - ) 2>/dev/null || rm -f "$dest/autotune.tar.xz"
  fi
  tar czf "$dest/logs.tgz" -C "$JOB" --exclude=./zcache --exclude=./out --exclude='*/checkpoints' \
    --exclude='*.tfevents*' --exclude='*data_cache*' --exclude='*.pt' --exclude='*.safetensors' \
    --exclude='*.tar.xz' --exclude='trace.json*' . 2>/dev/null
  size=$(stat -c %s "$dest/logs.tgz" 2>/dev/null || echo 0)
  if [ "$size" -gt $(( 15 * 1024 * 1024 )) ]; then  # what comes back: <= 16 MiB a file
    ( cd "$JOB" && find . -path ./zcache -prune -o -path ./out -prune -o -type f -size -2M \
        \( -name '*.log' -o -name '*.out' -o -name '*.json' -o -name '*.jsonl' -o -name '*.xml' \
           -o -name '*.txt' -o -name '*.tsv' -o -name '*.env' -o -name '*.md' -o -name '*.csv' \) -print \
      | tar czf "$dest/logs.tgz" -T - )
  fi
  echo "$rec"
}

finish() {
  meta T_END "$(now)"
  local rec; rec=$(collect "$JOB/out")
  progress "record: $rec"
  if [ -n "${OUTDIR:-}" ]; then
    mkdir -p "$OUTDIR" && cp "$JOB"/out/* "$OUTDIR"/ && progress "copied to $OUTDIR: $(ls "$JOB/out" | tr '\n' ' ')"
  fi
  touch "$JOB/DONE"
}

running() {  # the job's own pid (it writes it), else the launcher's until it does
  local f
  [ -f "$JOB/DONE" ] && return 1
  for f in "$JOB/pid" "$JOB/launcher.pid"; do
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && return 0
  done
  return 1
}

# ---- the three commands

cmd_start() {
  if running; then echo "a check is already running ($JOB): call wait" >&2; exit 1; fi
  PY=${CHECK_PYTHON:-python3} MODE=device
  begin device
  if [ -n "${1:-}" ]; then OUTDIR=$(mkdir -p "$1" && cd "$1" && pwd)
  elif [ -n "${OUT:-}" ]; then OUTDIR=""  # a runner's $OUT: the `wait` command copies into its own
  else OUTDIR=$SRC/benchmarks/results/gpu-check/local-$(date -u +%Y-%m-%d)
  fi
  setup_device
  JOB=$JOB setsid bash "$R/benchmarks/device/check.sh" _job > "$JOB/job.out" 2>&1 < /dev/null &
  echo $! > "$JOB/launcher.pid"
  progress "started the job (pid $!, setsid) after $(( $(now) - T0 )) s: now call \`check.sh wait 560\`"
  cat "$JOB/gpu.csv" 2>/dev/null
}

cmd_wait() {
  local secs=${1:-560} start=$SECONDS partial="" dest
  [ -d "$JOB" ] && [ -f "$JOB/env.sh" ] || { echo "no check has started here ($JOB): call start first" >&2; exit 1; }
  [ "$secs" -gt 580 ] && echo "note: wait $secs leaves little of a 600 s call for the copy"
  # shellcheck disable=SC1091
  PY=$(source "$JOB/env.sh"; echo "$PY"); T0=$(source "$JOB/env.sh"; echo "$T0")
  HERE=$(source "$JOB/env.sh"; echo "$REPO")/benchmarks/device  # the job's own record writer
  while [ ! -f "$JOB/DONE" ] && running && [ $(( SECONDS - start )) -lt $(( secs - 10 )) ]; do sleep 5; done
  if [ ! -f "$JOB/DONE" ]; then
    if running; then partial=--partial; echo "the job is still running: a partial record follows; call wait again"
    else echo "the job ended without finishing (see job.out):"; tail -5 "$JOB/job.out"
    fi
  fi
  cat "$JOB/progress.txt"
  if [ -n "$partial" ] && [ -f "$JOB/logs/tests.log" ]; then
    echo "tests so far: $(grep -cE '(PASSED|FAILED|ERROR|SKIPPED) *(\[|$)|::\S+ (PASSED|FAILED|ERROR|SKIPPED)' "$JOB/logs/tests.log") results in logs/tests.log"
  fi
  local name
  while IFS=$'\t' read -r _ name status _; do  # the last lines of each failed step's log
    case $status in failed|timeout)
      echo "== $name ($status): last lines of logs/$name.log"
      grep -vE '^\S+ *$' "$JOB/logs/$name.log" 2>/dev/null | tail -6 | cut -c1-300 ;;
    esac
  done < "$JOB/steps.tsv"
  if [ -n "${OUT:-}" ]; then dest=$OUT; else dest=$JOB/out; fi
  if [ -n "$partial" ] || [ ! -f "$JOB/DONE" ]; then collect "$dest" $partial > /dev/null
  elif [ "$dest" != "$JOB/out" ]; then cp "$JOB"/out/* "$dest"/
  fi
  echo "files in $dest: $(ls "$dest" | tr '\n' ' ')"
  echo
  cat "$dest/summary.txt" 2>/dev/null
}

cmd_local() {
  PY=${CHECK_PYTHON:-python3} MODE=local
  begin local
  OUTDIR=${1:-$SRC/benchmarks/results/gpu-check/local-$(date -u +%Y-%m-%d)}
  mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
  setup_local
  ( job ) 2>&1 | tee -a "$JOB/job.out"
  echo
  cat "$JOB/out/summary.txt" 2>/dev/null
}

case ${1:-} in
  start) shift; cmd_start "$@" ;;
  wait) shift; cmd_wait "$@" ;;
  local) shift; cmd_local "$@" ;;
  _job) job ;;  # internal: the job under setsid (started by `start`)
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
