"""The facts sidecar (raw/rank-R.facts.json): what only a rank's process knew
(profiler.collect.facts: its threads, the framework that marked its steps,
its self-cost, ...), written by the process just before its files left its
host for rank 0's (the gather at MPI_Finalize, hooks/mpi_gather.c), so that
rank 0's conversion of those files describes the rank as the rank itself
would have.  Its environment is cut to the variables that shape
communication before it is written: nothing else ever leaves the host.

Light: imported in the job (at MPI_Finalize) and by the conversion."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from profiler.layout import facts_path

ENV_PREFIXES = ("HOROVOD_", "NCCL_", "OMPI_MCA_", "MPICH_", "UCX_")

# Set by mpirun for its own plumbing (daemon URIs, job ids, session dirs,
# transport keys): not communication knobs, and not worth leaking.
ENV_LAUNCHER_INTERNAL = ("OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix",
                         "OMPI_MCA_initial_wdir", "OMPI_MCA_shmem_RUNTIME_QUERY_hint")


def env_whitelist(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Only the variables that shape communication; nothing else ever leaves."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items())
            if k.startswith(ENV_PREFIXES) and not k.startswith(ENV_LAUNCHER_INTERNAL)}


def write(raw: str | os.PathLike[str], facts: Mapping[str, Any]) -> Path:
    """Write the facts beside the raw file (atomically), environment cut."""
    doc = dict(facts, written_before_gather=True)
    if "environ" in doc:
        doc["environ"] = env_whitelist(doc["environ"])
    out = facts_path(raw)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                                 default=str))
    os.replace(tmp, out)
    return out


def read(raw: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The facts written beside this raw file, or None (absent, unreadable)."""
    try:
        doc = orjson.loads(facts_path(raw).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None
