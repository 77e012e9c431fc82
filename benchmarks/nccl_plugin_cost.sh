#!/usr/bin/env bash
# Host ns per NCCL call through the profiler plugin, on the NCCL STAND-IN
# (statically linked, as Horovod links NCCL): ROUNDS alternating runs without
# the plugin (NCCL_PROFILER_PLUGIN=none) and with it (the installed library),
# main-thread CPU time per call, medians and their difference.
#   bash benchmarks/nccl_plugin_cost.sh [N calls per run] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}; ROUNDS=${2:-7}
PY=${PYTHON:-.venv/bin/python}
LIB=$(cd /tmp && "$OLDPWD/$PY" -c "from profiler.collect.native import library_path; print(library_path())")
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -DSTANDIN_PROFILER_V=7 -pthread \
    benchmarks/nccl_plugin_cost.c tests/standin/nccl_standin.c -o "$T/cost" -ldl
off=(); on=()
for _ in $(seq "$ROUNDS"); do
  off+=("$(HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR="$T/p" NCCL_PROFILER_PLUGIN=none "$T/cost" "$N")")
  rm -rf "$T/p"
  on+=("$(HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR="$T/p" NCCL_PROFILER_PLUGIN="$LIB" "$T/cost" "$N")")
  rm -rf "$T/p"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m0=$(med "${off[@]}"); m1=$(med "${on[@]}")
echo "stand-in NCCL (not NCCL), static link, $N calls x $ROUNDS rounds, main-thread CPU ns/call:"
echo "  no plugin:   median $m0  (${off[*]})"
echo "  with plugin: median $m1  (${on[*]})"
awk -v a="$m0" -v b="$m1" 'BEGIN {printf "  plugin path: +%.1f ns per call\n", b - a}'
