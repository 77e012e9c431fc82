"""NCCL's profiler-plugin path (hooks/nccl_plugin.c) against the NCCL *stand-in*.

tests/standin/nccl_standin.c, built with -DSTANDIN_PROFILER_V=N, loads a
profiler plugin as NCCL's documented loader does (NCCL_PROFILER_PLUGIN, a
name or a path, or libnccl-profiler.so; the newest struct version it knows,
ncclProfiler_vN down to v1; init per communicator, Group/Coll/P2p events,
finalize).  Linked statically into tests/standin/nccl_app.c (as Horovod links
NCCL), the profiler library is loaded only as that plugin: no LD_PRELOAD, no
symbol wrapper sees a call.  Linked dynamically with the wrappers preloaded as
well, each call is recorded once.  Not NCCL: nothing is communicated.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from conftest import base_env
from test_nccl_standin import NCCL_DTYPES, OP, STANDIN, Run, _cc

from profiler.collect.native import library_path
from profiler.formats import raw
from profiler.formats import record as F
from profiler.formats.raw import read_raw

pytestmark = pytest.mark.timeout(120)

VERSIONS = (1, 4, 7)  # the stand-in's loader layouts: oldest, v4's init, newest
# "all" mode seen through the plugin: ncclBcast reaches NCCL's core as a
# Broadcast, and the group over two communicators is one group per communicator
# (one call each: recorded as plain calls)
PLUGIN_CALLS = {"nccl_allreduce": 31, "nccl_reducescatter": 1, "nccl_allgather": 1,
                "nccl_broadcast": 2, "nccl_reduce": 1, "nccl_send": 2, "nccl_recv": 2,
                "nccl_group": 2}
WRAPPER_CALLS = {"nccl_allreduce": 31, "nccl_reducescatter": 1, "nccl_allgather": 1,
                 "nccl_broadcast": 1, "nccl_bcast": 1, "nccl_reduce": 1, "nccl_send": 2,
                 "nccl_recv": 2, "nccl_group": 3}


@dataclass
class PBuilt:
    dir: Path
    static: dict[int, Path]       # version -> nccl_app with the stand-in linked in
    static_nocuda: Path           # v7, -DNO_CUDA (steps mode, the overhead figure)
    dynamic: Path                 # nccl_app against libnccl.so.2 (stand-in, v7 loader)


@pytest.fixture(scope="module")
def pbuilt(tmp_path_factory: pytest.TempPathFactory) -> PBuilt:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("plugin")
    cudart = d / "libcudart.so.12"
    _cc("-fPIC", "-shared", "-pthread", "-Wl,-soname,libcudart.so.12",
        str(STANDIN / "cudart_standin.c"), "-o", str(cudart))
    static = {}
    for v in VERSIONS:
        static[v] = d / f"nccl_app_static_v{v}"
        _cc(f"-DSTANDIN_PROFILER_V={v}", "-pthread", str(STANDIN / "nccl_app.c"),
            str(STANDIN / "nccl_standin.c"), "-o", str(static[v]), str(cudart),
            f"-Wl,-rpath,{d}", "-ldl")
    nocuda = d / "nccl_app_static_nocuda"
    _cc("-DNO_CUDA", "-DSTANDIN_PROFILER_V=7", "-pthread", str(STANDIN / "nccl_app.c"),
        str(STANDIN / "nccl_standin.c"), "-o", str(nocuda), "-ldl")
    dyn = d / "dyn"
    dyn.mkdir()
    nccl = dyn / "libnccl.so.2"
    _cc("-fPIC", "-shared", "-pthread", "-DSTANDIN_PROFILER_V=7", "-Wl,-soname,libnccl.so.2",
        str(STANDIN / "nccl_standin.c"), "-o", str(nccl), "-ldl")
    app = dyn / "nccl_app"
    _cc(str(STANDIN / "nccl_app.c"), "-o", str(app), str(nccl), str(cudart),
        f"-Wl,-rpath,{dyn}:{d}", "-ldl")
    return PBuilt(d, static, nocuda, app)


def run(app: Path, tmp_path: Path, *args: str, preload: bool = False, rank: int = 0,
        world: int = 1, plugin: str | None = "own", **env: str) -> Run:
    prof = tmp_path / f"prof-{args[0]}-{rank}"
    extra = dict(env)
    if preload:
        extra["LD_PRELOAD"] = str(library_path())
    if plugin == "own":
        extra["NCCL_PROFILER_PLUGIN"] = str(library_path())
    elif plugin is not None:
        extra["NCCL_PROFILER_PLUGIN"] = plugin
    full = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof), RANK=str(rank),
                    WORLD_SIZE=str(world), LOCAL_RANK="0", **extra)
    if plugin is None:
        full.pop("NCCL_PROFILER_PLUGIN", None)
    proc = subprocess.run([str(app), *args], env=full, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = orjson.loads(proc.stdout.strip().splitlines()[-1])
    raw_path = prof / "raw" / f"rank-{rank:05d}.hvprof"
    return Run(out, read_raw(raw_path), raw.read_sidecar(raw_path), prof)


@pytest.fixture(scope="module", params=VERSIONS, ids=[f"v{v}" for v in VERSIONS])
def static_run(request: pytest.FixtureRequest, pbuilt: PBuilt,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Run]:
    v = int(request.param)
    return v, run(pbuilt.static[v], tmp_path_factory.mktemp(f"static{v}"), "all",
                  APP_DELAY_US="100", APP_DELAY_N="10")


def test_static_nccl_every_call_recorded_through_the_plugin(static_run: tuple[int, Run]) -> None:
    v, r = static_run
    host = r.host()
    assert len(r.device()) == 0  # no CUDA events on this path
    got = Counter(F.op_name(int(op)) for op in host["op"])
    assert got == PLUGIN_CALLS
    assert r.out["standin_calls"] == len(host) - 2 == 40  # every executed call, once
    assert r.out["profiler"] is None  # the library is not in the program's global scope
    side = r.sidecar
    assert side is not None
    assert {k: n for k, n in side["calls"].items() if n} == PLUGIN_CALLS
    assert side["plugin"]["interface_version"] == v
    assert side["seen_by"] == ["plugin"] and side["recorded_by"] == "plugin"
    assert side["wrapper_records"] == 0 and side["plugin"]["records"] == len(host)
    assert side["plugin"]["comms_init"] == 5  # world, two (InitAll), sub, cfg
    # of one rank: world, sub, cfg (init gives nranks from v4 on)
    assert side["plugin"]["one_rank_comms"] == (3 if v >= 4 else 0)
    assert not r.raw.problems
    assert r.raw.header["state"] & F.STATE_CLOSED


def test_static_bytes_dtypes_arguments(static_run: tuple[int, Run]) -> None:
    v, r = static_run
    host = r.host()
    world = host[(host["comm"] == 0) & (host["op"] != OP["NCCL_GROUP"])]
    seq = {int(x["seq"]): x for x in world}
    assert sorted(seq) == list(range(len(world)))
    summ = "sum" if v == 1 else "none"  # v2 on: no reduction operator in the descriptor
    for dt, (code, size) in enumerate(NCCL_DTYPES):
        x = seq[dt]
        assert (int(x["op"]), int(x["dtype"]), int(x["dtype_size"])) == (
            OP["NCCL_ALLREDUCE"], code, size)
        assert int(x["count"]) == 1000 + dt and int(x["bytes"]) == (1000 + dt) * size
        assert F.redop_name(int(x["redop"])) == summ
        assert int(x["t_end"]) >= int(x["t_start"]) > 0
    assert int(seq[12]["bytes"]) == 28 and int(seq[12]["flags"]) & F.FLAG_IN_PLACE
    assert F.redop_name(int(seq[12]["redop"])) == ("max" if v == 1 else "none")
    expect = [  # seq: op, count, bytes, dtype, root/peer
        (13, "nccl_reducescatter", 100, 400, "ncclFloat32", -1),
        (14, "nccl_allgather", 50, 400, "ncclInt64", -1),
        (15, "nccl_broadcast", 33, 264, "ncclFloat64", 0),
        (16, "nccl_broadcast", 21, 21, "ncclUint8", 0),  # ncclBcast
        (17, "nccl_reduce", 17, 68, "ncclInt32", 0),
        (18, "nccl_send", 9, 18, "ncclFloat16", 0),
        (19, "nccl_recv", 11, 22, "ncclBfloat16", 0),
    ]
    for s, op, count, nbytes, dtype, root in expect:
        x = seq[s]
        assert (F.op_name(int(x["op"])), int(x["count"]), int(x["bytes"]),
                F.dtype_name(int(x["dtype"])), int(x["root"])) == (op, count, nbytes, dtype, root)
    if v == 1:
        assert F.redop_name(int(seq[17]["redop"])) == "prod"
    assert int(seq[16]["flags"]) & F.FLAG_IN_PLACE


def test_static_groups(static_run: tuple[int, Run]) -> None:
    _, r = static_run
    host = r.host()
    groups = host[host["op"] == OP["NCCL_GROUP"]]
    assert [(int(g["aux"]), int(g["count"]), int(g["bytes"])) for g in groups] == [
        (1, 3, (5 + 5 + 64) * 4), (2, 2, 2 * 8 * 8)]
    assert list(groups["seq"]) == list(groups["aux"])
    grouped = host[(host["flags"] & F.FLAG_GROUPED) != 0]
    assert Counter(int(a) for a in grouped["aux"]) == {1: 3, 2: 2}
    for g in groups:
        members = grouped[grouped["aux"] == g["aux"]]
        assert int(g["t_start"]) <= int(members["t_start"].min())
        assert int(g["t_end"]) >= int(members["t_end"].max())
    side = r.sidecar
    assert side is not None
    # 35 calls ran in a group of their own (NCCL's implicit group): plain rows
    assert side["plugin"]["single_call_groups"] == 35


def test_static_communicators(static_run: tuple[int, Run]) -> None:
    _, r = static_run
    comms = r.raw.comms
    assert all(c["name"].startswith(b"nccl") and int(c["backend"]) == 1 for c in comms)
    ids = [int(i) for i in comms["id"]]
    # world, two[0], two[1] (one communicator: one id), sub, cfg
    assert len(ids) == 5 and ids[1] == ids[2] and len(set(ids)) == 4
    assert all(i != 0 for i in ids)


def test_comm_id_matches_across_ranks(pbuilt: PBuilt, tmp_path: Path) -> None:
    runs = [run(pbuilt.static_nocuda, tmp_path, "steps", "5", rank=k, world=2,
                STANDIN_UID="job-42") for k in (0, 1)]
    ids = [int(x.raw.comms["id"][0]) for x in runs]
    assert ids[0] == ids[1] != 0
    assert [(int(c["size"]), int(c["rank"])) for c in (x.raw.comms[0] for x in runs)] in (
        [(-1, 0), (-1, 1)], [(2, 0), (2, 1)])
    for x in runs:
        assert len(x.host()) == 5 and list(x.host()["seq"]) == list(range(5))
        assert set(int(b) for b in x.host()["bytes"]) == {4096}


def test_shared_nccl_both_paths_record_each_call_once(pbuilt: PBuilt, tmp_path: Path) -> None:
    r = run(pbuilt.dynamic, tmp_path, "all", preload=True, APP_DELAY_US="100", APP_DELAY_N="10")
    host = r.host()
    got = Counter(F.op_name(int(op)) for op in host["op"])
    assert got == WRAPPER_CALLS  # the wrappers' rows, none twice
    assert r.out["standin_calls"] == len(host) - 3 == 40
    prof = r.out["profiler"]
    assert prof["calls"] == WRAPPER_CALLS
    assert prof["seen_by"] == ["wrappers", "plugin"] and prof["recorded_by"] == "wrappers"
    pl = prof["plugin"]
    assert pl["interface_version"] == 7 and pl["records"] == 0
    assert pl["silent_in_wrapper"] == pl["events"] > 0
    assert len(r.device()) > 0  # the wrappers' CUDA-event path still runs


def test_wrappers_off_leaves_the_plugin_path_alone(pbuilt: PBuilt, tmp_path: Path) -> None:
    """HOROVOD_PROFILE_NCCL_WRAPPERS=0 (gpu_check's "plugin" path in Python,
    where activation loads the library globally): the wrappers pass through,
    the plugin records every call once."""
    r = run(pbuilt.dynamic, tmp_path, "all", preload=True, HOROVOD_PROFILE_NCCL_WRAPPERS="0")
    assert Counter(F.op_name(int(op)) for op in r.host()["op"]) == PLUGIN_CALLS
    side = r.sidecar
    assert side is not None and side["seen_by"] == ["plugin"]
    assert side["recorded_by"] == "plugin" and side["wrapper_records"] == 0
    assert side["plugin"]["silent_in_wrapper"] == 0


def test_default_name_and_none(pbuilt: PBuilt, tmp_path: Path) -> None:
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libnccl-profiler.so").symlink_to(library_path())
    r = run(pbuilt.static_nocuda, tmp_path, "steps", "3", plugin=None,
            LD_LIBRARY_PATH=str(libdir))
    assert len(r.host()) == 3
    assert r.sidecar is not None and r.sidecar["plugin"]["interface_version"] == 7
    # NCCL_PROFILER_PLUGIN=none: no plugin; nothing else sees a static NCCL
    prof = tmp_path / "none"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof), RANK="0",
                   WORLD_SIZE="1", NCCL_PROFILER_PLUGIN="none")
    p = subprocess.run([str(pbuilt.static_nocuda), "steps", "3"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert not (prof / "raw").exists()


def test_metadata_names_path_and_version(static_run: tuple[int, Run]) -> None:
    from profiler.formats.raw import read_sidecar

    v, r = static_run
    raw_path = r.profile_dir / "raw" / "rank-00000.hvprof"
    nccl = read_sidecar(raw_path)
    assert nccl["seen_by"] == ["plugin"] and nccl["recorded_by"] == "plugin"
    assert nccl["plugin"]["interface_version"] == v
    assert nccl["plugin"]["versions_exported"] == [1, 2, 3, 4, 5, 6, 7]
    from profiler.analysis import gpu

    line = gpu.nccl_path_line({"ranks": [{"rank": 0, "nccl": nccl}]})
    assert line == (f"NCCL seen through: plugin; recorded by plugin; NCCL profiler-plugin "
                    f"interface v{v}")
    both = dict(nccl, seen_by=["wrappers", "plugin"], recorded_by="wrappers")
    assert gpu.nccl_path_line({"ranks": [{"nccl": both}]}).startswith(  # type: ignore[union-attr]
        "NCCL seen through: wrappers, plugin; recorded by wrappers")
    assert gpu.nccl_path_line({"ranks": [{"nccl": {"calls": {}}}]}) is None


def test_library_exports_every_version() -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not installed")
    out = subprocess.run([nm, "-D", "--defined-only", library_path()], check=True,
                         capture_output=True, text=True).stdout
    names = {f[-1] for f in (line.split() for line in out.splitlines()) if f}
    assert {f"ncclProfiler_v{v}" for v in range(1, 8)} <= names


# ---- activation: NCCL_PROFILER_PLUGIN --------------------------------------

PROBE = "import os; print(os.environ.get('NCCL_PROFILER_PLUGIN'))"


def _py(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(tmp_path / "p"), **env)
    if "NCCL_PROFILER_PLUGIN" not in env:
        full.pop("NCCL_PROFILER_PLUGIN", None)
    return subprocess.run([sys.executable, "-c", PROBE], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_activation_sets_the_plugin(tmp_path: Path) -> None:
    p = _py(tmp_path)
    assert p.returncode == 0, p.stderr
    assert os.path.realpath(p.stdout.strip()) == os.path.realpath(library_path())
    assert "NCCL_PROFILER_PLUGIN" not in p.stderr


def test_activation_user_plugin_takes_precedence(tmp_path: Path) -> None:
    p = _py(tmp_path, NCCL_PROFILER_PLUGIN="/opt/theirs/libnccl-profiler.so")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "/opt/theirs/libnccl-profiler.so"
    lines = [x for x in p.stderr.splitlines() if "NCCL_PROFILER_PLUGIN" in x]
    assert len(lines) == 1 and "takes precedence" in lines[0]
    # other ranks say nothing
    q = _py(tmp_path, NCCL_PROFILER_PLUGIN="/opt/theirs/libnccl-profiler.so",
            OMPI_COMM_WORLD_RANK="1")
    assert q.returncode == 0 and "NCCL_PROFILER_PLUGIN" not in q.stderr
    # our own path set by hand: silent
    r = _py(tmp_path, NCCL_PROFILER_PLUGIN=str(library_path()))
    assert r.returncode == 0 and "NCCL_PROFILER_PLUGIN" not in r.stderr


def test_overhead_per_call_stand_in(pbuilt: PBuilt, tmp_path: Path) -> None:
    """Host ns per call through the plugin, on the STAND-IN (not NCCL): printed,
    bounded loosely (a timed figure is a benchmark's job, not a test's).  Rank
    1 of 2 (the stand-in needs no peer): rank 0's exit would also build the
    trace (hooks/exitmerge.c), which is no cost per call."""
    import time

    n = 200_000

    def wall(plugin: str) -> float:
        env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(tmp_path / plugin[-4:]),
                       RANK="1", WORLD_SIZE="2", NCCL_PROFILER_PLUGIN=plugin)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            p = subprocess.run([str(pbuilt.static_nocuda), "steps", str(n)], env=env,
                               capture_output=True, text=True, timeout=60)
            best = min(best, time.perf_counter() - t0)
            assert p.returncode == 0, p.stderr
        return best

    off = wall("none")
    on = wall(str(library_path()))
    per_call_ns = (on - off) / n * 1e9
    print(f"stand-in: plugin path host cost {per_call_ns:.0f} ns per call "
          f"(best of 3, {n} allreduces)")
    assert np.isfinite(per_call_ns) and per_call_ns < 20_000


# ---- the real NCCL (nvidia-nccl-cu12), only where it is already on disk -----

REAL_NCCL_VERSION = 23203  # nvidia-nccl-cu12 2.32.3


def _real_nccl() -> Path | None:
    """libnccl.so.2 of nvidia-nccl-cu12: $HVPROF_REAL_NCCL, the copy
    scripts/setup.sh caches in ~/.cache/horovod-profiler/nccl-2.32.3 (6-10 s
    once), an installed nvidia.nccl package, or a wheel already in the wheel
    cache (extracted here).  Nothing is downloaded by the tests."""
    env = os.environ.get("HVPROF_REAL_NCCL")
    if env and Path(env).is_file():
        return Path(env)
    root = Path.home() / ".cache" / "horovod-profiler"
    cached = root / "nccl-2.32.3" / "libnccl.so.2"
    if cached.is_file():
        return cached
    for base in map(Path, sys.path):
        lib = base / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        if lib.is_file():
            return lib
    return None


_LOAD_NCCL = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int(0)
rc = lib.ncclGetVersion(ctypes.byref(v))
print(rc, v.value)
"""


