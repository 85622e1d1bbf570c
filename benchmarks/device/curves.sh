#!/usr/bin/env bash
# Loss curves of one recipe with and without a set of overrides, then `zebractl compare` (the
# accuracy half of a speed lever: issue 41 keeps a lever as a default only with its parity):
#
#   bash benchmarks/device/curves.sh DATA OUT RECIPE ITERS MICRO [--set KEY=VALUE ...]
#
# Trains RECIPE twice from the same seed on the prepared dataset DATA (ITERS iterations, micro =
# global = MICRO, warm-up ITERS/10, no checkpoint): "defaults" as given, "levers" with the --set
# arguments; writes OUT/curves.{defaults,levers}.metrics.jsonl, curve_*.log and
# OUT/curves.compare.json (A = levers, B = defaults). PY (default python3) runs zebractl.
set -uo pipefail
DATA=$1 OUT=$2 RECIPE=$3 ITERS=$4 MICRO=$5; shift 5
PY=${PY:-python3}
T=(--set "data.paths=[{path: $DATA}]" --set data.tokenizer=null --set parallelism.num_gpus=1
   --set validation=null --set logging.tensorboard=false --set logging.interval=10
   --set batch.micro="$MICRO" --set batch.global="$MICRO" --set schedule.iterations="$ITERS"
   --set schedule.warmup_iterations=$(( ITERS / 10 > 0 ? ITERS / 10 : 1 )) --set checkpoint.enabled=false)
runs=${CURVES_RUNS:-/tmp/zruns}
for v in levers defaults; do
  extra=(); [ "$v" = levers ] && extra=("$@")
  "$PY" -m zebractl train "$RECIPE" "${T[@]}" "${extra[@]}" --output "$runs/curve_$v" \
    > "$OUT/curve_$v.log" 2>&1 || { echo "curves: $v failed (see $OUT/curve_$v.log)"; exit 1; }
  cp "$runs/curve_$v/metrics.jsonl" "$OUT/curves.$v.metrics.jsonl"
done
"$PY" -m zebractl compare "$runs/curve_levers" "$runs/curve_defaults" --json > "$OUT/curves.compare.json"
