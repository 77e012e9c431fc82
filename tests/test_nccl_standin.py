"""NCCL interposition against the project's NCCL and CUDA *stand-ins*.

tests/standin/nccl_standin.c and cudart_standin.c are built here into a
temporary directory as libnccl.so.2 and libcudart.so.12 (not NCCL, not CUDA:
trivial semantics, virtual streams with a controllable per-call delay, and
counters of every synchronization).  tests/standin/nccl_app.c drives them
under LD_PRELOAD of the packaged library with HOROVOD_PROFILE=1 and no MPI;
the raw file is read back with profiler.formats.raw and checked with exact counts.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from conftest import PYTHON, ROOT, base_env, mpirun, profiler_cli, requires_mpi

from profiler.analysis import gpu
from profiler.collect.native import library_path
from profiler.formats import raw
from profiler.formats import record as F
from profiler.formats.raw import RawFile, read_raw

pytestmark = pytest.mark.timeout(120)

STANDIN = ROOT / "tests" / "standin"
OP = {name: F.OP_BY_CNAME[name] for name in (
    "NCCL_ALLREDUCE", "NCCL_REDUCESCATTER", "NCCL_ALLGATHER", "NCCL_BROADCAST", "NCCL_BCAST",
    "NCCL_REDUCE", "NCCL_SEND", "NCCL_RECV", "NCCL_GROUP")}
# ncclDataType_t 0..11 -> (hvprof dtype code, bytes per element)
NCCL_DTYPES = [(64, 1), (65, 1), (66, 4), (67, 4), (68, 8), (69, 8), (70, 2), (71, 4), (72, 8),
               (73, 2), (74, 1), (75, 1)]
POOL_PAIRS = 1024  # the library's default HOROVOD_PROFILE_NCCL_EVENTS


@dataclass
class Built:
    dir: Path
    app: Path
    app_nocuda: Path
    nccl: Path
    cudart: Path
    driver: Path


def _cc(*args: str) -> None:
    # the library's strictness (setup.py CFLAGS): -Wall -Wextra -Werror, nothing exempted
    cmd = ["gcc", "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("standin")
    cudart, nccl, driver = d / "libcudart.so.12", d / "libnccl.so.2", d / "libcuda.so.1"
    _cc("-fPIC", "-shared", "-pthread", "-Wl,-soname,libcudart.so.12",
        str(STANDIN / "cudart_standin.c"), "-o", str(cudart))
    _cc("-fPIC", "-shared", "-pthread", "-Wl,-soname,libnccl.so.2",
        str(STANDIN / "nccl_standin.c"), "-o", str(nccl), "-ldl")
    _cc("-fPIC", "-shared", "-Wl,-soname,libcuda.so.1",
        str(STANDIN / "cuda_driver_standin.c"), "-o", str(driver))
    app, app_nocuda = d / "nccl_app", d / "nccl_app_nocuda"
    _cc(str(STANDIN / "nccl_app.c"), "-o", str(app), str(nccl), str(cudart),
        f"-Wl,-rpath,{d}", "-ldl")
    _cc("-DNO_CUDA", str(STANDIN / "nccl_app.c"), "-o", str(app_nocuda), str(nccl),
        f"-Wl,-rpath,{d}", "-ldl")
    return Built(d, app, app_nocuda, nccl, cudart, driver)


@dataclass
class Run:
    out: dict[str, Any]
    raw: RawFile
    sidecar: dict[str, Any] | None
    profile_dir: Path

    def host(self) -> np.ndarray:
        r = self.raw.records
        return r[(r["flags"] & F.FLAG_DEVICE) == 0]

    def device(self) -> np.ndarray:
        r = self.raw.records
        return r[(r["flags"] & F.FLAG_DEVICE) != 0]

    def us(self, ticks: np.ndarray | int) -> np.ndarray:
        return np.asarray(ticks, dtype=np.float64) / float(self.raw.header["ticks_per_ns"]) / 1e3


def run_app(built: Built, tmp_path: Path, *args: str, app: Path | None = None,
            rank: int = 0, **env: str) -> Run:
    prof = tmp_path / f"prof-{args[0]}"
    full = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof), RANK=str(rank),
                    WORLD_SIZE="1", LOCAL_RANK="0", LD_PRELOAD=str(library_path()), **env)
    proc = subprocess.run([str(app or built.app), *args], env=full, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = orjson.loads(proc.stdout.strip().splitlines()[-1])
    raw_path = prof / "raw" / f"rank-{rank:05d}.hvprof"
    return Run(out, read_raw(raw_path), raw.read_sidecar(raw_path), prof)


@pytest.fixture(scope="module")
def run_all(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_app(built, tmp_path_factory.mktemp("all"), "all",
                   APP_DELAY_US="3000", APP_DELAY_N="10")


def test_every_wrapped_call_is_recorded_once(run_all: Run) -> None:
    host = run_all.host()
    got = Counter(F.op_name(int(op)) for op in host["op"])
    assert got == {"nccl_allreduce": 31, "nccl_reducescatter": 1, "nccl_allgather": 1,
                   "nccl_broadcast": 1, "nccl_bcast": 1, "nccl_reduce": 1, "nccl_send": 2,
                   "nccl_recv": 2, "nccl_group": 3}
    prof = run_all.out["profiler"]
    assert prof["calls"] == dict(got)
    # every call the stand-in executed was recorded exactly once: ncclBcast's own
    # internal ncclBroadcast passed through unrecorded
    assert run_all.out["standin_calls"] == len(host) - 3 == 40
    assert prof["nested_calls"] == 1
    assert prof["empty_groups"] == 1
    assert prof["visible"] == 7 and prof["interposable"] and prof["nccl_loaded"]
    assert prof["nccl_version"] == run_all.out["nccl_version"] == 22105
    assert not run_all.raw.problems
    assert run_all.raw.header["state"] & F.STATE_CLOSED


def test_bytes_dtypes_and_arguments(run_all: Run) -> None:
    host = run_all.host()
    world = host[(host["comm"] == 0) & (host["op"] != OP["NCCL_GROUP"])]
    seq = {int(r["seq"]): r for r in world}
    assert sorted(seq) == list(range(len(world)))  # one call number per call, no gaps
    for dt, (code, size) in enumerate(NCCL_DTYPES):
        r = seq[dt]
        assert (int(r["op"]), int(r["dtype"]), int(r["dtype_size"])) == (
            OP["NCCL_ALLREDUCE"], code, size)
        assert int(r["count"]) == 1000 + dt
        assert int(r["bytes"]) == (1000 + dt) * size
        assert F.redop_name(int(r["redop"])) == "sum"
        assert int(r["flags"]) & F.FLAG_IN_PLACE == 0
    inplace = seq[12]
    assert int(inplace["bytes"]) == 28 and F.redop_name(int(inplace["redop"])) == "max"
    assert int(inplace["flags"]) & F.FLAG_IN_PLACE
    expect = [  # seq: op, count, bytes, dtype name, redop, root
        (13, "nccl_reducescatter", 100, 400, "ncclFloat32", "sum", -1),
        (14, "nccl_allgather", 50, 400, "ncclInt64", "none", -1),
        (15, "nccl_broadcast", 33, 264, "ncclFloat64", "none", 0),
        (16, "nccl_bcast", 21, 21, "ncclUint8", "none", 0),
        (17, "nccl_reduce", 17, 68, "ncclInt32", "prod", 0),
        (18, "nccl_send", 9, 18, "ncclFloat16", "none", 0),
        (19, "nccl_recv", 11, 22, "ncclBfloat16", "none", 0),
    ]
    for s, op, count, nbytes, dtype, redop, root in expect:
        r = seq[s]
        assert (F.op_name(int(r["op"])), int(r["count"]), int(r["bytes"]),
                F.dtype_name(int(r["dtype"])), F.redop_name(int(r["redop"])),
                int(r["root"])) == (op, count, nbytes, dtype, redop, root)
    assert int(seq[16]["flags"]) & F.FLAG_IN_PLACE  # ncclBcast: one buffer


def test_communicators(run_all: Run) -> None:
    comms = run_all.raw.comms
    handles = [int(h) for h in comms["handle"]]
    out = run_all.out
    world, sub, cfg = (int(out[k], 16) for k in ("comm", "sub", "cfg"))
    two0, two1 = (int(x, 16) for x in out["two"])
    assert handles == [world, two0, two1, sub, cfg]
    assert out["none"] == "(nil)"  # NCCL_SPLIT_NOCOLOR: no communicator, no entry
    assert [(int(c["size"]), int(c["rank"])) for c in comms] == [(1, 0), (2, 0), (2, 1), (1, 0),
                                                                 (1, 0)]
    assert all(c["name"].startswith(b"nccl") and int(c["backend"]) == 1 for c in comms)
    ids = [int(i) for i in comms["id"]]
    assert ids[1] == ids[2]  # ncclCommInitAll: one communicator, two members
    assert len({ids[0], ids[1], ids[3], ids[4]}) == 4


def test_groups(run_all: Run) -> None:
    host = run_all.host()
    groups = host[host["op"] == OP["NCCL_GROUP"]]
    assert [(int(g["aux"]), int(g["count"]), int(g["bytes"])) for g in groups] == [
        (1, 3, (5 + 5 + 64) * 4), (2, 2, 2 * 8 * 8), (4, 2, 2 * 16 * 4)]  # 3 was empty
    assert list(groups["seq"]) == list(groups["aux"])
    grouped = host[(host["flags"] & F.FLAG_GROUPED) != 0]
    assert Counter(int(a) for a in grouped["aux"]) == {1: 3, 2: 2, 4: 2}
    assert all(int(g["flags"]) & F.FLAG_GROUPED == 0 for g in groups)
    assert all(int(r["aux"]) == 0 for r in host[(host["flags"] & F.FLAG_GROUPED) == 0]
               if int(r["op"]) != OP["NCCL_GROUP"])
    for g in groups:  # each group spans its members on the host
        members = grouped[grouped["aux"] == g["aux"]]
        assert int(g["t_start"]) <= int(members["t_start"].min())
        assert int(g["t_end"]) >= int(members["t_end"].max())
    dev = run_all.device()
    # members have no device record of their own; each group has one
    assert not ((dev["flags"] & F.FLAG_GROUPED) != 0).any()
    dgroups = dev[dev["op"] == OP["NCCL_GROUP"]]
    assert sorted(int(x) for x in dgroups["aux"]) == [0, 0, 0]  # issued by the main thread
    assert sorted(int(x) for x in dgroups["seq"]) == [1, 2, 4]
    # the two-device group is timed on the stream of its first call (device 0)
    streams = {int(t["handle"]): i for i, t in enumerate(run_all.raw.tracks)}
    g4 = dgroups[dgroups["seq"] == 4][0]
    assert int(g4["track"]) == streams[int(run_all.out["s0"], 16)]


def test_device_records_match_host_calls(run_all: Run) -> None:
    host, dev = run_all.host(), run_all.device()
    timed = host[(host["flags"] & F.FLAG_GROUPED) == 0]
    assert len(dev) == len(timed) == 36
    assert not ((timed["flags"] & F.FLAG_DEVICE_PENDING) != 0).any()
    key = lambda r: (int(r["comm"]), int(r["seq"]), int(r["op"]))  # noqa: E731
    assert sorted(map(key, dev)) == sorted(map(key, timed))
    tracks = run_all.raw.tracks
    main = [i for i, t in enumerate(tracks) if int(t["kind"]) == F.TRACK_KIND_THREAD
            and int(t["is_main"])]
    assert len(main) == 1
    for r in dev:
        t = tracks[int(r["track"])]
        assert int(t["kind"]) == F.TRACK_KIND_STREAM and int(t["tid"]) == -1
        assert int(r["aux"]) == main[0]
    by_key = {key(r): r for r in timed}
    for r in dev:  # same payload description as the host record
        h = by_key[key(r)]
        for f in ("bytes", "count", "dtype", "dtype_size", "redop", "root"):
            assert r[f] == h[f], f
    s = run_all.out["profiler"]
    # the last call's pair is pending unless the helper thread polled it
    # between that call and the app's snapshot: either is right, nothing else
    assert (s["submitted"], s["unfinished"]) == (36, 0) and s["pending"] in (0, 1)
    side = run_all.sidecar
    assert side is not None and side["finished"]
    assert (side["device_records"], side["pending"], side["unfinished"]) == (36, 0, 0)


def test_device_times_equal_the_standin_delays(run_all: Run) -> None:
    host, dev = run_all.host(), run_all.device()
    world = (dev["comm"] == 0) & (dev["op"] == OP["NCCL_ALLREDUCE"])
    slow = dev[world & (dev["seq"] >= 25) & (dev["seq"] <= 34)]
    slow = slow[np.argsort(slow["seq"])]
    assert len(slow) == 10
    dur = run_all.us(slow["t_end"].astype(np.int64) - slow["t_start"].astype(np.int64))
    assert np.allclose(dur, 3000.0, rtol=0.01), dur
    # back to back on one stream: each starts where the previous ended
    gaps = run_all.us(slow["t_start"][1:].astype(np.int64) - slow["t_end"][:-1].astype(np.int64))
    assert np.all(np.abs(gaps) < 50), gaps
    # the host only enqueued: each call returned long before its device work ended
    hslow = host[(host["comm"] == 0) & (host["seq"] >= 25) & (host["seq"] <= 34)]
    hslow = hslow[np.argsort(hslow["seq"])]
    assert np.all(run_all.us(hslow["t_end"].astype(np.int64)
                             - hslow["t_start"].astype(np.int64)) < 1000)
    # on the host axis: the first slow call starts on the device when it is enqueued
    lag = run_all.us(int(slow[0]["t_start"]) - int(hslow[0]["t_start"]))
    assert -50 < lag < 1000, lag
    # and the last one ends ~10 delays after the first was enqueued
    span = run_all.us(int(slow[-1]["t_end"]) - int(hslow[0]["t_start"]))
    assert 30000 <= span < 31000 + 2000, span
    # quick calls (no delay): short device intervals
    quick = dev[world & (dev["seq"] < 12)]
    assert np.all(run_all.us(quick["t_end"].astype(np.int64)
                             - quick["t_start"].astype(np.int64)) < 5000)
    assert run_all.out["profiler"]["anchors"] >= 1
    assert run_all.out["profiler"]["anchor_err_ns_max"] < 1e6


def test_summaries_time_nccl_calls_by_their_device_rows(run_all: Run, tmp_path: Path) -> None:
    # the ten 3 ms allreduces: the device time, not the enqueue, in summarize,
    # queried in place (DuckDB) and in memory (pandas) alike
    import pandas as pd

    from profiler.analysis import load
    from profiler.analysis.engine import summarize_dataset
    from profiler.analysis.summary import summarize

    prof = tmp_path / "prof"
    shutil.copytree(run_all.profile_dir, prof)
    m = profiler_cli("merge", str(prof))
    assert m.returncode == 0, m.stderr
    frames = {"in place": summarize_dataset(prof, by=["op"]),
              "in memory": summarize(load(prof), by=["op"])}
    for how, t in frames.items():
        ar = t.loc[t["op"].astype(str) == "nccl_allreduce"].iloc[0]
        assert 30_000 <= float(ar["total_us"]) < 40_000, (how, ar.to_dict())
    a, b = (f.set_index("op").sort_index() for f in frames.values())
    pd.testing.assert_series_equal(a["total_us"], b["total_us"], check_dtype=False)
    p = profiler_cli("summarize", str(prof), "--format", "json", "--by", "op")
    assert p.returncode == 0, p.stderr
    rows = {r["op"]: r for r in orjson.loads(p.stdout)}
    assert 30_000 <= rows["nccl_allreduce"]["total_us"] < 40_000, rows["nccl_allreduce"]


def test_profiler_never_synchronizes_and_allocates_no_events_per_call(run_all: Run) -> None:
    out = run_all.out
    assert out["syncs"] == 0 and out["stream_syncs"] == 0
    assert out["last_error"] == 0  # no CUDA error left behind for the application
    # one pool (device 0: every timed call and group ran there) + 2 anchor events
    assert out["events_created"] == out["events_live"] == 2 * POOL_PAIRS + 2
    # pending work was collected by later calls and by the helper thread, not waited for
    s = out["profiler"]
    coll = s["collected"]
    assert coll["calls"] + coll["helper"] + s["pending"] == s["submitted"] == 36
    assert coll["helper"] >= 1  # the ten slow calls ended while the app slept


def test_pool_exhaustion_and_collection_by_later_calls(built: Built, tmp_path: Path) -> None:
    run = run_app(built, tmp_path, "pool", HOROVOD_PROFILE_NCCL_EVENTS="4",
                  HOROVOD_PROFILE_NCCL_POLL_MS="0", APP_DELAY_US="20000")
    host, dev = run.host(), run.device()
    assert len(host) == 26
    pending = host[(host["flags"] & F.FLAG_DEVICE_PENDING) != 0]
    assert sorted(int(s) for s in pending["seq"]) == list(range(4, 10))
    assert sorted(int(s) for s in dev["seq"]) == [0, 1, 2, 3, *range(10, 26)]
    mid, end = run.out["mid"], run.out["profiler"]
    # while the stand-in's streams were busy nothing was collected or waited for
    assert (mid["submitted"], mid["pending"], mid["device_records"]) == (4, 4, 0)
    assert mid["miss"]["pool_empty"] == 6
    assert end["helper_thread"] is False and end["collected"]["helper"] == 0
    assert end["collected"]["calls"] >= 4  # the first quick call made room
    assert end["miss"]["pool_empty"] == 6
    assert run.out["syncs"] == 0 and run.out["last_error"] == 0
    assert run.out["events_created"] == 2 * 4 + 2
    assert run.sidecar is not None and run.sidecar["device_records"] == 20
    dur = run.us(np.sort(dev["t_end"].astype(np.int64) - dev["t_start"].astype(np.int64)))
    assert np.allclose(dur[-4:], 20000.0, rtol=0.01)


def test_stream_under_capture_gets_no_events(built: Built, tmp_path: Path) -> None:
    run = run_app(built, tmp_path, "capture")
    host, dev = run.host(), run.device()
    assert [int(f) & F.FLAG_DEVICE_PENDING != 0 for f in host["flags"]] == [True, False]
    assert [int(s) for s in dev["seq"]] == [1]
    assert run.out["profiler"]["miss"]["capture"] == 1
    assert run.out["syncs"] == 0 and run.out["last_error"] == 0


def test_without_cuda_runtime_host_records_are_flagged(built: Built, tmp_path: Path) -> None:
    run = run_app(built, tmp_path, "steps", "4", app=built.app_nocuda,
                  HOROVOD_PROFILE_CUDART=str(tmp_path / "no-such-libcudart.so"))
    host, dev = run.host(), run.device()
    assert len(host) == 4 and len(dev) == 0
    assert all(int(f) & F.FLAG_DEVICE_PENDING for f in host["flags"])
    s = run.out["profiler"]
    assert s["cuda_state"] == "unavailable" and s["miss"]["no_cuda"] == 4
    assert run.sidecar is not None and run.sidecar["calls"]["nccl_allreduce"] == 4


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="a real GPU driver is present")
def test_runtime_search_without_a_driver(built: Built, tmp_path: Path) -> None:
    """The natural search (loaded libcudart, then libcudart.so.13/.12/...) finds
    no usable runtime on a machine without a GPU driver: host records only."""
    run = run_app(built, tmp_path, "steps", "3", app=built.app_nocuda)
    assert run.out["profiler"]["cuda_state"] == "unavailable"
    assert len(run.device()) == 0 and len(run.host()) == 3


@pytest.mark.parametrize("word", [None, "0", "false", "off", "no", "", "FALSE", "maybe"])
def test_profiling_off_passes_through(built: Built, tmp_path: Path, word: str | None) -> None:
    """Unset, every off word (any case) and an unknown value: the preloaded
    library records nothing and makes no directory; the unknown value says so
    in one line."""
    env = base_env(LD_PRELOAD=str(library_path()),
                   **({} if word is None else {"HOROVOD_PROFILE": word}))
    proc = subprocess.run([str(built.app_nocuda), "steps", "2"], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = orjson.loads(proc.stdout.strip().splitlines()[-1])
    assert out["profiler"]["visible"] == 3  # interposable and loaded, nothing recorded
    assert sum(out["profiler"]["calls"].values()) == 0
    assert not list(tmp_path.glob("horovod-profile*"))
    said = [x for x in proc.stderr.splitlines() if x.startswith("horovod-profiler")]
    assert said == ([] if word != "maybe" else [
        "horovod-profiler: warning: HOROVOD_PROFILE='maybe' is none of 1/true/on/yes/full, "
        "summary, 0/false/off/no: this job is not profiled"])


_PY_CTYPES = textwrap.dedent("""
    import ctypes, sys, orjson
    from profiler.collect import native
    from profiler.analysis import gpu
    hv = native.load()                      # what the .pth start-up hook does
    mode = ctypes.RTLD_GLOBAL if sys.argv[3] == "global" else ctypes.RTLD_LOCAL
    cudart = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
    nccl = ctypes.CDLL(sys.argv[2], mode=mode)
    g = ctypes.CDLL(None)                 # global lookup: the profiler's wrappers
    assert g.ncclAllReduce is not None
    comm, stream = ctypes.c_void_p(), ctypes.c_void_p()
    class UniqueId(ctypes.Structure):     # ncclUniqueId, passed by value
        _fields_ = [("internal", ctypes.c_char * 128)]
    uid = UniqueId()
    assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    g.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId,
                                   ctypes.c_int]
    assert g.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    assert cudart.cudaStreamCreate(ctypes.byref(stream)) == 0
    buf = (ctypes.c_float * 256)()
    g.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    for i in range(5):
        assert g.ncclAllReduce(buf, buf, 256, 7, 0, comm, stream) == 0
    g.ncclGroupStart(); g.ncclAllReduce(buf, buf, 8, 7, 0, comm, stream); g.ncclGroupEnd()
    left = native.finish_native()            # what the Python runtime does before closing
    state = native.native_state()
    print(orjson.dumps({"left": left, "state": state,
                        "syncs": cudart.standin_total_syncs()}).decode())
