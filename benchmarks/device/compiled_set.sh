#!/usr/bin/env bash
# The compiled kernels zebractl ships for a GPU architecture
# (zebractl/runtime/kernel_configs/sm<NN>_torch-<v>_triton-<v>_fla-<v>.compiled.tar.xz):
#
#   bash benchmarks/device/compiled_set.sh DATA OUT     on the GPU machine (levers.sh's `compiled` step)
#
# For each GPU:micro in COMPILED_TUNED (default: this GPU's own shipped tuned set at the micro-batch
# levers.sh uses; on a GPU with more than 100 GB also the H100's at 32): an empty kernel cache,
# seeded with that GPU's shipped tuned configurations, filled by `zebractl warmup` of each recipe
# in COMPILED_RECIPES (default "gdn_300M kda_300M"; RECIPE:MICRO warms that recipe at its own
# micro-batch, e.g. zebra_mamba_300M_hybrid:16) with kernels.shipped_compiled=false (nothing
# stale from an older set), then `--export-compiled`. Each GPU's winners are other kernel
# configurations, so the parts differ; they are merged (one entry per name; with COMPILED_MERGE=1
# the set already in the tree's kernel_configs/ comes first, so its entries stay as they are and
# a build for one GPU adds to what the others built) into
# OUT/compiled_set.tar.xz (OUT/compiled_set.txt names it: <stem>.compiled.tar.xz), which is also
# copied into this tree's kernel_configs/ under its name (a cold start measured after this step
# seeds it). Needs PY (python), levers.sh's environment (PYTHONPATH with the packages, this tree);
# COMPILED_BUILD_DIR (default /tmp) holds the caches it fills. COMPILED_EXPORT_TUNED=1 also writes
# each cache's tuned configurations to OUT/tuned_<gpu>.tar.xz (for recipes whose shapes the shipped
# tuned set lacks: the warmup autotunes them, alone on the GPU).
set -uo pipefail
DATA=$1 OUT=$2
PY=${PY:-python3}
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
SHIPPED=zebractl/runtime/kernel_configs
read -r OWN STEM < <("$PY" -c 'from zebractl.runtime.kernel_cache import current_stack as c; s = c(); print(s.key, s.compiled_key)')
STACK_TAIL=${OWN#*_}  # torch-<v>_triton-<v>_fla-<v>
if [ -z "${COMPILED_TUNED:-}" ]; then
  if [ "${MEM:-0}" -gt 100000 ]; then COMPILED_TUNED="${OWN%%_*}:64 nvidia-h100-80gb-hbm3:32"
  else COMPILED_TUNED="${OWN%%_*}:32"; fi
fi
echo "compiled set $STEM from: $COMPILED_TUNED; recipes ${COMPILED_RECIPES:-gdn_300M kda_300M}"
parts=()
for spec in $COMPILED_TUNED; do
  gpu=${spec%%:*} micro=${spec##*:}
  cache=${COMPILED_BUILD_DIR:-/tmp}/zbuild_$gpu
  rm -rf "$cache" && mkdir -p "$cache/triton" "$cache/tilelang"
  tuned="$SHIPPED/${gpu}_$STACK_TAIL.tar.xz"
  if [ -f "$tuned" ]; then
    "$PY" -c "import sys; from pathlib import Path; from zebractl.runtime import kernel_cache as k; print('seeded', k.seed(Path(sys.argv[1]), Path(sys.argv[2])), 'tuned configurations of', sys.argv[2])" "$cache/triton" "$tuned"
  else
    echo "no tuned set $tuned: the kernels autotune"
  fi
  recipes=(${COMPILED_RECIPES:-gdn_300M kda_300M})
  last=${recipes[${#recipes[@]}-1]}
  for spec_r in "${recipes[@]}"; do
    r=${spec_r%%:*} m=$micro
    [ "$r" != "$spec_r" ] && m=${spec_r##*:}
    extra=()
    [ "$spec_r" = "$last" ] && extra=(--export-compiled "$OUT/part_$gpu.compiled.tar.xz")
    # COMPILED_EXPORT_TUNED=1: the cache's tuned configurations too (the shipped set it was seeded
    # with and whatever the warmups autotuned): OUT/tuned_<gpu>.tar.xz, a superset of the shipped set
    [ "$spec_r" = "$last" ] && [ "${COMPILED_EXPORT_TUNED:-0}" = 1 ] && extra+=(--export "$OUT/tuned_$gpu.tar.xz")
    t0=$(date +%s)
    TRITON_CACHE_DIR=$cache/triton TILELANG_CACHE_DIR=$cache/tilelang TRITON_CACHE_AUTOTUNING=1 \
      "$PY" -m zebractl warmup "$r" --micro "$m" \
      --set "data.paths=[{path: $DATA}]" --set data.tokenizer=null \
      --set kernels.shipped_compiled=false "${extra[@]}" || echo "warmup $r at micro $m failed"
    echo "warmup $r micro $m with $gpu's tuned set: $(( $(date +%s) - t0 )) s"
  done
  [ -f "$OUT/part_$gpu.compiled.tar.xz" ] && parts+=("$OUT/part_$gpu.compiled.tar.xz")
done
[ ${#parts[@]} -gt 0 ] || { echo "no part was built"; exit 1; }
if [ "${COMPILED_MERGE:-0}" = 1 ] && [ -f "$SHIPPED/$STEM.compiled.tar.xz" ]; then
  cp "$SHIPPED/$STEM.compiled.tar.xz" "$OUT/part_shipped.compiled.tar.xz"
  parts=("$OUT/part_shipped.compiled.tar.xz" "${parts[@]}")
  echo "merging with the shipped set $SHIPPED/$STEM.compiled.tar.xz first"
fi
"$PY" - "$OUT/$STEM.compiled.tar.xz" "${parts[@]}" <<'EOF'
import sys, tarfile
dest, parts = sys.argv[1], sys.argv[2:]
seen = {}
with tarfile.open(dest, "w:xz") as out:
    for part in parts:
        with tarfile.open(part, "r:xz") as tar:
            for m in tar:
                if m.name in seen:
                    continue
                seen[m.name] = part
                out.addfile(m, tar.extractfile(m))
print(f"{dest}: {len(seen)} files from {len(parts)} parts")
EOF
ls -l "$OUT"/*.compiled.tar.xz
cp "$OUT/$STEM.compiled.tar.xz" "$SHIPPED/"
# the GPU machines' transfer back refuses file names with a '+' (the stem's torch version has one):
# the set leaves as compiled_set.tar.xz, its shipped name and checksum in compiled_set.txt; commit it
# as zebractl/runtime/kernel_configs/$(head -1 compiled_set.txt)
mv "$OUT/$STEM.compiled.tar.xz" "$OUT/compiled_set.tar.xz"
{ echo "$STEM.compiled.tar.xz"; sha256sum "$OUT/compiled_set.tar.xz"; } > "$OUT/compiled_set.txt"
