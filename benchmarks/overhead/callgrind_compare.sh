#!/usr/bin/env bash
# The wrapper's instructions per 0-byte/8-byte MPI_Allreduce (callgrind.sh: the
# main thread's count, start-up excluded) beside two references measured the
# same way in the same run: an empty PMPI wrapper (empty_wrapper.c: the floor
# of any preloaded profiler) and mpiP with MPIP="-k 0".  Instruction counts
# are deterministic: the shared machine's load does not move them.
#
#   bash benchmarks/overhead/callgrind_compare.sh MPIP_LIB [OUR_LIB] [N1] [N2]
#   MPIP_LIB: libmpiP.so, built in a scratch folder from mpiP's public source
#   (CC=mpicc ./configure --disable-libunwind --disable-bfd && LOGNAME=root make
#   shared); OUR_LIB: default the installed package's libhvprof.so.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MPIP_LIB=${1:?"usage: callgrind_compare.sh MPIP_LIB [OUR_LIB] [N1] [N2]"}
OUR=${2:-$("$HERE/../../.venv/bin/python" -I -c 'from profiler.collect import native; print(native.library_path())')}
N1=${3:-20000}
N2=${4:-120000}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mpicc -O2 -fPIC -shared "$HERE/empty_wrapper.c" -o "$TMP/libempty.so"
per_call() { awk '/instructions added per call/ { print $1 }'; }
ours=$(bash "$HERE/callgrind.sh" "$OUR" "$N1" "$N2" | per_call)
empty=$(bash "$HERE/callgrind.sh" "$TMP/libempty.so" "$N1" "$N2" | per_call)
mpip=$(MPIP="-k 0" bash "$HERE/callgrind.sh" "$MPIP_LIB" "$N1" "$N2" | per_call)
awk -v o="$ours" -v e="$empty" -v m="$mpip" 'BEGIN {
    printf "instructions added per MPI_Allreduce (0 and 8 bytes, np=1, main thread):\n"
    printf "  empty PMPI wrapper  %7.2f\n  horovod-profiler    %7.2f  (%.2f beyond the empty wrapper)\n", e, o, o - e
    printf "  mpiP -k 0           %7.2f  (%.2f beyond the empty wrapper)\n", m, m - e
    printf "  ours / mpiP beyond the empty wrapper: %.3f\n", (o - e) / (m - e) }'
