#!/bin/sh
# horovod-profiler, site-wide (docs/guide/site.md): slurm.conf
#   TaskProlog=/etc/slurm/horovod-profiler-taskprolog.sh
# Slurm runs it as the job's user before each task and applies the
# "export NAME=VALUE" lines it prints to the task's environment.  A job that
# set HOROVOD_PROFILE itself keeps it (HOROVOD_PROFILE=0 opts out).
STORE=/shared/horovod-profiler/store
if [ -z "${HOROVOD_PROFILE+set}" ]; then
    echo "export HOROVOD_PROFILE=summary"
fi
if [ -z "${HOROVOD_PROFILE_STORE+set}" ]; then
    echo "export HOROVOD_PROFILE_STORE=$STORE"
fi
