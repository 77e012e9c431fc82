#!/usr/bin/env bash
# Instructions the profiler adds per MPI_Allreduce, counted by callgrind
# (deterministic, unlike wall-clock timings on a shared machine).  The main
# thread's instruction count (--separate-threads: the helper thread's flushing
# is not the caller's cost) is taken for N1 and N2 iterations, with the
# library preloaded and without; the difference of the differences, divided
# by the extra calls, is the wrapper's cost per call (record slot refills
# included, start-up excluded).  Each iteration makes a 0-byte and an 8-byte
# MPI_Allreduce at np=1 under Open MPI (callgrind_allreduce.c).
#
#   bash benchmarks/overhead/callgrind.sh [LIB] [N1] [N2]
#   LIB: the library to preload (default: the installed package's libhvprof.so)
#   PROG=callgrind_p2p (environment): point-to-point instead, two calls per
#   iteration as well; CG_MODE=null (two MPI_Send to MPI_PROC_NULL) or
#   CG_MODE=self (MPI_Send to self + MPI_Recv): see callgrind_p2p.c
#   MPIP (environment): passed to the ranks (mpiP's options, for LIB=libmpiP.so)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LIB=${1:-$("$HERE/../../.venv/bin/python" -I -c 'from profiler.collect import native; print(native.library_path())')}
N1=${2:-20000}
N2=${3:-120000}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PROG=${PROG:-callgrind_allreduce}
mpicc -O2 -g "$HERE/$PROG.c" -o "$TMP/cg"

main_ir() { # main_ir PRELOAD N -> the main thread's Ir
    local out="$TMP/cg.$1.$2"
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HOROVOD_PROFILE=1 \
        HOROVOD_PROFILE_DIR="$TMP/prof.$1.$2" \
        mpirun -n 1 -x HOROVOD_PROFILE -x HOROVOD_PROFILE_DIR ${CG_MODE:+-x CG_MODE} ${MPIP:+-x MPIP} \
        ${3:+-x LD_PRELOAD="$3"} \
        valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out" \
        "$TMP/cg" "$2" >"$TMP/log" 2>&1 || { cat "$TMP/log" >&2; exit 1; }
    awk '/^summary:|^totals:/ { print $2; exit }' "$out-01"
}
p1=$(main_ir p "$N1" "$LIB"); p2=$(main_ir p "$N2" "$LIB")
u1=$(main_ir u "$N1"); u2=$(main_ir u "$N2")
awk -v p1="$p1" -v p2="$p2" -v u1="$u1" -v u2="$u2" -v n=$((2 * (N2 - N1))) \
    -v prog="$PROG${CG_MODE:+ $CG_MODE}" 'BEGIN {
    printf "main thread Ir: profiled %d -> %d, plain %d -> %d over %d more calls\n", p1, p2, u1, u2, n
    printf "%.2f instructions added per call (%s)\n", ((p2 - p1) - (u2 - u1)) / n, prog }'
