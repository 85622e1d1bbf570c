#!/usr/bin/env bash
# Driver for the issue-12 GPU work on one lent H200 (results: benchmarks/README.md, "Issue 12").
#   start        copy the repo to /tmp/zrepo (a re-synced working tree cannot change a running job),
#                unpack the carried site packages (.whl/site312.tar.xz), launch the job (setsid)
#   wait SECONDS follow the job until it is DONE or SECONDS pass; copy its logs and results to $OUT
#   cold         on a fresh machine: launch -> end of iteration 1 with empty kernel caches and the
#                tuned configurations shipped in zebractl/runtime/kernel_configs/ (KDA, then GDN)
# Carried: .whl (site packages), gpu_data (the demo corpus, GPT-2 vocabulary). (The first session's
# version of `start` also ran the before/after loss comparison against .gpu_old, the tree of commit
# b2d1ed2: see git history and benchmarks/README.md.)
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD R=/tmp/zrepo J=/tmp/zjob
export PYTHONUNBUFFERED=1 ZEBRACTL_CACHE_DIR=/tmp/zcache ZEBRACTL_TEST_DATA=$R/gpu_data
setup() {
  rm -rf "$R" && cp -a "$SRC" "$R" && rm -rf "$R/.whl"
  rm -rf /tmp/site312 && tar xJf "$SRC/.whl/site312.tar.xz" -C /tmp || exit 1
  export PYTHONPATH=/tmp/site312:$R
  cd "$R"
  python3 -c "import fla, tilelang, megatron.core, pydantic, pytest; print('imports ok')" || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, fla, megatron.core as m; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'mcore', m.__version__)"
}

case "$1" in
start)
  setup
  rm -rf "$J" /tmp/zcache && mkdir -p "$J"
  cat > "$J/job.sh" <<'JOBEOF'
set -u
ts() { date +%H:%M:%S; }
log() { echo "$(ts) $*" >> $J/progress; }
T="python3 -m zebractl"
B=benchmarks/step_bench.py
RUN=(--set "data.paths=[{path: $R/gpu_data}]" --set data.tokenizer=null --set logging.tensorboard=false
     --set parallelism.num_gpus=1 --set validation=null --set data.num_workers=2
     --set optimizer.impl=megatron --set logging.interval=1)
