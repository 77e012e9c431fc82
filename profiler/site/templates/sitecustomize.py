# horovod-profiler, site-wide (docs/guide/site.md): install as sitecustomize.py
# in the site Python's site-packages (or add its folder to PYTHONPATH).
#
# Every Python process that an MPI launcher or Slurm started as a rank is
# profiled in summary mode (disk bounded whatever the job's length), unless
# the job set HOROVOD_PROFILE itself: HOROVOD_PROFILE=0 opts out, =1 asks for
# the full trace.  Set the store below (or leave it to the module file or the
# prolog).  Python imports sitecustomize after the .pth files, so this one
# activates the profiler itself; it costs one dictionary look-up elsewhere.
# The profiler's own processes (the exit merge, the job record), which
# inherit a rank's variables but not HOROVOD_PROFILE, are never profiled.
import os
import sys

if "HOROVOD_PROFILE" not in os.environ and any(
        v in os.environ for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                  "SLURM_PROCID")) and not any(
        "profiler.postjob" in a or "profiler.site" in a for a in getattr(sys, "orig_argv", ())):
    os.environ["HOROVOD_PROFILE"] = "summary"
    # os.environ.setdefault("HOROVOD_PROFILE_STORE", "/shared/horovod-profiler/store")
    try:
        import profiler.collect.activate  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install never stops a job
        pass
