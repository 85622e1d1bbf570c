#!/usr/bin/env bash
# Driver for the issue-3 GPU checks on the lent H200 (see benchmarks/README.md).
#   install DIR    install the carried wheels in DIR into /tmp/site (two calls: the wheels exceed one
#                  call's 64 MiB)
#   start          launch the whole job in the background (setsid): phase 1 runs the three kernel
#                  checks and two autotune warm-ups in parallel, phase 2 the timed 300M steps one by one
#   wait SECONDS   follow the job until it finishes, fails, or SECONDS pass; copy logs and the Triton
#                  cache (.tgz) into $OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
JOB=/tmp/zjob
mkdir -p "$JOB" "$TRITON_CACHE_DIR"

case "$1" in
install)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$2"/*.whl && echo "installed $(ls "$2" | wc -l) wheels from $2"
  ;;
start)
  if ls benchmarks/device/triton_cache.tgz.part* >/dev/null 2>&1; then
    cat benchmarks/device/triton_cache.tgz.part* | tar xz -C /tmp && echo "restored Triton cache"
  fi
  python3 -c "import fla, tilelang, megatron.core, pydantic; print('imports ok')" || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  cat > "$JOB/job.sh" <<'EOF'
set -u
B="python3 benchmarks/gpu_model.py"
ts() { date +%H:%M:%S; }
echo "$(ts) phase 1" >> $JOB/progress
( $B kernels --mixer kda; $B step --preset kda_300M --micro 2 ) > $JOB/p1_kda.log 2>&1 &
( $B kernels --mixer gdn; $B step --preset gdn_300M --micro 2 ) > $JOB/p1_gdn.log 2>&1 &
( $B kernels --mixer mamba2 ) > $JOB/p1_mamba2.log 2>&1 &
wait
echo "$(ts) phase 2" >> $JOB/progress
for spec in "kda_300M 16" "gdn_300M 16" "kda_300M 64" "gdn_300M 64"; do
  set -- $spec
  $B step --preset $1 --micro $2 --fla-reference >> $JOB/p2_steps.log 2>&1
  echo "$(ts) done $spec" >> $JOB/progress
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
    if grep -l "Traceback" "$JOB"/*.log 2>/dev/null | head -1 | grep -q .; then echo "TRACEBACK seen"; break; fi
    sleep 10
  done
  cat "$JOB/progress" 2>/dev/null
  for f in "$JOB"/*.log; do echo "== $f"; grep -E "RESULT|Error|error|Traceback" "$f" | cut -c1-600 | tail -20; done
  cp "$JOB/progress" "$OUT"/ 2>/dev/null
  tar czf "$OUT/logs.tgz" -C "$JOB" . 2>/dev/null
  # the Triton/FLA autotune cache, in parts under the 16 MiB per-file limit of what comes back
  tar czf /tmp/triton_cache.tgz -C /tmp triton_cache 2>/dev/null; split -b 15M -d /tmp/triton_cache.tgz "$OUT/triton_cache.tgz.part"
  ls -la "$OUT"
  ;;
esac
