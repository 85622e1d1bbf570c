#!/usr/bin/env bash
# Loss curves of one recipe with and without a set of overrides, then `zebractl compare` (the
# accuracy half of a speed lever: issue 41 keeps a lever as a default only with its parity):
#
#   bash benchmarks/device/curves.sh DATA OUT RECIPE ITERS MICRO [--set KEY=VALUE ...]
#
# Trains RECIPE twice from the same seed on the prepared dataset DATA (ITERS iterations, micro =
# global = MICRO, warm-up ITERS/10, no checkpoint): "defaults" as given, "levers" with the --set
# arguments; writes OUT/curves.{defaults,levers}.metrics.jsonl, curve_*.log and
# OUT/curves.compare.json (A = levers, B = defaults). PY (default python3) runs zebractl;
# CURVES_NAME (default curves) names the files instead (NAME.*, NAME_*.log).
set -uo pipefail
DATA=$1 OUT=$2 RECIPE=$3 ITERS=$4 MICRO=$5; shift 5
PY=${PY:-python3}
T=(--set "data.paths=[{path: $DATA}]" --set data.tokenizer=null --set parallelism.num_gpus=1
   --set validation=null --set logging.tensorboard=false --set logging.interval=10
   --set batch.micro="$MICRO" --set batch.global="$MICRO" --set schedule.iterations="$ITERS"
   --set schedule.warmup_iterations=$(( ITERS / 10 > 0 ? ITERS / 10 : 1 )) --set checkpoint.enabled=false)
runs=${CURVES_RUNS:-/tmp/zruns}
name=${CURVES_NAME:-curves}
for v in levers defaults; do
  extra=(); [ "$v" = levers ] && extra=("$@")
  # a fresh run directory: a second call on a warm machine would otherwise append its run to the
  # first call's metrics.jsonl (zebractl keeps a run directory's history), and the files copied
  # below would hold both runs
  rm -rf "${runs:?}/${name}_$v"
  "$PY" -m zebractl train "$RECIPE" "${T[@]}" "${extra[@]}" --output "$runs/${name}_$v" \
    > "$OUT/${name%s}_$v.log" 2>&1 || { echo "$name: $v failed (see $OUT/${name%s}_$v.log)"; exit 1; }
  cp "$runs/${name}_$v/metrics.jsonl" "$OUT/$name.$v.metrics.jsonl"
done
"$PY" -m zebractl compare "$runs/${name}_levers" "$runs/${name}_defaults" --json > "$OUT/$name.compare.json"
