"""GPUs and NCCL: topology, NCCL visibility, and the warnings built on them.

Three sources, all optional and never an error when absent:

* `topology()`: the GPUs of this host through NVML (pynvml, from the
  nvidia-ml-py package): per GPU the model, memory, PCIe generation and width,
  NVLink links and the GPU (or switch) at the other end of each.  No pynvml,
  no driver or no GPU: an empty list.
* `native_state()`: what the interposition library saw in this process
  (`hvprof_nccl_json()`): whether an interposable NCCL exists (Horovod links
  NCCL statically by default, which hides its calls), whether libnccl and the
  CUDA driver are loaded, NCCL calls per op, and the device-time bookkeeping
  (event pool, pending pairs, misses by reason, anchor error).
* `read_sidecar()`: the same document written by the library at exit next to
  the raw file (raw/rank-R.nccl.json), for processes without Python (a C
  program under LD_PRELOAD) or converted by another process.

`process_metadata()` is what a rank's metadata carries ("gpus", "nccl");
`job_gpus()` / `gpu_warnings()` / `summary_lines()` read a merged trace's
metadata block for `profiler summarize` and `profiler report`.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

__all__ = [
    "REMEDY",
    "device_time_note",
    "finish_native",
    "gpu_warnings",
    "job_gpus",
    "native_state",
    "nccl_call_count",
    "process_metadata",
    "read_sidecar",
    "sidecar_path",
    "summary_lines",
    "topology",
    "topology_lines",
]

#: What to tell a user whose NCCL calls are invisible.
REMEDY = ("rebuild Horovod with HOROVOD_NCCL_LINK=SHARED (Horovod links NCCL statically by "
          "default, which hides ncclAllReduce from the profiler)")

# NVML constants used below (values from nvml.h; stable across versions).
_NVML_FEATURE_ENABLED = 1
_NVML_NVLINK_MAX_LINKS = 18


# ---------------------------------------------------------------------------
# Topology (NVML)
# ---------------------------------------------------------------------------
def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _try(fn: Any, *args: Any) -> Any:
    """fn(*args), or None when NVML says the query is not supported (or fails)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _import_nvml() -> ModuleType | None:
    try:
        import pynvml
    except Exception:
        return None
    return pynvml


def topology(nvml: ModuleType | None = None) -> list[dict[str, Any]]:
    """The GPUs of this host, one dict per GPU (NVML index order); [] without NVML/GPU.

    Keys: index, name, uuid, memory_bytes, pci_bus_id, pcie {gen, max_gen,
    width, max_width}, nvlink {links, version, peers [{link, peer, remote}]}
    where peer is the index of the GPU at the other end, or None for an
    NVSwitch / another host's device (remote is then its PCI bus id), and
    driver_version / cuda_driver_version.  `nvml` replaces the pynvml module
    (tests).
    """
    m = nvml if nvml is not None else _import_nvml()
    if m is None:
        return []
    try:
        m.nvmlInit()
    except Exception:
        return []
    try:
        return _read_gpus(m)
    except Exception:
        return []
    finally:
        _try(m.nvmlShutdown)


