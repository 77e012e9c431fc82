"""Which interconnect a run used, as its trace metadata tells (the recorded
environment; what the MPI library said through MPI_T), the Open MPI settings
that select each transport (`profiler bench --transport` sets them; this module
reads them back), the emulated fabrics of `profiler bench --fabric` with what
each emulates and how, and the application's communication per step predicted
on each fabric (:func:`step_comm`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ._frame import calls, label_keys, lowest_rank_view
from .model import fit_models

# --transport -> the Open MPI settings that select it (pml ob1 so that the btl is used
# even where the UCX pml is built in)
TRANSPORTS: dict[str, dict[str, str]] = {
    "shm": {"OMPI_MCA_btl": "vader,self", "OMPI_MCA_pml": "ob1"},
    "tcp": {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_pml": "ob1"},
}

NO_LATENCY = "latency not emulated: netem is unavailable in this kernel"


@dataclass(frozen=True)
class Fabric:
    """An interconnect `profiler bench --fabric NAME` emulates on this machine."""

    name: str
    hosts: int          # 1: one machine (Open MPI btl per `transport`); >= 2: simulated hosts
    rate: str | None    # tbf rate on every link (simulated hosts), None: unlimited
    transport: str      # "shm" (vader,self) or "tcp" (tcp,self)
    label: str          # what it emulates and how


FABRICS: dict[str, Fabric] = {f.name: f for f in (
    Fabric("shm", 1, None, "shm",
           "shared memory, 2 ranks on one host (Open MPI btl vader,self): "
           "ranks of one node; measured, not emulated"),
    Fabric("tcp", 2, None, "tcp",
           "TCP over veth between 2 simulated hosts (network namespaces, a bridge), "
           f"no rate limit: as fast as this machine's CPUs move packets; {NO_LATENCY}"),
    Fabric("tcp-10gbit", 2, "10gbit", "tcp",
           f"TCP over veth, tbf 10 Gbit/s: emulates 10 GbE; {NO_LATENCY}"),
    Fabric("tcp-1gbit", 2, "1gbit", "tcp",
           f"TCP over veth, tbf 1 Gbit/s: emulates 1 GbE; {NO_LATENCY}"),
)}
# the environment variable `profiler bench --fabric` sets: the trace's metadata keeps it
FABRIC_ENV = "HOROVOD_BENCH_FABRIC"


def fabric_of(meta: Mapping[str, Any]) -> Fabric | None:
    """The emulated fabric a `profiler bench --fabric` trace ran on, or None."""
    name = str((meta.get("env") or {}).get(FABRIC_ENV, ""))
    return FABRICS.get(name)


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


def _step_windows(app: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """The lowest rank's step windows (APP_STEP rows), the first `warmup` left out
    when more remain."""
    from .throughput import steps

    st = steps(app)
    if st.empty:
        return st
    st = st.loc[st["rank"] == st["rank"].min()].sort_values("t_start_ns")
    return st.iloc[warmup:] if len(st) > warmup else st


def step_traffic(app: pd.DataFrame, *, warmup: int = 1) -> pd.DataFrame:
    """The application's data calls per step, by op and exact size, as the lowest
    rank made them inside its steps (APP_STEP windows; the first `warmup` steps
    left out when more remain): op, bytes, calls_per_step.  An application
    without step markers: every data call of the lowest rank, as one step."""
    data = lowest_rank_view(calls(app, kinds=("data",)))
    cols = ["op", "bytes", "calls_per_step"]
    if data.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    win = _step_windows(app, warmup) if "op" in app.columns else pd.DataFrame()
    if len(win):
        t = data["t_start_ns"].to_numpy()
        lo = win["t_start_ns"].to_numpy()
        hi = win["t_end_ns"].to_numpy()
        i = np.searchsorted(lo, t, side="right") - 1
        inside = (i >= 0) & (t < hi[np.clip(i, 0, len(hi) - 1)])
        data = data.loc[inside]
        n_steps = len(win)
    else:
        n_steps = 1
    g = data.groupby([data["op"].astype(str), data["bytes"].astype(np.int64)]).size()
    out = g.rename("calls").reset_index()
    out.columns = ["op", "bytes", "calls"]
    out["calls_per_step"] = out["calls"] / n_steps
    return out[cols]


def step_comm(app: pd.DataFrame, bench: pd.DataFrame, *, replay: pd.DataFrame | None = None,
              warmup: int = 1) -> pd.DataFrame:
    """The application's communication per step predicted on each fabric.

    app: the application's trace (its per-step size histogram, :func:`step_traffic`);
    bench: `profiler bench` sweeps, one label per fabric (profiler.analysis.load
    with label=...); replay: optionally the `profiler bench --sizes-from` replays
    of the same application, labelled the same way.

    Per label and op: calls_per_step, bytes_per_step, predicted_ms_per_step (each
    size's calls x the alpha-beta model of that op on that fabric,
    profiler.analysis.model.fit_models; NaN where the sweep has no such op) and,
    with a replay, replayed_ms_per_step (each size's calls x the replay's median
    latency of that op and size, over every rank)."""
    traffic = step_traffic(app, warmup=warmup)
    models = fit_models(bench)  # keys: (label, op) or (op,) for one unlabelled trace
    keyed = bool(label_keys(bench))
    labels = [str(x) for x in bench["label"].cat.categories] if keyed and hasattr(
        bench["label"], "cat") else ([str(x) for x in pd.unique(bench["label"])] if keyed
                                     else [""])
    rep_med: dict[tuple[str, str, int], float] = {}
    if replay is not None and len(replay):
        rc = calls(replay, kinds=("data",))
        lab = rc["label"].astype(str) if "label" in rc.columns else pd.Series("", rc.index)
        med = rc.groupby([lab, rc["op"].astype(str), rc["bytes"].astype(np.int64)])[
            "dur_ns"].median()
        rep_med = {(str(k[0]), str(k[1]), int(k[2])): float(v) for k, v in med.items()}
    rows = []
    for lb in labels:
        for op, sub in traffic.groupby("op", sort=True):
            m = models.get((lb, str(op)) if keyed else (str(op),))
            n = sub["calls_per_step"].to_numpy(dtype=float)
            x = sub["bytes"].to_numpy(dtype=float)
            pred = float(np.sum(n * m.predict_ns(x)) / 1e6) if m is not None else float("nan")
            row = {"label": lb, "op": str(op), "calls_per_step": float(n.sum()),
                   "bytes_per_step": float(np.sum(n * x)), "predicted_ms_per_step": pred}
            if replay is not None:
                meds = [rep_med.get((lb, str(op), int(b)), float("nan")) for b in x]
                row["replayed_ms_per_step"] = float(np.sum(n * np.array(meds)) / 1e6)
            rows.append(row)
    return pd.DataFrame(rows)
