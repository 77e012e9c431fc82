"""GPUs and NCCL in a job's metadata: the warnings and summary lines that
`profiler summarize` and `profiler report` print (NCCL calls invisible, device
times missing, each host's GPU topology).

What a rank's metadata carries ("gpus", "nccl") is collected inside the job by
profiler.collect.nvml (NVML topology) and profiler.collect.native (the
library's NCCL state); this module only reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from profiler.layout import format_ranges
from profiler.units import fmt_bytes, fmt_ns

__all__ = [
    "REMEDY",
    "device_time_note",
    "gpu_warnings",
    "job_gpus",
    "nccl_call_count",
    "nccl_version_text",
    "nccl_path_line",
    "summary_lines",
    "topology_lines",
]

#: What to tell a user whose NCCL calls are invisible.
REMEDY = ("rebuild Horovod with HOROVOD_NCCL_LINK=SHARED (Horovod links NCCL statically by "
          "default, which hides ncclAllReduce from the profiler)")


#: NCCL_VERSION_CODE of 2.23.0, the first NCCL with the profiler-plugin interface.
PLUGIN_MIN_VERSION = 22300


def nccl_version_text(code: int) -> str:
    """NCCL_VERSION_CODE -> "2.18.3" (major*10000 + minor*100 + patch since
    2.9; major*1000 + minor*100 + patch before)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def topology_lines(gpus: Sequence[Mapping[str, Any]], host: str = "") -> list[str]:
    """One line per GPU model group, plus NVLink connectivity, for summaries."""
    if not gpus:
        return []
    out: list[str] = []
    where = f" on {host}" if host else ""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for g in gpus:
        pcie = g.get("pcie") or {}
        key = (g.get("name"), g.get("memory_bytes"), pcie.get("gen"), pcie.get("width"),
               pcie.get("max_gen"), pcie.get("max_width"))
        groups.setdefault(key, []).append(int(g.get("index", len(groups))))
    for (name, mem, gen, width, mgen, mwidth), idx in groups.items():
        mem_s = f"{mem / 2**30:.0f} GiB" if isinstance(mem, (int, float)) else "? GiB"
        pcie_s = _pcie_text(gen, width, mgen, mwidth)
        out.append(f"GPU {format_ranges(idx)}{where}: {name or 'unknown'}, {mem_s}, {pcie_s}")
    linked = [g for g in gpus if (g.get("nvlink") or {}).get("links")]
    if linked:
        for g in linked:
            nv = g["nvlink"]
            peers: dict[str, int] = {}
            for p in nv.get("peers", []):
                label = f"GPU {p['peer']}" if p.get("peer") is not None else "NVSwitch/other"
                peers[label] = peers.get(label, 0) + 1
            ver = f" v{nv['version']}" if nv.get("version") else ""
            text = ", ".join(f"{k} x{v}" for k, v in sorted(peers.items()))
            out.append(f"  GPU {g.get('index')}: NVLink{ver}, {nv['links']} links -> {text}")
    else:
        out.append("  no NVLink: GPUs talk over PCIe")
    return out


def _pcie_text(gen: Any, width: Any, mgen: Any, mwidth: Any) -> str:
    if gen is None and width is None:
        return "PCIe unknown"
    cur = f"PCIe gen{gen} x{width}"
    if (mgen, mwidth) != (gen, width) and (mgen is not None or mwidth is not None):
        cur += f" (max gen{mgen} x{mwidth})"
    return cur


