#!/usr/bin/env bash
# Driver for the issue-10 GPU checks on one lent H200 (see benchmarks/README.md, "Run directory and
# Trainer on the GPU").
#   start          unpack the carried site packages (.whl/site312.tar.xz), then launch the job in the
#                  background (setsid): the Megatron-engine GPU tests (sharded optimizer state, bitwise
#                  resume, init-from), a tiny hybrid (MLA RoPE on CUDA) run, and kda_300M runs with
#                  FLA kernels: uninterrupted, and stopped by SIGTERM then resumed
#   wait SECONDS   follow the job until it finishes, fails, or SECONDS pass; copy logs and metrics
#                  into $OUT
# Data: gpu_data/ (carried), the demo corpus prepared with the GPT-2 tokenizer (3.4M tokens).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site312:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache \
  TILELANG_CACHE_DIR=/tmp/tilelang_cache
JOB=/tmp/zjob
mkdir -p "$JOB" "$TRITON_CACHE_DIR" "$TILELANG_CACHE_DIR"

case "$1" in
start)
  rm -rf "$JOB" && mkdir -p "$JOB"  # a warm machine keeps the last job's files
  [ -d /tmp/site312 ] || tar xJf .whl/site312.tar.xz -C /tmp || exit 1
  python3 -c "import fla, tilelang, megatron.core, pydantic, pytest; print('imports ok')" || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, fla, megatron.core as m; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'mcore', m.__version__)"
  cat > "$JOB/job.sh" <<'JOBEOF'
set -u
ts() { date +%H:%M:%S; }
COMMON=(--set 'data.paths=[{path: gpu_data}]' --set data.split=[98,2,0] --set data.tokenizer=null --set logging.tensorboard=false)
KDA=(kda_300M "${COMMON[@]}" --set batch.micro=16 --set batch.global=64 --set schedule.iterations=20
     --set schedule.warmup_iterations=5 --set logging.interval=1 --set checkpoint.interval=10
     --set checkpoint.keep_last=0 --set optimizer.impl=megatron --set parallelism.num_gpus=1
     --set 'validation={interval: 10, iterations: 1}' --set data.num_workers=2)
echo "$(ts) gpu tests" >> $JOB/progress
[ -n "${ZJOB_NO_TESTS:-}" ] || ZEBRACTL_TEST_DATA=gpu_data timeout 400 python3 -m pytest -m gpu tests/train/test_engine_gpu.py -q \
  -W default -p no:cacheprovider > $JOB/gpu_tests.log 2>&1; rc=$?
echo "$(ts) gpu tests rc=$rc" >> $JOB/progress
python3 -m zebractl train tiny_hybrid "${COMMON[@]}" --set kernels.backend=torch --set optimizer.impl=megatron \
  --set precision=bf16 --set schedule.iterations=10 --set 'validation={interval: 5, iterations: 2}' \
  --output $JOB/runs/hybrid --json > $JOB/hybrid.json 2> $JOB/hybrid.log; rc=$?
echo "$(ts) tiny_hybrid rc=$rc" >> $JOB/progress
# run NAME ARGS...: uninterrupted, then the same stopped by SIGTERM after its ${STOP_AT}th logged
# iteration and resumed to the end (the losses must equal the uninterrupted run's)
run() {
  local name=$1; shift
  python3 -m zebractl train "$@" --output $JOB/runs/${name}_full --json > $JOB/${name}_full.json \
    2> $JOB/${name}_full.log; rc=$?
  echo "$(ts) ${name}_full rc=$rc" >> $JOB/progress
  python3 -m zebractl train "$@" --output $JOB/runs/${name}_stop > $JOB/${name}_stop.log 2>&1 &
  local pid=$!
  while kill -0 $pid 2>/dev/null; do
    n=$(grep -c '"kind":"train"' $JOB/runs/${name}_stop/metrics.jsonl 2>/dev/null || echo 0)
    if [ "${n:-0}" -ge $STOP_AT ]; then kill -TERM $pid; break; fi
    sleep 0.2
  done
  wait $pid; rc=$?
  echo "$(ts) ${name}_stop rc=$rc" >> $JOB/progress
  python3 -m zebractl train "$@" --output $JOB/runs/${name}_stop >> $JOB/${name}_stop.log 2>&1; rc=$?
  echo "$(ts) ${name}_resume rc=$rc" >> $JOB/progress
}
STOP_AT=7
for job in ${ZJOB_RUNS:-kda}; do
  case $job in
  kda) run kda "${KDA[@]}" ;;
  gdn) run gdn gdn_300M "${KDA[@]:1}" --set optimizer.impl=torch_fused --set schedule.iterations=12 \
         --set checkpoint.interval=6 --set 'validation={interval: 6, iterations: 1}' ;;
  esac
done
echo "$(ts) DONE" >> $JOB/progress
JOBEOF
  JOB=$JOB setsid bash "$JOB/job.sh" > "$JOB/job.out" 2>&1 < /dev/null &
  echo "started"
  ;;
wait)
  end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    if grep -q DONE "$JOB/progress" 2>/dev/null; then break; fi
    if grep -l "Traceback" "$JOB"/*.log 2>/dev/null | grep -v gpu_tests | head -1 | grep -q .; then
      echo "TRACEBACK seen"; break
    fi
    sleep 5
  done
  cat "$JOB/progress" 2>/dev/null
  for f in "$JOB"/*.log; do echo "== $f"; grep -E "iter |saved|passed|failed|Error|error|Traceback|stopping|resumed" "$f" | cut -c1-300 | tail -12; done
  tar czf "$OUT/issue10_gpu.tgz" -C "$JOB" --exclude='checkpoints' --exclude='data_cache' . 2>/dev/null
  ls -la "$OUT"
  ;;
esac
