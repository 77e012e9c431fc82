"""GPUs of this host through NVML (pynvml, from the nvidia-ml-py package): per GPU
the model, memory, PCIe generation and width, NVLink links and the GPU (or
switch) at the other end of each.  No pynvml, no driver or no GPU: an empty
list, never an error.

`process_metadata()` is what a rank's metadata carries ("gpus", "nccl"): this
host's topology and the library's NCCL state (profiler.collect.native), or
the sidecar the library wrote next to the raw file."""

from __future__ import annotations

from types import ModuleType
from typing import Any

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
