#!/usr/bin/env bash
# Host ns per NCCL call through the profiler plugin, on the NCCL STAND-IN:
# ROUNDS alternating runs, main-thread CPU time per call, medians.
#   static:  stand-in linked in (as Horovod links NCCL): no plugin
#            (NCCL_PROFILER_PLUGIN=none) vs the plugin (the installed library);
#   shared:  stand-in as libnccl.so.2: nothing, the symbol wrappers alone
#            (LD_PRELOAD), wrappers + plugin (the plugin silent: each call once).
#   bash benchmarks/nccl_plugin_cost.sh [N calls per run] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}; ROUNDS=${2:-7}
PY=${PYTHON:-.venv/bin/python}
LIB=$(cd /tmp && "$OLDPWD/$PY" -c "from profiler.collect.native import library_path; print(library_path())")
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -DSTANDIN_PROFILER_V=7 -pthread \
    benchmarks/nccl_plugin_cost.c tests/standin/nccl_standin.c -o "$T/cost" -ldl
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -fPIC -shared benchmarks/nccl_null_plugin.c \
    -o "$T/libnull.so"
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -DSTANDIN_PROFILER_V=7 -fPIC -shared -pthread \
    -Wl,-soname,libnccl.so.2 tests/standin/nccl_standin.c -o "$T/libnccl.so.2" -ldl
gcc -std=gnu11 -O2 -Wall -Wextra -Werror benchmarks/nccl_plugin_cost.c -o "$T/cost_dyn" \
    "$T/libnccl.so.2" -Wl,-rpath,"$T"
one() { # plugin preload exe
  local pre=() v
  [ -n "$2" ] && pre=(env "LD_PRELOAD=$2")
  v=$("${pre[@]}" env HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR="$T/p" NCCL_PROFILER_PLUGIN="$1" \
      "$3" "$N")
  rm -rf "$T/p"
  echo "$v"
}
off=(); nul=(); on=(); d0=(); dw=(); db=()
for _ in $(seq "$ROUNDS"); do
  off+=("$(one none "" "$T/cost")")
  nul+=("$(one "$T/libnull.so" "" "$T/cost")")
  on+=("$(one "$LIB" "" "$T/cost")")
  d0+=("$(one none "" "$T/cost_dyn")")
  dw+=("$(one none "$LIB" "$T/cost_dyn")")
  db+=("$(one "$LIB" "$LIB" "$T/cost_dyn")")
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m0=$(med "${off[@]}"); m1=$(med "${on[@]}"); mn=$(med "${nul[@]}")
n0=$(med "${d0[@]}"); nw=$(med "${dw[@]}"); nb=$(med "${db[@]}")
echo "stand-in NCCL (not NCCL), $N ncclAllReduce x $ROUNDS rounds, main-thread CPU ns/call (median):"
echo "  static, no plugin:        $m0  (${off[*]})"
echo "  static, null plugin:      $mn  (${nul[*]})"
echo "  static, plugin:           $m1  (${on[*]})"
echo "  shared, nothing:          $n0  (${d0[*]})"
echo "  shared, wrappers:         $nw  (${dw[*]})"
echo "  shared, wrappers+plugin:  $nb  (${db[*]})"
awk -v a="$m0" -v b="$m1" -v c="$n0" -v d="$nw" -v e="$nb" -v f="$mn" 'BEGIN {
  printf "  plugin path (static): +%.1f ns per call (NCCL side, null plugin: +%.1f; "\
         "the profiler'"'"'s own: +%.1f)\n", b - a, f - a, b - f
  printf "  wrappers (shared):    +%.1f ns per call\n", d - c
  printf "  both (shared, plugin silent): +%.1f ns per call\n", e - c }'
