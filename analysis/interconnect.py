"""Which interconnect a run used, as its trace metadata tells (the recorded
environment), and the Open MPI settings that select each transport
(`profiler bench --transport` sets them; this module reads them back)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# --transport -> the Open MPI settings that select it (pml ob1 so that the btl is used
# even where the UCX pml is built in)
TRANSPORTS: dict[str, dict[str, str]] = {
    "shm": {"OMPI_MCA_btl": "vader,self", "OMPI_MCA_pml": "ob1"},
    "tcp": {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_pml": "ob1"},
}


def interconnect(meta: Mapping[str, Any]) -> str:
    """A short interconnect name from a trace's metadata (env whitelist): shm, tcp, or
    the raw OMPI_MCA_btl / NCCL setting, '' when nothing says."""
    env = meta.get("env") or {}
    btl = str(env.get("OMPI_MCA_btl", ""))
    for name, settings in TRANSPORTS.items():
        if btl and btl == settings["OMPI_MCA_btl"]:
            return name
    if btl:
        return f"btl={btl}"
    for key in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET"):
        if key in env:
            return f"{key}={env[key]}"
    return ""
