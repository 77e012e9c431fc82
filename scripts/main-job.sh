#!/usr/bin/env bash
# The main job: profile the bundled Horovod training benchmark on 2 local ranks,
# with tensor fusion on (Horovod's default) and off (HOROVOD_FUSION_THRESHOLD=0),
# then summarize both, write a report and end with what is true of the runs:
# where their steps go and the findings (profiler advise), then what fusion
# changed (profiler compare).
#
# Two runs of one configuration differ by more than their steps' spread (the
# machine drifts from run to run), so one run a side cannot tell fusion's
# effect from that drift.  Each side therefore runs MAIN_JOB_REPS times,
# alternating (on, off, on, off, ...), and `profiler compare` tests the runs'
# values against their spread, run i of each side paired (--paired).
#
#   bash scripts/main-job.sh
#
# Knobs (environment):
#   MAIN_JOB_OUT     output folder (default out/main-job)
#   MAIN_JOB_NP      ranks (default 2)
#   MAIN_JOB_REPS    runs of each side (default 3; 2 at least for a verdict)
#   MAIN_JOB_ARGS    benchmark arguments of each run (default: resnet8, batch 32,
#                    32x32 images, 5 warm-up steps, 4 iterations of 5 steps;
#                    six short runs, a few minutes for the whole job on 2 cores)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

say() { printf 'main-job: %s\n' "$*"; }

REPS=${MAIN_JOB_REPS:-3}
case $REPS in
    ''|*[!0-9]*|0) say "error: MAIN_JOB_REPS must be a whole number >= 1, not '$REPS'" >&2; exit 2 ;;
esac

bash scripts/setup.sh

PY=$ROOT/.venv/bin/python
PROFILER=$ROOT/.venv/bin/profiler
NP=${MAIN_JOB_NP:-2}
OUT=${MAIN_JOB_OUT:-out/main-job}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# shellcheck disable=SC2206
BENCH_ARGS=(${MAIN_JOB_ARGS:---model resnet8 --batch-size 32 --image-size 32 --num-warmup-batches 5 --num-batches-per-iter 5 --num-iters 4})

# Open MPI on a small machine: allow root (containers), oversubscription and
# no core binding (2 ranks share 2 cores with everything else).
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}

# One figure for a run's images/sec, the profiler's (trace.json's metadata:
# profiler.formats.steps, a step's images over the ranks' mean step time).
RATE='import sys
from profiler.formats.tracejson import read_trace_meta
m = read_trace_meta(sys.argv[1])
r, s = m.get("images_per_sec"), m.get("step_ms")
print(f"{r:.1f} img/s, {s:.2f} ms/step (the profiler'"'"'s)" if r and s else "no images/sec in the trace")'

run_profiled() {  # name, extra env...: one run, its output in $OUT/name.log
    local name=$1; shift
    local dir=$OUT/$name log=$OUT/$name.log
    rm -rf "$dir"
    say "profiling the benchmark, $name: HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR=$dir $* mpirun -n $NP python -m profiler.workloads.train_bench ${BENCH_ARGS[*]}"
    if ! env HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR="$dir" "$@" \
        mpirun -n "$NP" "$PY" -m profiler.workloads.train_bench "${BENCH_ARGS[@]}" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        say "error: the benchmark failed ($name); its output: $log" >&2
        exit 1
    fi
    [ -f "$dir/trace.json" ] || { say "error: no trace at $dir/trace.json" >&2; exit 1; }
    say "  $name: $("$PY" -c "$RATE" "$dir/trace.json") (output: $log)"
}

# Alternating runs: run i of each side ran next to the other's, under the same
# conditions as far as the machine allows; compare pairs them.  The first run
# of each side keeps the plain name (fusion-on/, fusion-off/), the others are
# numbered (fusion-on-2/, ...).
ONS=() OFFS=()
for i in $(seq 1 "$REPS"); do
    n=$([ "$i" = 1 ] || echo "-$i")
    run_profiled "fusion-on$n"
    run_profiled "fusion-off$n" HOROVOD_FUSION_THRESHOLD=0
    ONS+=("$OUT/fusion-on$n/trace.json")
    OFFS+=("$OUT/fusion-off$n/trace.json")
done

# Summaries, the report and the findings: the first run of each side.
ON=${ONS[0]}
OFF=${OFFS[0]}

say "summary, fusion on (run 1 of $REPS)"
"$PROFILER" summarize "$ON"
say "summary, fusion off (HOROVOD_FUSION_THRESHOLD=0; run 1 of $REPS)"
"$PROFILER" summarize "$OFF"

REPORT=
if "$PROFILER" report --help >/dev/null 2>&1; then
    REPORT=$OUT/report.html
    say "report: fusion on vs off (run 1 of each)"
    "$PROFILER" report "$ON" "$OFF" --labels fusion-on,fusion-off --no-progress -o "$REPORT"
else
    say "note: 'profiler report' is not available in this version; report skipped"
fi

# Last, what a person reads first: the findings of both runs, ranked by cost.
say "findings, fusion on (run 1 of $REPS)"
"$PROFILER" advise "$ON"
say "findings, fusion off (HOROVOD_FUSION_THRESHOLD=0; run 1 of $REPS)"
"$PROFILER" advise "$OFF"
if [ "$REPS" -ge 2 ]; then
    say "fusion off against fusion on, $REPS alternating runs each: what changed beyond the run-to-run variation"
    "$PROFILER" compare "${ONS[@]}" --vs "${OFFS[@]}" --labels fusion-on,fusion-off --paired
else
    say "fusion off against fusion on, one run each: within-run noise only (MAIN_JOB_REPS=2 or more for a verdict)"
    "$PROFILER" compare "$ON" "$OFF" --labels fusion-on,fusion-off
fi

say "traces ($REPS run(s) a side):"
for t in "${ONS[@]}"; do say "  fusion on:  $t"; done
for t in "${OFFS[@]}"; do say "  fusion off: $t"; done
if [ -n "$REPORT" ]; then say "  report:     $REPORT"; fi
say "open a trace.json in https://ui.perfetto.dev (or chrome://tracing)"