log start
KEY=$(python3 -c "from zebractl.runtime.kernel_cache import current_stack; print(current_stack().key)")
KC=$ZEBRACTL_CACHE_DIR/kernels/$KEY  # where zebractl puts this stack's kernel cache
# ---- P1: autotune every kernel of the benchmarked models (one chain per model: ours, then FLA's own
# classes; the 1B and hybrid models at micro 4 to keep the concurrent chains in memory: the tuned
# configurations are keyed by the kernels' dimensions) while the GPU tests run
for pm in kda_300M:16 gdn_300M:16 kda_1B:4 gdn_1B:4 zebra_mamba_300M_hybrid:4; do
  p=${pm%:*} mb=${pm#*:}
  ( $T warmup $p --set optimizer.impl=megatron --micro $mb --json > $J/warm_$p.json 2> $J/warm_$p.log
    [ "${p#zebra}" = "$p" ] && python3 $B --preset $p --runs fla_shipped:$mb fla_tuned:$mb --warmup 0 \
      --steps 1 > $J/warmfla_$p.log 2>&1
    log "P1 $p done" ) &
done
( timeout 600 python3 -m pytest -m gpu $(grep -rl "mark.gpu" tests --include="*.py") -q \
    -p no:cacheprovider -W default -rs -s > $J/gpu_tests.log 2>&1
  log "P1 gpu tests rc=$?" ) &
wait
# ---- P2: side-by-side throughput, 300M (alone on the GPU): ours, FLA tuned and shipped, the
# fused-add change alone, FP8; ours again at the end
for p in kda_300M gdn_300M; do
  python3 $B --preset $p --runs ours:16,64 fla_tuned:16,64 fla_shipped:16,64 ours_unfused_add:16 \
    ours_fp8:16,64 ours_fp8_rowwise:16 --repeat-ours --json-out $J/bench_$p.json > $J/bench_$p.log 2>&1
  log "P2 bench $p rc=$?"
done
# ---- P3: checkpoint stall (async vs sync), SIGKILL during an async save, resume
CK=(kda_300M "${RUN[@]}" --set batch.micro=16 --set batch.global=16 --set schedule.iterations=12
    --set schedule.warmup_iterations=2 --set checkpoint.interval=4 --set checkpoint.keep_last=0)
$T train "${CK[@]}" --set checkpoint.async_save=true --output $J/runs/ckpt_async > $J/ckpt_async.log 2>&1
log "P3 async rc=$?"
$T train "${CK[@]}" --set checkpoint.async_save=false --output $J/runs/ckpt_sync > $J/ckpt_sync.log 2>&1
log "P3 sync rc=$?"
$T train "${CK[@]}" --set checkpoint.async_save=true --output $J/runs/ckpt_kill > $J/ckpt_kill.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  grep -q "saving .*iter_0000008" $J/ckpt_kill.log 2>/dev/null && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
kill -9 $pid; wait $pid; log "P3 killed during the iter-8 save: rc=$?"
ls -laR $J/runs/ckpt_kill/checkpoints > $J/ckpt_kill.ls 2>&1
$T train "${CK[@]}" --set checkpoint.async_save=true --output $J/runs/ckpt_kill >> $J/ckpt_kill.log 2>&1
log "P3 kill-resume rc=$?"
# ---- P4: the tuned configurations of every kernel above (exported from the shared cache), and a
# cold start from them in a fresh process with empty caches (the fresh machine: `cold`)
$T warmup kda_300M --set optimizer.impl=megatron --micro 16 --export $J/kernel_configs.tar.xz > $J/export.log 2>&1
log "P4 export rc=$?"
cp $J/kernel_configs.tar.xz zebractl/runtime/kernel_configs/$KEY.tar.xz
for p in kda_300M; do
  rm -rf /tmp/zcold_$p
  t0=$(date +%s.%N)
  ZEBRACTL_CACHE_DIR=/tmp/zcold_$p $T train $p "${RUN[@]}" --set batch.micro=16 --set batch.global=16 \
    --set schedule.iterations=1 --set schedule.warmup_iterations=0 --set checkpoint.interval=100000 \
    --output $J/runs/cold_$p > $J/cold_$p.log 2>&1
  rc=$?
  python3 -c "import json,sys; r=[json.loads(l) for l in open('$J/runs/cold_$p/metrics.jsonl')][0]; print('COLD(same machine) $p launch->iter1 %.1f s' % (r['wall_time']-$t0))" >> $J/cold.txt 2>&1
  log "P4 cold $p rc=$rc $(tail -1 $J/cold.txt)"
done
# ---- P5: FP8 loss trajectory against bf16: the same 100-iteration run, both at once
LT=(kda_300M "${RUN[@]}" --set batch.micro=16 --set batch.global=32 --set schedule.iterations=100
    --set schedule.warmup_iterations=10 --set checkpoint.interval=100000)
( $T train "${LT[@]}" --output $J/runs/lt_bf16 > $J/lt_bf16.log 2>&1; log "P5 bf16 rc=$?" ) &
( $T train "${LT[@]}" --set kernels.fp8_mlp=tensorwise --output $J/runs/lt_fp8 > $J/lt_fp8.log 2>&1
  log "P5 fp8 rc=$?" ) &
wait
# ---- P6: the profile after the changes (alone), bf16
python3 benchmarks/profile_step.py --preset kda_300M --micro 16 --out $J/profile_kda300_m16 > $J/profile.log 2>&1
log "P6 profile rc=$?"
# ---- P7: 1B and the Mamba hybrid beside FLA's classes (ours only where FLA has none)
for p in kda_1B gdn_1B; do
  python3 $B --preset $p --runs ours:16 fla_tuned:16 fla_shipped:16 ours_fp8:16 --repeat-ours \
    --set parallelism.distributed_optimizer=false \
    --json-out $J/bench_$p.json > $J/bench_$p.log 2>&1
  log "P7 bench $p rc=$?"
done
python3 $B --preset zebra_mamba_300M_hybrid --runs ours:16 ours_fp8:16 --repeat-ours \
  --set parallelism.distributed_optimizer=false \
  --json-out $J/bench_zebra_mamba_300M_hybrid.json > $J/bench_zebra_mamba_300M_hybrid.log 2>&1
log "P7 bench hybrid rc=$?"
log DONE
JOBEOF
  J=$J R=$R setsid bash "$J/job.sh" > "$J/job.out" 2>&1 < /dev/null &
  echo "started"
  ;;
wait)
  end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    grep -q DONE "$J/progress" 2>/dev/null && break
    sleep 5
  done
  cat "$J/progress" 2>/dev/null
  grep -h "^RESULT" "$J"/bench_*.log 2>/dev/null | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line[7:])
    if r.get('check') == 'step':
        print(r['preset'], r['impl'], r['micro'], 'OOM' if r.get('oom') else
              f\"{r['tokens_per_s']:,} tok/s {r['step_ms']} ms peak {r['peak_gib']} first {r['first_step_s']} s loss {r['loss_first']}\")
"
  for f in "$J"/*.log; do
    grep -lqE "Traceback|Error" "$f" && { echo "== $f"; grep -E "Error|error:" "$f" | cut -c1-300 | tail -4; }
  done
  tail -5 "$J/gpu_tests.log" 2>/dev/null
  cat "$J/cold.txt" 2>/dev/null
  tar czf "$OUT/issue12.tgz" -C "$J" --exclude='checkpoints' --exclude='data_cache' --exclude='*.tar.xz' . 2>/dev/null
  cp "$J/kernel_configs.tar.xz" "$OUT/" 2>/dev/null
  ls -la "$OUT"
  ;;
cold)
  setup
  mkdir -p "$J" && rm -rf /tmp/zcold_*
  RUN=(--set "data.paths=[{path: $R/gpu_data}]" --set data.tokenizer=null --set logging.tensorboard=false
       --set parallelism.num_gpus=1 --set validation=null --set data.num_workers=2
       --set optimizer.impl=megatron --set logging.interval=1)
  for p in kda_300M gdn_300M; do
    t0=$(date +%s.%N)
    ZEBRACTL_CACHE_DIR=/tmp/zcold_$p python3 -m zebractl train $p "${RUN[@]}" --set batch.micro=16 \
      --set batch.global=16 --set schedule.iterations=3 --set schedule.warmup_iterations=0 \
      --set checkpoint.interval=100000 --output $J/runs/cold_$p > $J/cold_$p.log 2>&1
    echo "rc=$?"
    python3 -c "import json; r=[json.loads(l) for l in open('$J/runs/cold_$p/metrics.jsonl')]; print('COLD $p launch->iter1 %.1f s; iterations 2-3 %s tok/s' % (r[0]['wall_time']-$t0, [round(x['tokens_per_s']) for x in r[1:]]))"
    grep -E "kernel cache|iter " $J/cold_$p.log | head -4
  done
  tar czf "$OUT/cold.tgz" -C "$J" --exclude='checkpoints' --exclude='data_cache' . 2>/dev/null
  ;;
esac
