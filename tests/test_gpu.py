"""profiler.analysis.gpu: topology through NVML, NCCL visibility warnings, summary lines.

This machine has no GPU: topology() is checked against the real pynvml (no
driver: empty), with pynvml absent, with NVML failing, and against a fake NVML
module describing a 4-GPU host (NVLink between pairs, one link to a switch).
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from profiler import layout
from profiler.analysis import gpu
from profiler.collect import nvml
from profiler.formats.raw import read_sidecar


class FakeNVMLError(Exception):
    pass


def fake_nvml(n: int = 4, *, fail_init: bool = False, nvlink: bool = True) -> ModuleType:
    """An NVML stand-in: GPU i at bus 0000000i:1B:00.0; NVLink: links 0-1 to the
    pair partner (0<->1, 2<->3), link 2 to an NVSwitch, links >= 3 not supported."""
    m = ModuleType("fake_pynvml")
    m.NVML_FEATURE_ENABLED = 1  # type: ignore[attr-defined]
    m.NVML_NVLINK_MAX_LINKS = 18  # type: ignore[attr-defined]
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def bus(i: int) -> str:
        return f"0000000{i}:1B:00.0"

    def nvlink_state(h: int, link: int) -> int:
        if not nvlink or link >= 3:
            raise FakeNVMLError("Not Supported")
        return 1

    def remote(h: int, link: int) -> Any:
        if link == 2:
            return SimpleNamespace(busId=b"00000000:C5:00.0")  # a switch
        return SimpleNamespace(busId=bus(h ^ 1).lower().replace("00000000", "0000").encode())

    def unsupported(*a: Any) -> Any:
        raise FakeNVMLError("Not Supported")

    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: n  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: "580.159.04"  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: 13000  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}"  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=143771 * 2**20)  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=bus(h))  # type: ignore[attr-defined]
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5  # type: ignore[attr-defined]
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16 if h else 8  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkState = nvlink_state  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkVersion = lambda h, link: 4  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkRemotePciInfo = remote  # type: ignore[attr-defined]
    m.calls = calls  # type: ignore[attr-defined]
    return m


def test_topology_empty_without_a_gpu_here() -> None:
    # the real pynvml on this machine: no driver library, so nothing, no error
    assert nvml.topology() == []


def test_topology_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert nvml.topology() == []


def test_topology_when_nvml_fails() -> None:
    m = fake_nvml(fail_init=True)
    assert nvml.topology(m) == []
    assert m.calls == ["init"]  # type: ignore[attr-defined]


def test_topology_when_a_query_fails_midway() -> None:
    m = fake_nvml()

    def boom() -> int:
        raise FakeNVMLError("GPU is lost")

    m.nvmlDeviceGetCount = boom  # type: ignore[attr-defined]
    assert nvml.topology(m) == []
    assert m.calls == ["init", "shutdown"]  # type: ignore[attr-defined]


def test_topology_of_a_four_gpu_host() -> None:
    m = fake_nvml()
    gpus = nvml.topology(m)
    assert m.calls == ["init", "shutdown"]  # type: ignore[attr-defined]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    g0, g3 = gpus[0], gpus[3]
    assert g0["name"] == "NVIDIA H200" and g0["uuid"] == "GPU-0000"
    assert g0["memory_bytes"] == 143771 * 2**20
    assert g0["pci_bus_id"] == "00000000:1b:00.0"
    assert g0["pcie"] == {"gen": 5, "max_gen": 5, "width": 8, "max_width": 16}
    assert g0["driver_version"] == "580.159.04" and g0["cuda_driver_version"] == 13000
    assert g0["nvlink"]["links"] == 3 and g0["nvlink"]["version"] == 4
    assert [(p["link"], p["peer"]) for p in g0["nvlink"]["peers"]] == [(0, 1), (1, 1), (2, None)]
    assert g0["nvlink"]["peers"][2]["remote"] == "00000000:c5:00.0"
    assert [p["peer"] for p in g3["nvlink"]["peers"]] == [2, 2, None]


def test_topology_lines() -> None:
    gpus = nvml.topology(fake_nvml())
    lines = gpu.topology_lines(gpus, "node1")
    assert lines[0] == "GPU 0 on node1: NVIDIA H200, 140 GiB, PCIe gen5 x8 (max gen5 x16)"
    assert lines[1] == "GPU 1-3 on node1: NVIDIA H200, 140 GiB, PCIe gen5 x16"
    assert lines[2] == "  GPU 0: NVLink v4, 3 links -> GPU 1 x2, NVSwitch/other x1"
    assert len(lines) == 6
    plain = gpu.topology_lines(nvml.topology(fake_nvml(2, nvlink=False)))
    assert plain[-1] == "  no NVLink: GPUs talk over PCIe"
    assert gpu.topology_lines([]) == []


def _state(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "visible": 0, "interposable": False, "nccl_loaded": False, "cuda_driver_loaded": True,
        "calls": {"nccl_allreduce": 0, "nccl_group": 0}, "device_records": 0,
        "miss": {"pool_empty": 0}, "unfinished": 0, "anchor_err_ns_max": 0,
    }
    base.update(kw)
    return base


def test_warning_when_gpus_used_and_no_nccl_call() -> None:
    meta = {"ranks": [{"rank": r, "host": "h", "nccl": _state()} for r in range(2)]}
    w = gpu.gpu_warnings(meta)
    assert len(w) == 1
    assert w[0].startswith("warning: 2 rank(s) used GPUs but no NCCL call was recorded "
                           "(2 of them: no interposable NCCL was loaded)")
    assert "HOROVOD_NCCL_LINK=SHARED" in w[0]


def test_invisible_nccl_names_its_version() -> None:
    assert gpu.nccl_version_text(21803) == "2.18.3"
    assert gpu.nccl_version_text(23203) == "2.32.3"
    assert gpu.nccl_version_text(2708) == "2.7.8"
    old = {"ranks": [{"rank": 0, "nccl": _state(nccl_version=21803, nccl_loaded=True)}]}
    w = gpu.gpu_warnings(old)
    assert len(w) == 2 and w[1].startswith("note: NCCL 2.18.3 predates NCCL's "
                                           "profiler-plugin interface (2.23)")
    new = {"ranks": [{"rank": 0, "nccl": _state(nccl_version=22304, nccl_loaded=True)}]}
    w = gpu.gpu_warnings(new)
    assert len(w) == 2 and "NCCL 2.23.4 has the profiler-plugin interface but did not" in w[1]
    assert len(gpu.gpu_warnings({"ranks": [{"rank": 0, "nccl": _state()}]})) == 1


def test_a_loaded_plugin_that_saw_nothing_says_why() -> None:
    # as on an H200 with NCCL 2.28.9 and torch.distributed at one rank
    # (benchmarks/gpu_check.sh, 2026-12-04): the plugin was loaded, the
    # communicator had one rank, NCCL reported nothing to it
    def meta(one: int, inits: int) -> dict[str, Any]:
        plugin = {"interface_version": 5, "comms_init": inits, "one_rank_comms": one,
                  "events": 0}
        return {"ranks": [{"rank": 0, "nccl": _state(nccl_version=22809, nccl_loaded=True,
                                                     interposable=True, plugin=plugin)}]}

    w = gpu.gpu_warnings(meta(1, 1))
    assert len(w) == 2 and w[1] == (
        "note: NCCL loaded the profiler's plugin, but every communicator (1) had one rank: "
        "NCCL runs a one-rank collective as a local copy that it reports to no profiler "
        "plugin")
    w = gpu.gpu_warnings(meta(1, 3))
    assert w[1] == ("note: NCCL loaded the profiler's plugin for 3 communicator(s) but "
                    "reported no collective to it")
    assert "did not load the profiler's plugin" in gpu.gpu_warnings(meta(0, 0))[1]


def test_no_warning_for_cpu_jobs_or_visible_nccl() -> None:
    cpu = {"ranks": [{"rank": 0, "nccl": _state(cuda_driver_loaded=False)}]}
    assert gpu.gpu_warnings(cpu) == []
    assert gpu.gpu_warnings({"ranks": [{"rank": 0}]}) == []
    assert gpu.gpu_warnings(None) == []
    seen = {"ranks": [{"rank": 0, "nccl": _state(interposable=True, nccl_loaded=True,
                                                 calls={"nccl_allreduce": 12})}]}
    assert gpu.gpu_warnings(seen) == []
    # the data decides when given: a DataFrame with NCCL host rows
    df = pd.DataFrame({"backend": ["nccl", "nccl", "mpi"], "device": [False, True, False]})
    assert gpu.nccl_call_count(df) == 1
    assert gpu.gpu_warnings({"ranks": [{"nccl": _state()}]}, gpu.nccl_call_count(df)) == []


def test_notes_on_device_time() -> None:
    st = _state(interposable=True, nccl_loaded=True, calls={"nccl_allreduce": 10},
                device_records=8, miss={"pool_empty": 2}, anchor_err_ns_max=3500)
    meta = {"ranks": [{"rank": 0, "host": "n1", "nccl": st,
                       "gpus": nvml.topology(fake_nvml(1, nvlink=False))}]}
    lines = gpu.summary_lines(meta)
    assert lines[0].startswith("note: 2 NCCL call(s) have no device time")
    assert lines[1] == ("NCCL device times: 8 intervals from CUDA events, placed on the host "
                        "clock within +/-3.50 us (anchor error)")
    assert lines[2].startswith("GPU 0 on n1: NVIDIA H200")


def test_sidecar_roundtrip(tmp_path: Any) -> None:
    raw = tmp_path / "raw" / "rank-00003.hvprof"
    raw.parent.mkdir()
    assert layout.sidecar_path(raw).name == "rank-00003.nccl.json"
    assert read_sidecar(raw) is None
    layout.sidecar_path(raw).write_text('{"visible": 7}\n')
    assert read_sidecar(raw) == {"visible": 7}
    layout.sidecar_path(raw).write_text("not json")
    assert read_sidecar(raw) is None