def _read_gpus(m: Any) -> list[dict[str, Any]]:
    count = int(m.nvmlDeviceGetCount())
    driver = _try(m.nvmlSystemGetDriverVersion)
    cuda = _try(m.nvmlSystemGetCudaDriverVersion)
    handles = [m.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus_ids: list[str] = []
    for h in handles:
        pci = _try(m.nvmlDeviceGetPciInfo, h)
        bus_ids.append(_norm_bus(_text(pci.busId)) if pci is not None else "")
    gpus: list[dict[str, Any]] = []
    for i, h in enumerate(handles):
        mem = _try(m.nvmlDeviceGetMemoryInfo, h)
        peers: list[dict[str, Any]] = []
        version = None
        for link in range(int(getattr(m, "NVML_NVLINK_MAX_LINKS", _NVML_NVLINK_MAX_LINKS))):
            state = _try(m.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                continue
            if int(state) != int(getattr(m, "NVML_FEATURE_ENABLED", _NVML_FEATURE_ENABLED)):
                continue
            v = _try(m.nvmlDeviceGetNvLinkVersion, h, link)
            if v is not None:
                version = int(v)
            remote = _try(m.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            rbus = _norm_bus(_text(remote.busId)) if remote is not None else ""
            peer = bus_ids.index(rbus) if rbus and rbus in bus_ids else None
            peers.append({"link": link, "peer": peer, "remote": rbus or None})
        gpus.append({
            "index": i,
            "name": _text(_try(m.nvmlDeviceGetName, h) or ""),
            "uuid": _text(_try(m.nvmlDeviceGetUUID, h) or ""),
            "memory_bytes": int(mem.total) if mem is not None else None,
            "pci_bus_id": bus_ids[i] or None,
            "pcie": {
                "gen": _int_or_none(_try(m.nvmlDeviceGetCurrPcieLinkGeneration, h)),
                "max_gen": _int_or_none(_try(m.nvmlDeviceGetMaxPcieLinkGeneration, h)),
                "width": _int_or_none(_try(m.nvmlDeviceGetCurrPcieLinkWidth, h)),
                "max_width": _int_or_none(_try(m.nvmlDeviceGetMaxPcieLinkWidth, h)),
            },
            "nvlink": {"links": len(peers), "version": version, "peers": peers},
            "driver_version": _text(driver) if driver is not None else None,
            "cuda_driver_version": _int_or_none(cuda),
        })
    return gpus


def _int_or_none(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _norm_bus(bus: str) -> str:
    """PCI bus ids in one spelling: NVML gives 00000000:1B:00.0 or 0000:1b:00.0."""
    bus = bus.strip().lower()
    if bus.count(":") == 2:
        dom, rest = bus.split(":", 1)
        bus = f"{int(dom, 16):08x}:{rest}" if dom else bus
    return bus


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
        out.append(f"GPU {_ranges(idx)}{where}: {name or 'unknown'}, {mem_s}, {pcie_s}")
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


def _ranges(idx: Iterable[int]) -> str:
    from profiler.merge import _ranges as ranges_text  # "0-3,5": one spelling everywhere

    return ranges_text(idx)


# ---------------------------------------------------------------------------
# The library's NCCL state
# ---------------------------------------------------------------------------
def _loaded_lib() -> ctypes.CDLL | None:
    """The interposition library if this process loaded it (ctypes or LD_PRELOAD)."""
    from profiler import _lib

    lib = _lib.loaded()
    if lib is not None:
        return lib
    try:
        glob = ctypes.CDLL(None)
        glob.hvprof_nccl_json  # noqa: B018 - present only when preloaded
    except (OSError, AttributeError):
        return None
    return glob


def native_state(lib: ctypes.CDLL | None = None) -> dict[str, Any] | None:
    """hvprof_nccl_json() of this process, parsed; None without the library."""
    lib = lib if lib is not None else _loaded_lib()
    if lib is None:
        return None
    try:
        fn = lib.hvprof_nccl_json
    except AttributeError:
        return None  # a library without NCCL support
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    raw = fn()
    if not raw:
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def finish_native(timeout_ms: int = -1, lib: ctypes.CDLL | None = None) -> int | None:
    """Collect this process's pending NCCL device times and write its sidecar.

    To be called before the raw file is closed and converted (the device
    records are written by the calling thread).  Returns the number of event
    pairs still pending after `timeout_ms` (negative: the library's default),
    or None when the library is not loaded.
    """
    lib = lib if lib is not None else _loaded_lib()
    if lib is None:
        return None
    try:
        fn = lib.hvprof_nccl_finish
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int]
    return int(fn(int(timeout_ms)))


def sidecar_path(raw_path: str | os.PathLike[str]) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R.nccl.json."""
    p = Path(raw_path)
    return p.with_name(p.name[: -len(".hvprof")] + ".nccl.json" if p.name.endswith(".hvprof")
                       else p.name + ".nccl.json")


def read_sidecar(raw_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The NCCL document the library wrote next to a raw file, or None."""
    path = sidecar_path(raw_path)
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def process_metadata(raw_path: str | os.PathLike[str] | None = None, *,
                     own_process: bool = True) -> dict[str, Any]:
    """{"gpus": [...], "nccl": {...} | None} for a rank's metadata document.

    own_process: this process is the rank (topology of this host, the live
    library state); otherwise only the sidecar next to raw_path is used.
    """
    nccl = read_sidecar(raw_path) if raw_path is not None else None
    if nccl is None and own_process:
        nccl = native_state()
    gpus = topology() if own_process else []
    return {"gpus": gpus, "nccl": nccl}


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
            f"within +/-{err / 1e3:.1f} us (anchor error)")


def summary_lines(meta: Mapping[str, Any] | None, df: Any = None) -> list[str]:
    """Everything GPU-related `profiler summarize` prints after its table."""
    out = gpu_warnings(meta, nccl_call_count(df))
    note = device_time_note(meta)
    if note:
        out.append(note)
    for host, gpus in job_gpus(meta).items():
        out += topology_lines(gpus, host)
    return out
