#!/usr/bin/env bash
# The main job: profile the bundled Horovod training benchmark on 2 local ranks,
# with tensor fusion on (Horovod's default) and off (HOROVOD_FUSION_THRESHOLD=0),
# then summarize both, write a report and end with what is true of the runs:
# where their steps go and the findings (profiler advise), then what fusion
# changed (profiler compare).
#
#   bash scripts/main-job.sh
#
# Knobs (environment):
#   MAIN_JOB_OUT     output folder (default out/main-job)
#   MAIN_JOB_NP      ranks (default 2)
#   MAIN_JOB_ARGS    benchmark arguments (default: resnet8, batch 32, 32x32 images,
#                    5 warm-up steps, 10 iterations of 5 steps; about a minute
#                    for the whole job on 2 cores)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

say() { printf 'main-job: %s\n' "$*"; }

bash scripts/setup.sh

PY=$ROOT/.venv/bin/python
PROFILER=$ROOT/.venv/bin/profiler
NP=${MAIN_JOB_NP:-2}
OUT=${MAIN_JOB_OUT:-out/main-job}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# shellcheck disable=SC2206
BENCH_ARGS=(${MAIN_JOB_ARGS:---model resnet8 --batch-size 32 --image-size 32 --num-warmup-batches 5 --num-batches-per-iter 5 --num-iters 10})

# Open MPI on a small machine: allow root (containers), oversubscription and
# no core binding (2 ranks share 2 cores with everything else).
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}

run_profiled() {  # name, extra env...
    local name=$1; shift
    local dir=$OUT/$name
    rm -rf "$dir"
    say "profiling the benchmark, $name: HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR=$dir $* mpirun -n $NP python -m profiler.workloads.train_bench ${BENCH_ARGS[*]}"
    env HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR="$dir" "$@" \
        mpirun -n "$NP" "$PY" -m profiler.workloads.train_bench "${BENCH_ARGS[@]}" \
        2>&1 | tee "$OUT/$name.log"
    [ -f "$dir/trace.json" ] || { say "error: no trace at $dir/trace.json" >&2; exit 1; }
}

run_profiled fusion-on
run_profiled fusion-off HOROVOD_FUSION_THRESHOLD=0

ON=$OUT/fusion-on/trace.json
OFF=$OUT/fusion-off/trace.json

say "summary, fusion on"
"$PROFILER" summarize "$ON"
say "summary, fusion off (HOROVOD_FUSION_THRESHOLD=0)"
"$PROFILER" summarize "$OFF"

REPORT=
if "$PROFILER" report --help >/dev/null 2>&1; then
    REPORT=$OUT/report.html
    say "report: fusion on vs off"
    "$PROFILER" report "$ON" "$OFF" --labels fusion-on,fusion-off --no-progress -o "$REPORT"
else
    say "note: 'profiler report' is not available in this version; report skipped"
fi

# Last, what a person reads first: the findings of both runs, ranked by cost.
say "findings, fusion on"
"$PROFILER" advise "$ON"
say "findings, fusion off (HOROVOD_FUSION_THRESHOLD=0)"
"$PROFILER" advise "$OFF"
say "fusion off against fusion on: what changed beyond the run-to-run noise"
"$PROFILER" compare "$ON" "$OFF" --labels fusion-on,fusion-off

say "traces:"
say "  fusion on:  $ON"
say "  fusion off: $OFF"
if [ -n "$REPORT" ]; then say "  report:     $REPORT"; fi
say "open a trace.json in https://ui.perfetto.dev (or chrome://tracing)"
