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


def interconnect_pairs(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The transport per host pair as the trace records it (profiler.formats.fabric:
    asked of the MPI library through MPI_T and seen in the ranks' TCP connections):
    dicts with hosts, transport, how (observed / inferred), connections, interfaces.
    [] when the trace carries no MPI_T document (older traces, other MPIs)."""
    ic = meta.get("interconnect") or {}
    return [dict(p) for p in ic.get("pairs") or [] if isinstance(p, Mapping)]


def _pair_text(p: Mapping[str, Any]) -> str:
    a, b = (list(p.get("hosts") or ["?", "?"]) + ["?"])[:2]
    where = f"within {a}" if a == b else f"{a}<->{b}"
    text = f"{where} {p.get('transport', '?')}"
    ifs = [str(i) for i in p.get("interfaces") or []]
    if ifs:
        text += " via " + ",".join(ifs)
    if p.get("how") == "observed":
        n = int(p.get("connections") or 0)
        text += f", {n} connection{'s' if n != 1 else ''} seen"
    else:
        text += " (inferred)"
    return text


def interconnect_line(meta: Mapping[str, Any] | None) -> str | None:
    """One line for `profiler summarize`: the transport between hosts and within
    a host, and what the MPI library had open, e.g. ``interconnect (MPI_T):
    h0<->h1 tcp via eth0 (veth) (4 connections seen); pml ob1, btl self,tcp``.
    Without an MPI_T document: the launcher's setting, labelled so.  None when
    nothing is known."""
    if not meta:
        return None
    ic = meta.get("interconnect") or {}
    if ic.get("source") == "MPI_T":
        pairs = interconnect_pairs(meta)
        same = [p for p in pairs if len(set(p.get("hosts") or [])) == 1]
        cross = [p for p in pairs if p not in same]
        parts = [_pair_text(p) for p in cross]
        kinds = {str(p.get("transport")) for p in same}
        if len(same) > 1 and len(kinds) == 1:
            parts.append(f"within each host {kinds.pop()} (inferred)")
        else:
            parts += [_pair_text(p) for p in same]
        opened = []
        if ic.get("pml"):
            opened.append("pml " + ",".join(ic["pml"]))
        if ic.get("btl"):
            opened.append("btl " + ",".join(ic["btl"]))
        if ic.get("mtl"):
            opened.append("mtl " + ",".join(ic["mtl"]))
        body = "; ".join(parts) if parts else "one rank, no peer"
        return "interconnect (MPI_T): " + body + ("; " + ", ".join(opened) if opened else "")
    name = interconnect(meta)
    if name:
        return f"interconnect (launcher setting, not asked of MPI): {name}"
    return None
