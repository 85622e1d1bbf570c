#!/usr/bin/env bash
# The README's main job from a fresh clone, timed stage by stage: the whole pipeline on the CPU.
#   bash benchmarks/pipeline_cpu.sh [WORKDIR]     (default: a new temporary folder)
# Clones this repository's HEAD into WORKDIR/zebractl, reads the main-job command from README.md
# (the bash block after `<!-- ci: main-job -->`, as CI does) and runs its `&&`-separated stages one
# by one in one shell (venv + install, eval data, prepare, train, convert, verify, eval, compare),
# printing each stage's seconds, the total, and the job's last two lines (verdict, report).
# pip's cache is whatever this machine has: say whether it was warm when you record the numbers.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-$(mktemp -d)}
mkdir -p "$W"
git clone -q --no-hardlinks "$ROOT" "$W/zebractl"
cd "$W/zebractl"
CMD=$(python3 .ci/readme_command.py main-job)
mapfile -t STAGES < <(python3 -c 'import sys; print("\n".join(s.strip() for s in sys.argv[1].split(" && ")))' "$CMD")
echo "main job of $(git rev-parse --short HEAD) in $PWD ($(nproc) CPU cores, $(python3 -c 'import platform; print(platform.python_version())'))"
t0=$(date +%s.%N)
n=0
for s in "${STAGES[@]}"; do
  n=$((n + 1))
  start=$(date +%s.%N)
  eval "$s" > "$W/stage$n.log" 2>&1 || { echo "stage $n FAILED: $s (see $W/stage$n.log)"; tail -5 "$W/stage$n.log"; exit 1; }
  printf '%6.1f s  %s\n' "$(awk "BEGIN {print $(date +%s.%N) - $start}")" "$s"
done
printf '%6.1f s  total\n' "$(awk "BEGIN {print $(date +%s.%N) - $t0}")"
tail -n 2 "$W/stage$n.log"
