#!/usr/bin/env bash
# The GPU checks of issues 5 and 16, as one prepared script for a bare
# single-GPU machine (the `device` tool's H200: CUDA image, python3 with torch +
# cupy + nvidia-ml-py, no network).  Bounded to 8 minutes (timeout 480 on the
# check).  Run on an H200 on 2026-12-04 (docs/validation.md, "GPU"): cupy in
# about 90 s, torch with the three paths at 2 ranks in about 400 s (take
# `-- --backends torch` or `-- --backends cupy` apart under a 10-minute call).
#
#   issue 5:  cupy and torch.distributed NCCL through the symbol wrappers
#             (NCCL_PROFILER_PLUGIN=none): exact counts and bytes, device times
#             against the workload's own CUDA events (5%), host cost per call.
#   issue 16: torch.distributed NCCL through NCCL's profiler-plugin path alone
#             (no LD_PRELOAD, HOROVOD_PROFILE_NCCL_WRAPPERS=0: it stands for a
#             static NCCL) and through both paths (each call once), with two
#             processes sharing the GPU (NCCL reports a one-rank communicator's
#             calls to no plugin; a host id per process lets NCCL join two
#             ranks on one GPU): exact counts and bytes, which path the
#             metadata says saw NCCL and the negotiated interface version,
#             device times from the kernel-channel timers against the CUDA
#             events (5%), host time per call without / with the wrappers and
#             the plugin, the pynvml topology block.  --no-pair: the plugin
#             paths at one rank instead (the stand-in's --dry-run does so).
#
#   benchmarks/gpu_check.sh [--dry-run] [--fetch-wheels] [-- gpu_check.py options]
#
#   (default)       build libhvprof.so (mpicc when present, else gcc without the
#                   MPI wrappers), lay the package out in a scratch site dir,
#                   run benchmarks/gpu_check.py against cupy and torch.distributed
#   --dry-run       the same pipeline on the CPU against the project's NCCL and
#                   CUDA stand-ins (tests/standin): for machines without a GPU
#   --fetch-wheels  (run HERE, where pip reaches the index) download the wheels
#                   of the Python packages the device image lacks (orjson) into
#                   .whl/, for the device call to carry (`carry: [".whl"]`)
#
# Output ($OUT, else ./gpu-check-out): summary.txt, summary.json,
# <backend>-trace.json, topology.json, gpu_check.log.  Exit status 0 when every
# check passed.
#
# Device call (from the repository root, after --fetch-wheels here):
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DRY=0
FETCH=0
PASS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --fetch-wheels) FETCH=1 ;;
        --) shift; PASS+=("$@"); break ;;
        *) PASS+=("$1") ;;
    esac
    shift
done

# Wheels for the device image (Python 3.12, x86-64, manylinux): only what it
# lacks (its package list: .library/device/KINDS.md), at this venv's versions.
if [ "$FETCH" = 1 ]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    PIP=${PIP:-$ROOT/.venv/bin/pip}
    [ -x "$PIP" ] || PIP="python3 -m pip"
    WHEELS=""
    for name in orjson duckdb; do  # duckdb: the analysis engine's, for summarize
        v=$($PIP show $name 2>/dev/null | awk '/^Version:/{print $2}')
        WHEELS="$WHEELS $name${v:+==$v}"
    done
    # shellcheck disable=SC2086
    $PIP download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl $WHEELS || exit 1
    ls -l .whl
    exit 0
fi

OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
exec > >(tee "$LOG") 2>&1
T0=$(date +%s)
PY=${PYTHON:-python3}
say() { printf 'gpu_check: %s\n' "$*"; }

say "host $(hostname), $(uname -m), python $($PY --version 2>&1), dry run: $DRY"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/hvprof-gpu-check.XXXXXX")
SITE=$SCRATCH/site

# 1. Python packages the image lacks, from carried wheels.
if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1; then
    say "installing carried wheels: $(cd "$ROOT/.whl" && ls *.whl | tr '\n' ' ')"
    if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SCRATCH/wheels" "$ROOT"/.whl/*.whl; then
        export PYTHONPATH=$SCRATCH/wheels${PYTHONPATH:+:$PYTHONPATH}
    else
        say "the carried wheels do not install for this python; going on without them"
    fi
fi
missing=$($PY - <<'EOF'
import importlib.util as u
print(" ".join(m for m in ("numpy", "pandas", "pyarrow", "orjson", "rich")
               if u.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
    say "missing Python packages: $missing"
    say "run 'benchmarks/gpu_check.sh --fetch-wheels' where pip works and carry .whl"
    exit 1
fi

# 2. The library: all of hooks/ with mpicc, or without the MPI wrappers (mpi.c)
#    with gcc when this machine has no MPI (an NCCL-only process needs none).
mkdir -p "$SITE/profiler/_lib"
LIB=$SITE/profiler/_lib/libhvprof.so
CFLAGS="-std=gnu11 -O2 -g -fPIC -shared -pthread -fvisibility=hidden -Wall -Wextra -Werror
        -Wno-unused-parameter -Wno-missing-field-initializers"
if command -v mpicc >/dev/null 2>&1 && [ "${HVPROF_NO_MPI:-0}" != 1 ]; then
    say "building with mpicc (MPI wrappers included)"
    # shellcheck disable=SC2086
    mpicc $CFLAGS -I hooks hooks/*.c -o "$LIB" -ldl || exit 1
else
    say "building with ${CC:-gcc} without MPI (hooks/mpi.c left out)"
    srcs=$(ls hooks/*.c | grep -v '/mpi\.c$')
    # shellcheck disable=SC2086
    ${CC:-gcc} $CFLAGS -I hooks $srcs -o "$LIB" -ldl -Wl,--no-undefined || exit 1
fi

# 3. The package laid out as setup.py installs it (profiler.analysis = analysis/).
cp -r profiler "$SITE/" && rm -rf "$SITE/profiler/analysis" && cp -r analysis "$SITE/profiler/analysis"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export HVPROF_LIB=$LIB
# From here on outside the checkout: its profiler/ (no analysis/) must not shadow.
cd "$SCRATCH"
$PY -c 'import profiler, profiler.analysis, profiler.analysis.gpu' || { say "package import failed"; exit 1; }

# 4. The check.
ARGS=(--out "$OUT" --work "$SCRATCH/work" --lib "$LIB")
[ "$DRY" = 1 ] && ARGS+=(--dry-run)
timeout 480 $PY "$ROOT/benchmarks/gpu_check.py" "${ARGS[@]}" "${PASS[@]}"
rc=$?
say "finished in $(( $(date +%s) - T0 )) s, status $rc; results in $OUT"
rm -rf "$SCRATCH"
exit $rc