""")


@pytest.mark.parametrize("mode", ["global", "local"])
def test_python_ctypes_global_lookup(built: Built, tmp_path: Path, mode: str) -> None:
    """From Python: the library loaded RTLD_GLOBAL at start-up, NCCL loaded later
    (RTLD_GLOBAL, or RTLD_LOCAL as a dependency of an extension would be),
    calls through the global scope reach the wrappers and the real NCCL."""
    prof = tmp_path / "prof"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof), RANK="0",
                   WORLD_SIZE="1", HOROVOD_PROFILE_MERGE_TIMEOUT="5")
    proc = subprocess.run([PYTHON, "-c", _PY_CTYPES, str(built.cudart), str(built.nccl), mode],
                          env=env, capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = orjson.loads(proc.stdout.strip().splitlines()[-1])
    assert out["left"] == 0 and out["syncs"] == 0
    st = out["state"]
    assert st["interposable"] and st["nccl_loaded"] and st["visible"] == 7
    assert st["calls"]["nccl_allreduce"] == 6 and st["calls"]["nccl_group"] == 1
    assert st["device_records"] == 6
    raw = read_raw(prof / "raw" / "rank-00000.hvprof")
    r = raw.records
    assert int(((r["flags"] & F.FLAG_DEVICE) == 0).sum()) == 7
    assert int(((r["flags"] & F.FLAG_DEVICE) != 0).sum()) == 6
    assert (prof / "raw" / "rank-00000.nccl.json").is_file()


def test_library_loads_and_works_without_nccl_or_cuda(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import ctypes, orjson
        from profiler.collect import native
        from profiler.analysis import gpu
        lib = native.load()
        print(native.function("hvprof_nccl_visible", lib)())
        st = native.native_state()
        print(orjson.dumps(st).decode())
        g = ctypes.CDLL(None)
        print(g.ncclGroupStart())           # no NCCL behind it: ncclSystemError
        print(native.finish_native())
    """)
    env = base_env()
    proc = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "0"
    st = orjson.loads(lines[1])
    assert not st["interposable"] and not st["nccl_loaded"] and st["cuda_state"] == "not_loaded"
    assert lines[2] == "2" and lines[3] == "0"
    assert "no NCCL library provides it" in proc.stderr