# ---------------------------------------------------------------------------
# Job level: warnings and summary lines
# ---------------------------------------------------------------------------
def _ranks_meta(meta: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    if not meta:
        return []
    ranks = meta.get("ranks")
    if isinstance(ranks, list):
        return [r for r in ranks if isinstance(r, Mapping)]
    return [meta] if "nccl" in meta or "gpus" in meta else []


def job_gpus(meta: Mapping[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    """host -> GPU list, from the ranks' metadata (first rank of each host)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in _ranks_meta(meta):
        gpus = r.get("gpus")
        host = str(r.get("host", ""))
        if gpus and host not in out:
            out[host] = list(gpus)
    if not out and meta and isinstance(meta.get("gpus"), list) and meta["gpus"]:
        out[""] = list(meta["gpus"])
    return out


def nccl_call_count(df: Any) -> int | None:
    """NCCL host calls in a DataFrame (backend == nccl, device rows excluded)."""
    if df is None or "backend" not in getattr(df, "columns", ()):
        return None
    sel = df["backend"].astype(str) == "nccl"
    if "device" in df.columns:
        sel &= ~df["device"].astype(bool)
    return int(sel.sum())


def gpu_warnings(meta: Mapping[str, Any] | None, nccl_calls: int | None = None) -> list[str]:
    """Warnings about GPU communication the profiler could not see.

    A job used GPUs when some rank had the CUDA driver loaded.  If such a job
    shows no NCCL call (nccl_calls from the data, else the ranks' counters),
    its NCCL traffic was invisible: say so and name the remedy.
    """
    ranks = _ranks_meta(meta)
    states = [r["nccl"] for r in ranks if isinstance(r.get("nccl"), Mapping)]
    used_gpu = [r for r in ranks if isinstance(r.get("nccl"), Mapping)
                and r["nccl"].get("cuda_driver_loaded")]
    if not used_gpu:
        return []
    if nccl_calls is None:
        nccl_calls = sum(int(sum((s.get("calls") or {}).values())) for s in states)
    out: list[str] = []
    if nccl_calls == 0:
        n = len(used_gpu)
        hidden = [r for r in used_gpu if not r["nccl"].get("interposable")]
        why = ""
        if hidden:
            why = (" no interposable NCCL was loaded" if not any(
                r["nccl"].get("nccl_loaded") for r in hidden)
                   else " NCCL was loaded but its calls did not reach the profiler")
            why = f" ({len(hidden)} of them:{why})"
        out.append(f"warning: {n} rank(s) used GPUs but no NCCL call was recorded{why}; "
                   f"GPU communication is missing from this profile: {REMEDY}")
        codes = sorted({int(s.get("nccl_version") or 0) for s in states} - {0})
        old = [c for c in codes if c < PLUGIN_MIN_VERSION]
        if old:
            out.append(f"note: NCCL {', '.join(nccl_version_text(c) for c in old)} predates "
                       "NCCL's profiler-plugin interface (2.23), through which the profiler "
                       "sees NCCL even when it is linked statically; with this NCCL only "
                       "HOROVOD_NCCL_LINK=SHARED (or NCCL >= 2.23) makes its calls visible")
        elif codes:
            plugins = [s.get("plugin") or {} for s in states]
            loaded = [p for p in plugins if int(p.get("comms_init") or 0) > 0]
            one = sum(int(p.get("one_rank_comms") or 0) for p in loaded)
            inits = sum(int(p["comms_init"]) for p in loaded)
            if loaded and one == inits:
                out.append(f"note: NCCL loaded the profiler's plugin, but every communicator "
                           f"({inits}) had one rank: NCCL runs a one-rank collective as a "
                           "local copy that it reports to no profiler plugin")
            elif loaded:
                out.append(f"note: NCCL loaded the profiler's plugin for {inits} "
                           "communicator(s) but reported no collective to it")
            else:
                out.append(f"note: NCCL {', '.join(nccl_version_text(c) for c in codes)} has "
                           "the profiler-plugin interface but did not load the profiler's "
                           "plugin: check that NCCL_PROFILER_PLUGIN was not overridden")
    lost = 0
    for s in states:
        miss = s.get("miss") or {}
        lost += int(miss.get("pool_empty", 0)) + int(s.get("unfinished", 0))
    if lost:
        out.append(f"note: {lost} NCCL call(s) have no device time (event pool exhausted or "
                   "still running at exit); raise HOROVOD_PROFILE_NCCL_EVENTS")
    return out


def device_time_note(meta: Mapping[str, Any] | None) -> str | None:
    """One line on how NCCL device times were placed on the host axis."""
    states = [r["nccl"] for r in _ranks_meta(meta) if isinstance(r.get("nccl"), Mapping)]
    recs = sum(int(s.get("device_records", 0)) for s in states)
    if not recs:
        return None
    err = max(float(s.get("anchor_err_ns_max", 0) or 0) for s in states)
    return (f"NCCL device times: {recs} intervals from CUDA events, placed on the host clock "
            f"within +/-{fmt_ns(err)} (anchor error)")


def nccl_path_line(meta: Mapping[str, Any] | None) -> str | None:
    """Which path saw NCCL (symbol wrappers, NCCL's profiler plugin) and the
    plugin interface version NCCL negotiated, over the ranks; None when the
    metadata does not say (no NCCL, or a profile from before the plugin path)."""
    states = [r["nccl"] for r in _ranks_meta(meta) if isinstance(r.get("nccl"), Mapping)]
    seen: list[str] = []
    recorded: list[str] = []
    versions: set[int] = set()
    for s in states:
        for p in s.get("seen_by") or ():
            if p not in seen:
                seen.append(str(p))
        rec = s.get("recorded_by")
        if rec and rec != "none" and rec not in recorded:
            recorded.append(str(rec))
        v = (s.get("plugin") or {}).get("interface_version")
        if v:
            versions.add(int(v))
    tl = (meta or {}).get("nccl_timeline")
    if isinstance(tl, Mapping) and tl.get("status") == "added":
        seen.append("timeline")  # Horovod's timeline spans: coarse rows added at merge
        recorded.append("timeline")
    if not seen:
        return None
    line = f"NCCL seen through: {', '.join(seen)}; recorded by {', '.join(recorded) or 'none'}"
    if versions:
        line += "; NCCL profiler-plugin interface " + ", ".join(f"v{v}" for v in sorted(versions))
    return line


def network_lines(df: Any) -> list[str]:
    """Per NCCL op, the network activity NCCL's proxy events reported to the
    plugin path (the net_* columns): bytes sent and received, the mean span of
    the proxy activity per call.  Nothing when the data has none."""
    if df is None or "net_send_bytes" not in getattr(df, "columns", ()):
        return []
    sel = df["net_send_bytes"].to_numpy() >= 0
    if "device" in df.columns:
        sel &= ~df["device"].to_numpy(dtype=bool)
    if not sel.any():
        return []
    part = df.loc[sel]
    out = ["NCCL network (plugin proxy events; time: mean span per call):"]
    for op, g in part.groupby(part["op"].astype(str), sort=True):
        out.append(f"  {op}: {len(g)} calls, sent {fmt_bytes(int(g['net_send_bytes'].sum()))}, "
                   f"recv {fmt_bytes(int(g['net_recv_bytes'].sum()))}, "
                   f"{fmt_ns(float(g['net_ns'].mean()))}")
    return out


def timeline_note(df: Any) -> str | None:
    """One line when NCCL rows came from Horovod's timeline (coarse)."""
    if df is None or "source" not in getattr(df, "columns", ()):
        return None
    n = int((df["source"].astype(str) == "timeline").sum())
    if not n:
        return None
    return f"NCCL: {n} call(s) from Horovod's timeline (coarse; no path saw NCCL)"


def summary_lines(meta: Mapping[str, Any] | None, df: Any = None) -> list[str]:
    """Everything GPU-related `profiler summarize` prints after its table."""
    out = gpu_warnings(meta, nccl_call_count(df))
    path = nccl_path_line(meta)
    if path:
        out.append(path)
    tl = timeline_note(df)
    if tl:
        out.append(tl)
    out += network_lines(df)
    note = device_time_note(meta)
    if note:
        out.append(note)
    for host, gpus in job_gpus(meta).items():
        out += topology_lines(gpus, host)
    return out
