set -u
ts() { date +%H:%M:%S; }
log() { echo "$(ts) $*" >> $J/progress; }
T="python3 -m zebractl"
B=benchmarks/step_bench.py
RUN=(--set "data.paths=[{path: $R/gpu_data}]" --set data.tokenizer=null --set logging.tensorboard=false
     --set parallelism.num_gpus=1 --set validation=null --set data.num_workers=2 --set logging.interval=1)
stamp() { while IFS= read -r l; do echo "$(date +%H:%M:%S.%3N) $l"; done; }
log start
# ---- C: cold starts, each with its own empty kernel cache; stopped (SIGKILL) after iteration 3
cold() {
  local name=$1 p=$2; shift 2
  local out=$J/runs/cold_$name
  local t0; t0=$(date +%s.%N)
  echo "$(date +%H:%M:%S.%3N) launch" > $J/cold_$name.log
  ( ZEBRACTL_CACHE_DIR=/tmp/zcold_$name $T train $p "${RUN[@]}" --set batch.micro=16 \
      --set batch.global=16 --set schedule.iterations=50 --set schedule.warmup_iterations=0 \
      --set checkpoint.interval=100000 "$@" --output $out 2>&1 | stamp >> $J/cold_$name.log ) &
  for _ in $(seq 1 3000); do
    [ "$(grep -c '"kind": *"train"' $out/metrics.jsonl 2>/dev/null)" -ge 3 ] && break
    grep -qE "Traceback|Error" $J/cold_$name.log && break
    sleep 0.1
  done
  pkill -9 -f "output $out" ; wait
  python3 -c "
import json
r=[json.loads(l) for l in open('$out/metrics.jsonl') if '\"train\"' in l]
print('COLD $name: launch->iter1 %.1f s; iterations 2-3 %s tok/s' % (r[0]['wall_time']-$t0, [round(x['tokens_per_s']) for x in r[1:3]]))" >> $J/cold.txt 2>&1
  log "C $name $(tail -1 $J/cold.txt)"
}
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }
if has C; then
  cold kda_300M kda_300M
  mkdir -p /tmp/zcache && cp -a /tmp/zcold_kda_300M/. /tmp/zcache/
  log "disk $(df -h /tmp | tail -1)"
fi
# ---- K: checkpoint stall at 300M (Megatron engine as in the second session; a save every 3;
# the 64 GiB disk holds few 4.25 GB checkpoints: keep one, delete each run's after it)
CK=(kda_300M "${RUN[@]}" --set optimizer.impl=megatron --set batch.micro=16 --set batch.global=16
    --set schedule.iterations=9 --set schedule.warmup_iterations=2 --set checkpoint.interval=3
    --set checkpoint.keep_last=1)
if has K; then
  $T train "${CK[@]}" --set checkpoint.async_save=true --output $J/runs/ckpt_async 2>&1 | stamp > $J/ckpt_async.log
  log "K async rc=$? disk $(df -h /tmp | tail -1)"
  du -sh $J/runs/ckpt_async/checkpoints/* >> $J/ckpt_async.log 2>&1
  rm -rf $J/runs/ckpt_async/checkpoints
fi
# ---- T: GPU tests (resume bitwise: async saves through the arena, the distributed optimizer)
if has T; then
  timeout 600 python3 -m pytest -m gpu tests/train/test_engine_gpu.py \
    -k "plain_async_save or distributed_optimizer" -q -p no:cacheprovider -W default -rs -s \
    --basetemp=/tmp/zpt > $J/gpu_tests.log 2>&1
  log "T gpu tests rc=$?"
  rm -rf /tmp/zpt
fi
if has P; then
  timeout 600 python3 -m pytest -m gpu tests/train/test_precompile.py -q -p no:cacheprovider \
    -W default -rs -s --basetemp=/tmp/zpt > $J/gpu_tests_precompile.log 2>&1
  log "T precompile test rc=$?"
fi
if has CO; then cold kda_300M_noprecompile kda_300M --set kernels.precompile=false; fi
# ---- PR: the profile of ours (the recipe's engine) and of FLA tuned, alone on the GPU
if has PR; then
  for impl in ours fla_tuned; do
    python3 benchmarks/profile_step.py --preset kda_300M --micro 16 --impl $impl \
      --out $J/profile_kda300_m16_$impl > $J/profile_$impl.log 2>&1
    log "PR profile $impl rc=$?"
  done
fi
# ---- B: side-by-side throughput (alone on the GPU): the LM-head chunk count, FP8 MLP
if has B; then
  python3 $B --preset kda_300M --runs ours:16 ours_chunks8:16 ours_chunks4:16 ours_chunks2:16 \
    ours_fp8:16 ours_fp8_chunks4:16 ours_fp8_rowwise_chunks4:16 fla_tuned:16 fla_shipped:16 \
    ours:64 ours_chunks8:64 ours_fp8:64 fla_tuned:64 --repeat-ours \
    --json-out $J/bench_kda_300M.json > $J/bench_kda_300M.log 2>&1
  log "B kda_300M rc=$?"
  python3 $B --preset gdn_300M --runs ours:16 ours_chunks4:16 ours_fp8_chunks4:16 fla_tuned:16 \
    fla_shipped:16 ours:64 ours_chunks8:64 fla_tuned:64 --repeat-ours \
    --json-out $J/bench_gdn_300M.json > $J/bench_gdn_300M.log 2>&1
  log "B gdn_300M rc=$?"
fi
# ---- I13: issue 13 (convert -> verify on the GPU, the loss ours vs HF)
if has I13; then
  OUT13=$J bash benchmarks/device/issue13_job.sh > $J/issue13.out 2>&1
  log "I13 rc=$? $(tr '\n' ' ' < $J/issue13.out | cut -c1-600)"
fi
# ---- L: 1B and the Mamba hybrid beside FLA's classes (ours only where FLA has none); the shipped
# 1B/hybrid recipes combine torch_fused with the distributed optimizer, which train refuses
if has L; then
  for p in kda_1B gdn_1B; do
    python3 $B --preset $p --runs ours:16 fla_tuned:16 fla_shipped:16 ours_fp8:16 --repeat-ours \
      --set parallelism.distributed_optimizer=false --json-out $J/bench_$p.json > $J/bench_$p.log 2>&1
    log "L bench $p rc=$?"
  done
  python3 $B --preset zebra_mamba_300M_hybrid --runs ours:16 ours_fp8:16 --repeat-ours \
    --set parallelism.distributed_optimizer=false \
    --json-out $J/bench_zebra_mamba_300M_hybrid.json > $J/bench_zebra_mamba_300M_hybrid.log 2>&1
  log "L bench hybrid rc=$?"
fi
# ---- F: the FP8 MLP's 100-iteration loss trajectory on the shipped engine, one run after the other
if has F; then
  LT=(kda_300M "${RUN[@]}" --set batch.micro=16 --set batch.global=32 --set schedule.iterations=100
      --set schedule.warmup_iterations=10 --set checkpoint.interval=100000)
  $T train "${LT[@]}" --output $J/runs/lt_bf16 > $J/lt_bf16.log 2>&1
  log "F bf16 rc=$?"
  $T train "${LT[@]}" --set kernels.fp8_mlp=tensorwise --output $J/runs/lt_fp8 > $J/lt_fp8.log 2>&1
  log "F fp8 rc=$?"
  rm -rf $J/runs/lt_*/checkpoints
fi
log DONE
