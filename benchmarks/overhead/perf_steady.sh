#!/bin/bash
# Where a profiled step's time goes, by library: perf (cpu-clock, the only
# event this VM has) on rank 0 of the corpus' mlp6 (WORKLOAD=W, STEPS=N:
# another workload, enough steps to outlast the window) over a 4 s window in its
# steady state (6 s after launch: past start-up, before the exit), three
# unprofiled and three profiled runs alternating, ranks bound to a core.
# ARMS="off on busy40" adds an unprofiled arm whose main thread spins 40 us
# after each optimizer step (the workload's --busy-us): a known cost.
# Writes /tmp/ps/ARM-{1,2,3}.data and .out (the job's RESULT line).
# Run under the machine's lock: flock /tmp/hvprof-machine.lock bash THIS.
# Then: python benchmarks/overhead/perf_by_thread.py /tmp/ps (us of CPU a
# step by thread and library, median of each arm's runs), or per run
# perf report -i /tmp/ps/on-1.data -n -s pid,dso --stdio (the main thread
# is the pid with the most libtorch_cpu samples; a library's time a step =
# samples / 4999 / (4 s x the run's steps/s)).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_tcp_if_include=lo
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
cd /tmp && rm -rf /tmp/ps && mkdir -p /tmp/ps
for i in 1 2 3; do
 for arm in ${ARMS:-off on}; do
  B=""
  case $arm in
   on) E="HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR=/tmp/ps/prof-$arm-$i HOROVOD_PROFILE_MERGE=0";;
   busy*) E="X=1"; B="--busy-us ${arm#busy}";;
   *) E="X=1";;
  esac
  env $E mpirun -n 2 --bind-to core $PY -m profiler.workloads.corpus ${WORKLOAD:-mlp6} --steps ${STEPS:-8000} $B > /tmp/ps/$arm-$i.out 2>&1 &
  M=$!
  sleep 6
  P=""
  for p in $(pgrep -f "profiler.workloads.corpus ${WORKLOAD:-mlp6}"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0"; then P=$p; fi
  done
  perf record -q -F 4999 -e cpu-clock -p $P -o /tmp/ps/$arm-$i.data -- sleep 4 2>/dev/null
  wait $M
  echo "$arm $i pid $P $(grep -o '"steps_per_s": [0-9.]*' /tmp/ps/$arm-$i.out)"
 done
done
