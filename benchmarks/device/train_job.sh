#!/usr/bin/env bash
# Driver for the issue-5/6 training runs on the lent two-H200 machine (see benchmarks/README.md).
#   install DIR    install the carried wheels in DIR into /tmp/site (two calls: the wheels exceed one
#                  call's 64 MiB)
#   start          launch the job in the background (setsid). Phase 1 (parallel): the GPU tests of the
#                  Megatron engine, and short 300M runs that fill the Triton autotune cache. Phase 2
#                  (one run at a time): the timed 300M runs on 1 and 2 GPUs at global batch 64.
#   wait SECONDS   follow the job until it finishes, fails, or SECONDS pass; copy logs and metrics
#                  into $OUT
# Data: gpu_data/ (carried), the demo corpus prepared with the GPT-2 tokenizer (3.4M tokens).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
JOB=/tmp/zjob
mkdir -p "$JOB" "$TRITON_CACHE_DIR"

case "$1" in
install)
  exec bash benchmarks/device/run.sh install "$2"
  ;;
start)
  python3 -c "import fla, tilelang, megatron.core, pydantic, pytest; print('imports ok')" || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, fla, megatron.core as m; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'mcore', m.__version__)"
  cat > "$JOB/job.sh" <<'EOF'
set -u
ts() { date +%H:%M:%S; }
# train NAME NPROC RECIPE MICRO IMPL [extra --set ...]
train() {
  local name=$1 nproc=$2 recipe=$3 micro=$4 impl=$5 its=$6; shift 6
  local t0=$SECONDS
  python3 -m zebractl train $recipe --nproc $nproc --output $JOB/runs/$name \
    --set 'data.paths=[{path: gpu_data}]' --set batch.micro=$micro --set batch.global=64 \
    --set schedule.iterations=$its --set schedule.warmup_iterations=5 --set logging.interval=5 \
    --set checkpoint.interval=100000 --set data.num_workers=0 --set optimizer.impl=$impl --set parallelism.num_gpus=$nproc "$@" \
    > $JOB/$name.log 2>&1
  echo "$(ts) $name rc=$? $((SECONDS - t0))s" >> $JOB/progress
}
if [ -n "${ZJOB_WARM:-}" ]; then  # fills the Triton autotune cache, both mixers at once
  echo "$(ts) phase 1" >> $JOB/progress
  ( CUDA_VISIBLE_DEVICES=1 train warm_kda 1 kda_300M 16 torch_fused 6 ) &
  ( CUDA_VISIBLE_DEVICES=0 train warm_gdn 1 gdn_300M 16 torch_fused 6 ) &
  wait
fi
echo "$(ts) phase 2" >> $JOB/progress
ZEBRACTL_TEST_DATA=gpu_data timeout 300 python3 -m pytest -m gpu tests/train/test_engine_gpu.py -q \
  -W default -p no:cacheprovider > $JOB/gpu_tests.log 2>&1
echo "$(ts) gpu tests rc=$?" >> $JOB/progress
export CUDA_VISIBLE_DEVICES=0,1
for spec in ${ZJOB_RUNS:-kda_1g_torch:1:kda:16:torch_fused kda_2g_torch:2:kda:16:torch_fused \
    gdn_1g_torch:1:gdn:16:torch_fused kda_1g_mega:1:kda:16:megatron kda_2g_mega_dist:2:kda:16:megatron \
    gdn_1g_mega:1:gdn:16:megatron gdn_2g_mega_dist:2:gdn:16:megatron kda_1g_mega_m64:1:kda:64:megatron \
    gdn_1g_mega_m64:1:gdn:64:megatron}; do
  IFS=: read name n mixer micro impl <<< "$spec"
  extra=(); [[ $name == *dist* ]] && extra=(--set parallelism.distributed_optimizer=true)
  its=30; [ "$micro" = 64 ] && its=15
  train $name $n ${mixer}_300M $micro $impl $its "${extra[@]}"
done
echo "$(ts) DONE" >> $JOB/progress
EOF
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
    sleep 10
  done
  cat "$JOB/progress" 2>/dev/null
  for f in "$JOB"/*.log; do echo "== $f"; grep -E "iter |passed|failed|Error|error|Traceback" "$f" | cut -c1-400 | tail -8; done
  mkdir -p "$OUT/runs"
  cp "$JOB"/*.log "$JOB/progress" "$OUT"/ 2>/dev/null
  for d in "$JOB"/runs/*/; do n=$(basename "$d"); mkdir -p "$OUT/runs/$n"; cp "$d"/metrics.jsonl "$OUT/runs/$n/" 2>/dev/null; done
  ;;
esac
