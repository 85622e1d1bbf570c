#!/usr/bin/env bash
# Asynchronous checkpoint saves on one lent H200: gdn_300M (megatron engine, micro 16, global 64)
# saving every 4 iterations, once with async saves (the default) and once with
# checkpoint.async_save=false, to measure how long each save pauses training; then the GPU tests of
# the Megatron engine and of async saves. Carry .whl (site312.tar.xz) and gpu_data; logs come back
# in $OUT. Usage: bash benchmarks/device/async_save_job.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site312:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache \
  TILELANG_CACHE_DIR=/tmp/tilelang_cache
mkdir -p "$TRITON_CACHE_DIR" "$TILELANG_CACHE_DIR" /tmp/zjob
[ -d /tmp/site312 ] || tar xJf .whl/site312.tar.xz -C /tmp || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ts() { date +%H:%M:%S; }
RUN=(gdn_300M --set 'data.paths=[{path: gpu_data}]' --set data.tokenizer=null
     --set logging.tensorboard=false --set batch.micro=16 --set batch.global=64
     --set schedule.iterations=16 --set schedule.warmup_iterations=5 --set logging.interval=1
     --set checkpoint.interval=4 --set checkpoint.keep_last=0 --set optimizer.impl=megatron
     --set parallelism.num_gpus=1 --set validation=null --set data.num_workers=2)
for mode in true false; do  # the first run also pays the cold Triton autotuning
  limit=$([ $mode = true ] && echo 240 || echo 150)
  timeout $limit python3 -m zebractl train "${RUN[@]}" --set checkpoint.async_save=$mode \
    --output /tmp/zjob/async_$mode > "$OUT/gdn_async_$mode.log" 2>&1
  echo "$(ts) async_save=$mode rc=$?"
  grep -E "saving|saved|complete in|^iter|done:|rror" "$OUT/gdn_async_$mode.log" | cut -c1-160
done
echo "$(ts) gpu tests"
ZEBRACTL_TEST_DATA=gpu_data timeout 170 python3 -m pytest -q -p no:cacheprovider -W default \
  tests/train/test_engine_gpu.py tests/train/test_async_save.py tests/run/test_checkpoint_async.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "$(ts) gpu tests rc=$? $(tail -1 "$OUT/gpu_tests.log")"