def test_torchrun_style_job_without_mpi(built: Built, tmp_path: Path) -> None:
    """RANK / WORLD_SIZE / LOCAL_RANK name the rank files; both ranks agree on
    the directory through the launcher's run id; rank 0's exit builds the trace
    (the library's exit merge: no MPI, no Python), and `profiler merge` again."""
    procs = []
    for rank in (0, 1):
        env = base_env(HOROVOD_PROFILE="1", RANK=str(rank), WORLD_SIZE="2",
                       LOCAL_RANK=str(rank), TORCHELASTIC_RUN_ID="hvprof-test-run",
                       STANDIN_UID="job-42", LD_PRELOAD=str(library_path()))
        procs.append(subprocess.Popen([str(built.app), "steps", "5"], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        errs.append(err)
    dirs = list(tmp_path.glob("horovod-profile-*"))
    assert len(dirs) == 1, dirs
    d = dirs[0]
    assert errs[1] == "" and errs[0].splitlines() == [
        f"horovod-profiler: trace written to {d.name}/trace.json (2 ranks, 20 calls)"], errs
    assert (d / "trace.json").is_file()
    raws = [read_raw(d / "raw" / f"rank-{r:05d}.hvprof") for r in (0, 1)]
    assert [(x.header["rank"], x.header["world_size"], x.header["local_rank"]) for x in raws] \
        == [(0, 2, 0), (1, 2, 1)]
    assert int(raws[0].comms["id"][0]) == int(raws[1].comms["id"][0])  # one communicator
    for x in raws:
        assert int(((x.records["flags"] & F.FLAG_DEVICE) == 0).sum()) == 5
        assert int(((x.records["flags"] & F.FLAG_DEVICE) != 0).sum()) == 5
    res = profiler_cli("merge", str(d), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (d / "trace.json").is_file()
    from profiler.analysis import load

    df = load(d / "trace.json")
    nccl = df[df["backend"].astype(str) == "nccl"]
    assert sorted(nccl["rank"].unique().tolist()) == [0, 1]
    assert len(nccl) == 20 and int(nccl["device"].sum()) == 10
    assert set(nccl["op"].astype(str)) == {"nccl_allreduce"}
    assert (nccl["bytes"] == 4096).all()


_PY_GPU_NO_NCCL = textwrap.dedent("""
    import ctypes, sys
    from mpi4py import MPI                # opens the raw file (MPI_Init)
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # "the CUDA driver" (stand-in)
    MPI.COMM_WORLD.allreduce(1)
    from profiler.analysis import gpu
    from profiler.collect import native
    native.finish_native()
""")


@requires_mpi
def test_warning_when_gpus_used_but_no_nccl_call_seen(built: Built, tmp_path: Path) -> None:
    """A Horovod-like job: MPI traffic, the CUDA driver loaded, NCCL linked
    statically (invisible): the sidecar says so and the warning names the remedy."""
    prof = tmp_path / "prof"
    mpirun(1, [PYTHON, "-c", _PY_GPU_NO_NCCL, str(built.driver)], cwd=tmp_path,
           env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                "HOROVOD_PROFILE_MERGE_TIMEOUT": "10"})
    side = raw.read_sidecar(prof / "raw" / "rank-00000.hvprof")
    assert side is not None
    assert side["cuda_driver_loaded"] and not side["interposable"] and not side["nccl_loaded"]
    meta = {"ranks": [{"rank": 0, "host": "h", "nccl": side, "gpus": []}]}
    lines = gpu.summary_lines(meta)
    assert len(lines) == 1 and "HOROVOD_NCCL_LINK=SHARED" in lines[0]
    assert lines[0].startswith("warning: 1 rank(s) used GPUs but no NCCL call was recorded")
    # the rank's NCCL state travels through the dataset and the merge into the
    # trace's metadata, and summarize prints the same warning
    trace = prof / "trace.json"
    assert trace.is_file()
    from profiler.analysis import load_meta

    tmeta = load_meta(trace)
    assert [(r.get("nccl") or {}).get("cuda_driver_loaded") for r in tmeta["ranks"]] == [True]
    res = profiler_cli("summarize", str(trace), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "warning: 1 rank(s) used GPUs but no NCCL call was recorded" in res.stdout
    assert "HOROVOD_NCCL_LINK=SHARED" in res.stdout



@pytest.mark.full
def test_gpu_check_dry_run(tmp_path: Path) -> None:
    """benchmarks/gpu_check.sh, as the GPU machine runs it, on the stand-ins."""
    out = tmp_path / "out"
    env = base_env(OUT=str(out), PYTHON=PYTHON, TMPDIR=str(tmp_path))
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--",
                           "--calls", "200", "--rounds", "3", "--iters", "10"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["ok"] and summary["dry_run"]
    names = {c["check"] for c in summary["checks"]}
    assert {"standin: calls recorded", "standin: bytes", "standin: device time for every call",
            "standin: device time vs the workload's CUDA events",
            "standin: no synchronization by the profiler"} <= names
    sizes = summary["backends"]["standin"]["sizes"]
    assert [s["calls_recorded"] for s in sizes] == [15] * 11
    ovh = summary["backends"]["standin"]["overhead"]["us_per_call"]
    assert set(ovh) == {"none", "host", "device", "plugin", "plugin_calls_only"}
    # the profiler-plugin paths (issue 16): NCCL loads the library itself (no
    # LD_PRELOAD), and both paths at once; each call once, exact bytes
    for path in ("standin+plugin", "standin+both"):
        assert {f"{path}: calls recorded", f"{path}: bytes",
                f"{path}: metadata says which path saw NCCL"} <= names
        assert [s["calls_recorded"] for s in summary["backends"][path]["sizes"]] == [15] * 11
    assert "standin: metadata says which path saw NCCL" in names
    assert (out / "standin-trace.json").is_file() and (out / "summary.txt").is_file()


def test_reanchoring_keeps_device_times_on_the_host_axis(built: Built, tmp_path: Path) -> None:
    """A 1 ms anchor period: the anchor is re-taken many times while pairs are
    pending (some mapped through an anchor later than their events)."""
    run = run_app(built, tmp_path, "all", APP_DELAY_US="3000", APP_DELAY_N="10",
                  HOROVOD_PROFILE_NCCL_ANCHOR_MS="1")
    assert run.sidecar is not None and run.sidecar["anchors"] >= 2
    dev = run.device()
    slow = dev[(dev["comm"] == 0) & (dev["op"] == OP["NCCL_ALLREDUCE"]) & (dev["seq"] >= 25)
               & (dev["seq"] <= 34)]
    slow = slow[np.argsort(slow["seq"])]
    dur = run.us(slow["t_end"].astype(np.int64) - slow["t_start"].astype(np.int64))
    assert np.allclose(dur, 3000.0, rtol=0.01), dur
    gaps = run.us(slow["t_start"][1:].astype(np.int64) - slow["t_end"][:-1].astype(np.int64))
    assert np.all(np.abs(gaps) < 50), gaps


def test_an_nccl_call_that_never_completes_is_in_flight(built: Built, tmp_path: Path) -> None:
    """The stand-in's third allreduce never returns (a blocking NCCL whose peer
    never comes); the job is killed; `profiler hang` shows it in flight."""
    import json
    import signal
    import sys

    prof = tmp_path / "prof"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof), RANK="0",
                   WORLD_SIZE="1", LOCAL_RANK="0", LD_PRELOAD=str(library_path()),
                   STANDIN_NCCL_NEVER_COMPLETES="3")
    proc = subprocess.Popen([str(built.app_nocuda), "steps", "5"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.communicate(timeout=3)
        raise AssertionError("the stand-in's call returned")
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    p = subprocess.run([sys.executable, "-P", "-m", "profiler.cli", "hang", str(prof),
                        "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    (rank,) = doc["ranks"]
    assert [f["op"] for f in rank["in_flight"]] == ["nccl_allreduce"]
    assert rank["in_flight"][0]["seq"] == 2  # two completed before it on its communicator
    assert rank["last"]["op"] == "nccl_allreduce" and rank["last"]["seq"] == 1
    (c,) = doc["comms"]
    assert c["entered"]["0"].startswith("nccl_allreduce (in flight")
