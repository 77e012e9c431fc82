"""Horovod's tuning variables that Horovod read otherwise than a person
would: ``HOROVOD_FUSION_THRESHOLD=64MB`` is 64 bytes to Horovod, an empty
``HOROVOD_CYCLE_TIME`` is 0 ms (profiler.formats.horovod_env, from the
environment rank 0 recorded).  Horovod says nothing of it; the job runs with
fusion all but off or a busy-polling cycle, and every other finding describes
that job."""

from __future__ import annotations

from profiler.formats.horovod_env import settings

from .base import Context, Finding

#: the unit Horovod takes each variable in, for the recommendation
UNITS = {"HOROVOD_FUSION_THRESHOLD": "bytes", "HOROVOD_CYCLE_TIME": "milliseconds",
         "HOROVOD_CACHE_CAPACITY": "entries"}


def analyze(ctx: Context) -> list[Finding]:
    env = ctx.meta.get("env")
    if not isinstance(env, dict):
        return []
    found = []
    for line in settings(env).misread:
        name = line.split("=", 1)[0]
        found.append(Finding(
            key="horovod_settings",
            headline=line,
            details=[f"Horovod reads {name} with C's "
                     f"{'strtof' if name == 'HOROVOD_CYCLE_TIME' else 'strtol'} "
                     "(horovod/common/operations.cc): the number ends at the first character "
                     "that cannot continue it, a text without one is 0, and nothing is said; "
                     "this run, and every figure here, is the job Horovod ran."],
            confidence="from the environment rank 0 recorded",
            recommendation=f"write {name} as a plain number of {UNITS.get(name, 'units')}",
            check="profiler tensors TRACE --whatif (its 'this run' row is what Horovod ran with)",
            numbers={"variable": name, "text": str(env.get(name))},
            significant=True,
        ))
    return found