def test_real_nccl_names_the_versions_exported() -> None:
    """NCCL's own library (no GPU here): it loads, says 2.32.3, and the
    ncclProfiler_vN names it looks for are all ones this library exports."""
    found = _real_nccl()
    if found is None:
        pytest.skip("nvidia-nccl-cu12 not on this machine (scripts/setup.sh caches it unless "
                    "HVPROF_NO_REAL_NCCL=1; or set HVPROF_REAL_NCCL to a libnccl.so.2)")
    p = subprocess.run([sys.executable, "-c", _LOAD_NCCL, str(found)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", str(REAL_NCCL_VERSION)]
    import mmap
    import re

    with open(found, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        assert data.find(b"NCCL_PROFILER_PLUGIN") >= 0
        named = {int(x) for x in re.findall(rb"ncclProfiler_v(\d+)\0", data)}  # one pass
    assert named, "no ncclProfiler_vN string in libnccl.so.2"
    exported = {int(x) for x in orjson.loads(_plugin_json_versions())}
    # every version that NCCL looks for is one this library exports
    assert named <= exported, (sorted(named), sorted(exported))
    assert named == set(range(1, 8)), sorted(named)  # 2.32.3 looks for v1 ... v7


def _plugin_json_versions() -> bytes:
    """The versions the built library exports, from its dynamic symbols."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not installed")
    out = subprocess.run([nm, "-D", "--defined-only", str(library_path())], capture_output=True,
                         text=True, check=True).stdout
    vs = sorted({int(w.rsplit("_v", 1)[1]) for w in out.split()
                 if w.startswith("ncclProfiler_v") and w.rsplit("_v", 1)[1].isdigit()})
    return orjson.dumps(vs)


def test_preloaded_library_points_nccl_at_itself(pbuilt: PBuilt, tmp_path: Path) -> None:
    """A non-Python program started with LD_PRELOAD and a static NCCL: the
    library's constructor sets NCCL_PROFILER_PLUGIN (unset by the user)."""
    r = run(pbuilt.static_nocuda, tmp_path, "steps", "4", preload=True, plugin=None)
    assert len(r.host()) == 4
    assert r.sidecar is not None and r.sidecar["recorded_by"] == "plugin"
    # the user's own value is kept
    prof = tmp_path / "theirs"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof), RANK="0",
                   WORLD_SIZE="1", LD_PRELOAD=str(library_path()), NCCL_PROFILER_PLUGIN="none")
    p = subprocess.run([str(pbuilt.static_nocuda), "steps", "4"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    side = raw.read_sidecar(prof / "raw" / "rank-00000.hvprof") if (prof / "raw").exists() \
        else None
    assert side is None or side["calls"]["nccl_allreduce"] == 0


# ---- proxy, network and kernel-channel events (the stand-in's proxy thread) ----

SD_CHANNELS, SD_STEPS = 2, 4  # tests/standin/nccl_standin.c


def _fake_kernel_ns(nbytes: int) -> int:
    return 20000 + nbytes // 16  # SD_FAKE_KERNEL_NS: a stand-in's FAKE kernel time


@pytest.mark.parametrize("v", VERSIONS, ids=[f"v{v}" for v in VERSIONS])
def test_proxy_events_summed_per_call(pbuilt: PBuilt, tmp_path: Path, v: int) -> None:
    """The stand-in's proxy thread raises, after each collective's Coll event
    stopped, 2 channels x (send, receive) ProxyOps of 4 steps (v4 on: each
    with a NetPlugin event, and a KernelCh event per channel with FAKE GPU
    timers).  Each call gets one NCCL_NET record (never a row per step) and,
    v4 on, one DEVICE record; v1 has no kernel timers."""
    n = 6
    r = run(pbuilt.static_nocuda if v == 7 else pbuilt.static[v], tmp_path, "steps", str(n),
            STANDIN_NCCL_PROXY="1")
    rec = r.raw.records
    host = rec[((rec["flags"] & F.FLAG_DEVICE) == 0) & (rec["op"] == OP["NCCL_ALLREDUCE"])]
    net = rec[rec["op"] == 73]  # NCCL_NET (hvprof_format.h)
    dev = rec[(rec["flags"] & F.FLAG_DEVICE) != 0]
    assert len(host) == n and len(net) == n
    assert sorted(net["seq"].tolist()) == sorted(host["seq"].tolist())
    assert (net["comm"] == host["comm"][0]).all()
    assert (net["bytes"] == 4096).all() and (net["count"] == 4096).all()  # sent, received
    assert (net["root"] == SD_CHANNELS * 2 * SD_STEPS).all()  # steps
    assert (net["dtype_size"] == SD_CHANNELS * 2).all()  # proxy ops
    assert (net["aux"] == (SD_CHANNELS * 2 * SD_STEPS if v >= 4 else 0)).all()  # net events
    side = r.sidecar
    assert side is not None
    p = side["plugin"]
    assert p["net_records"] == n and p["child_orphans"] == 0 and p["child_remote_pid"] == 0
    assert side["calls"]["nccl_allreduce"] == n  # the auxiliary records are no calls
    if v < 4:
        assert len(dev) == 0 and p["device_time"] == "cuda_events_of_the_wrappers"
        return
    assert p["device_time"] == "kernel_channel_timers" and p["device_records"] == n
    assert len(dev) == n and sorted(dev["seq"].tolist()) == sorted(host["seq"].tolist())
    tpn = float(r.raw.header["ticks_per_ns"])
    dur = (dev["t_end"].astype(np.int64) - dev["t_start"].astype(np.int64)) / tpn
    assert np.allclose(dur, _fake_kernel_ns(4096), atol=2.0), dur
    # on the host axis: after the call's enqueue began, within the report delay
    hs = {int(x["seq"]): int(x["t_start"]) for x in host}
    lag = np.array([(int(d["t_start"]) - hs[int(d["seq"])]) / tpn for d in dev])
    assert (lag >= 0).all() and (lag < 50e6).all(), lag


def test_proxy_aggregates_carried_to_parquet_trace_and_summarize(pbuilt: PBuilt,
                                                                 tmp_path: Path) -> None:
    from conftest import profiler_cli

    from profiler.analysis import load

    r = run(pbuilt.static_nocuda, tmp_path, "steps", "5", STANDIN_NCCL_PROXY="1")
    res = profiler_cli("merge", str(r.profile_dir), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    df = load(r.profile_dir / "trace.json")
    assert "nccl_net" not in set(df["op"].astype(str))  # folded, not rows
    host = df[~df["device"].astype(bool)]
    assert len(host) == 5 and (host["net_send_bytes"] == 4096).all()
    assert (host["net_recv_bytes"] == 4096).all() and (host["net_steps"] == 16).all()
    assert (host["net_ns"] > 0).all()
    dev = df[df["device"].astype(bool)]
    assert len(dev) == 5 and (dev["dur_ns"] - _fake_kernel_ns(4096)).abs().max() <= 2
    # the trace itself (not only the parquet files) carries both
    from profiler.formats.tracejson import events_to_frame, read_trace

    _, events = read_trace(r.profile_dir / "trace.json")
    tf = events_to_frame(events)
    assert int((tf["net_send_bytes"] == 4096).sum()) == 5 and int(tf["device"].sum()) == 5
    out = profiler_cli("summarize", str(r.profile_dir / "trace.json"), cwd=tmp_path,
                       env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert "NCCL network (plugin proxy events; time: mean span per call):" in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("  nccl_allreduce: 5 calls"))
    assert "sent 20 KiB" in line and "recv 20 KiB" in line and len(line) <= 80
    from profiler.analysis import gpu

    worst = gpu.network_lines(pd.DataFrame({
        "op": ["nccl_reducescatter"] * 2, "net_send_bytes": [1 << 40] * 2,
        "net_recv_bytes": [(1 << 40) - 1] * 2, "net_ns": [999_999_999] * 2}))
    assert max(len(x) for x in worst) <= 80, worst


def test_proxy_events_off(pbuilt: PBuilt, tmp_path: Path) -> None:
    r = run(pbuilt.static_nocuda, tmp_path, "steps", "3", STANDIN_NCCL_PROXY="1",
            HOROVOD_PROFILE_NCCL_PROXY="0")
    assert r.sidecar is not None
    p = r.sidecar["plugin"]
    assert p["activation_mask"] == 7 and p["child_events"] == 0 and p["net_records"] == 0
    assert len(r.raw.records) == 3
