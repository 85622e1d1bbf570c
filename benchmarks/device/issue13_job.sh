#!/usr/bin/env bash
# Issue 13 on one GPU: a kda_300M and a zebra_gdn_300M_hybrid run of 30 iterations -> convert
# (bf16) -> verify on the GPU -> the same held-out loss from our model and FLA's KDAForCausalLM /
# zebractl's ZebraForCausalLM (benchmarks/convert_check.py --held-out).
#   bash benchmarks/device/issue13_job.sh    (carry .whl and gpu_data; results in $OUT)
# Needs a warm kernel cache to finish in one call: run it after issue12_job.sh's P1 on the same
# machine, or expect ~4 minutes of autotuning in the training run.
set -uo pipefail
cd "$(dirname "$0")/../.."
# Inside issue12_job.sh (phase I13) the packages are unpacked already and OUT13 names its job folder.
[ -d /tmp/site312/fla ] || { tar xJf .whl/site312.tar.xz -C /tmp || exit 1; }
export PYTHONPATH=/tmp/site312:$PWD PYTHONUNBUFFERED=1 ZEBRACTL_TEST_DATA=$PWD/gpu_data ZEBRACTL_CACHE_DIR=${ZEBRACTL_CACHE_DIR:-/tmp/zcache}
J=${OUT13:-$OUT}/issue13 && mkdir -p "$J"
RUN=(--set "data.paths=[{path: $PWD/gpu_data}]" --set data.tokenizer=null --set logging.tensorboard=false
     --set parallelism.num_gpus=1 --set validation=null --set batch.micro=16 --set batch.global=16
     --set schedule.iterations=30 --set schedule.warmup_iterations=3 --set checkpoint.interval=30
     --set "data.split=[95,5,0]")  # 5% of each shard's documents held out: the loss below reads them
for p in kda_300M zebra_gdn_300M_hybrid; do
  # the shipped hybrid recipes ask for the distributed optimizer with torch_fused (refused)
  python3 -m zebractl train $p "${RUN[@]}" --set parallelism.distributed_optimizer=false \
    --set checkpoint.keep_last=1 --output /tmp/z13/run_$p > "$J/train_$p.log" 2>&1
  echo "train $p rc=$?"
  python3 benchmarks/convert_check.py /tmp/z13/run_$p /tmp/z13/hf_$p --dtype bf16 --sequences 8 --held-out \
    --json-out "$J/convert_check_$p.json" > "$J/convert_check_$p.log" 2>&1
  echo "convert_check $p rc=$?"; grep RESULT "$J/convert_check_$p.log"
  python3 -m zebractl verify /tmp/z13/run_$p /tmp/z13/hf_$p --device cuda --json \
    > "$J/verify_$p.json" 2> "$J/verify_$p.log"
  echo "verify $p rc=$?"; tail -5 "$J/verify_$p.log"
  cp /tmp/z13/run_$p/metrics.jsonl "$J/metrics_$p.jsonl" 2>/dev/null
  rm -rf /tmp/z13/run_$p/checkpoints
done
python3 -m pytest -m gpu tests/convert -q -p no:cacheprovider -rs > "$J/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$J/gpu_tests.log"
