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
