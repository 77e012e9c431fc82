"""Capture from C programs under LD_PRELOAD and real mpirun: exact counts and
bytes per collective, MPI_THREAD_MULTIPLE, a rank killed with SIGKILL, and the
per-call overhead path (the PMPI layer passes results and errors through)."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, base_env, mpich_library, profiler_cli, requires_mpi

from profiler.collect import native
from profiler.formats import record as F
from profiler.formats.raw import read_raw

pytestmark = [requires_mpi, pytest.mark.mpi]

C_DIR = ROOT / "tests" / "c"


MPI_IMPLS = {
    # name: (compiler wrapper, launcher, how the launcher passes a variable)
    "openmpi": ("mpicc.openmpi", "mpirun.openmpi", "-x"),
    "mpich": ("mpicc.mpich", "mpirun.mpich", "-genvlist"),
}


def impl_available(name: str) -> bool:
    cc, run, _ = MPI_IMPLS[name]
    return shutil.which(cc) is not None and shutil.which(run) is not None


@pytest.fixture(scope="module", params=["openmpi", "mpich"])
def impl(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An MPI implementation: its test programs and a profiler library built with it.
    Open MPI uses the packaged library; MPICH (Debian's, side by side) gets its own."""
    name = request.param
    if name == "openmpi" and shutil.which("mpicc.openmpi") is None:
        MPI_IMPLS["openmpi"] = ("mpicc", "mpirun", "-x")
    elif not impl_available(name):
        pytest.skip(f"{name} is not installed")
    cc, run, xflag = MPI_IMPLS[name]
    out = tmp_path_factory.mktemp(name)
    bins: dict[str, Path] = {}
    for prog in ("collectives", "threads", "killed", "intercomm", "nbc"):
        exe = out / prog
        subprocess.run([cc, "-O1", "-Wall", "-Wextra", "-Werror", "-pthread",
                        str(C_DIR / f"{prog}.c"), "-o", str(exe)], check=True)
        bins[prog] = exe
    lib = native.library_path() if name == "openmpi" else mpich_library(tmp_path_factory)
    return {"name": name, "bins": bins, "lib": lib, "run": run, "xflag": xflag}


def launch(impl: dict, np_: int, prog: str, args: list[str], prof: Path, cwd: Path,
           extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof), "LD_PRELOAD": impl["lib"]}
    env.update(extra_env or {})
    if impl["xflag"] == "-x":
        fwd = [a for k in env for a in ("-x", k)]
    else:
        fwd = ["-genvlist", ",".join(env)]
    full = base_env(**env)
    if impl["name"] == "openmpi":
        full.pop("LD_PRELOAD")  # only the ranks, not the launcher
        fwd = ["-x", f"LD_PRELOAD={impl['lib']}"] + [a for k in env if k != "LD_PRELOAD"
                                                     for a in ("-x", k)]
    cmd = [impl["run"], "-n", str(np_), *fwd, str(impl["bins"][prog]), *args]
    proc = subprocess.run(cmd, env=full, cwd=cwd, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode})\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def expected_collectives(n: int, size: int, rank: int) -> collections.Counter[tuple[str, int]]:
    """(op, bytes) -> calls, for tests/c/collectives.c run with N iterations."""
    tri = size * (size + 1) // 2
    per_iter = [
        ("allreduce", 3000), ("allreduce", 64), ("iallreduce", 64), ("reduce", 800),
        ("bcast", 3000), ("bcast", 120), ("allgather", 40 * size), ("allgatherv", 4 * tri),
        ("gather", 40 * size), ("gatherv", 4 * tri if rank == 0 else 4 * (rank + 1)),
        ("alltoall", 8 * size), ("alltoallv", 12 * size), ("reduce_scatter", 16 * size),
        ("reduce_scatter_block", 16 * size), ("barrier", 0),
    ]
    c: collections.Counter[tuple[str, int]] = collections.Counter()
    for key in per_iter:
        c[key] += n
    c[("bcast", 0)] += 1  # the erroneous call (count -1)
    c[("init", 0)] += 1
    c[("finalize", 0)] += 1
    return c


def op_bytes(records: np.ndarray) -> collections.Counter[tuple[str, int]]:
    return collections.Counter(
        (F.op_name(int(o)), int(b)) for o, b in zip(records["op"], records["bytes"])
    )


def test_nonblocking_and_large_count_collectives(impl: dict, tmp_path: Path) -> None:
    """tests/c/nbc.c at np=2: each nonblocking collective is one record from its
    post to its completion, under the blocking form's op with the nonblocking
    flag (MPI_Iallreduce: iallreduce), bytes as the blocking form's; MPI-4's
    large-count forms (MPICH 4; Open MPI 4.1 has none) as the int forms."""
    prof = tmp_path / "prof"
    proc = launch(impl, 2, "nbc", [], prof, tmp_path, {"HOROVOD_PROFILE_MERGE": "0"})
    large = "large-count 1" in proc.stdout
    assert large == (impl["name"] == "mpich")
    nb = F.FLAG_NONBLOCKING
    want = collections.Counter({
        ("init", 0, 0): 1, ("finalize", 0, 0): 1, ("bcast", 128, nb): 1,
        ("allgather", 32, nb): 1, ("barrier", 0, nb): 1, ("alltoallv", 16, nb): 1,
        ("reduce_scatter_block", 24, nb): 1, ("gather", 40, nb): 1, ("reduce", 24, nb): 1})
    if large:
        want.update({("allreduce", 128, 0): 1, ("iallreduce", 32, nb): 1,
                     ("allgatherv", 24, 0): 1})
    for rank in (0, 1):
        recs = read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof").records
        got = collections.Counter((F.op_name(int(r["op"])), int(r["bytes"]), int(r["flags"]) & nb)
                                  for r in recs)
        assert got == want, f"rank {rank}"
        assert (recs["t_end"] >= recs["t_start"]).all()
        assert not (recs["flags"] & F.FLAG_NO_COMPLETION).any()


def test_clock_offsets_measured_at_init_and_finalize(impl: dict, tmp_path: Path) -> None:
    """The several-host path on one machine (HOROVOD_PROFILE_CLOCK_SYNC=rank: every
    rank measures as if it had its own clock): rank 1's offset to rank 0 is
    measured at MPI_Init and again at MPI_Finalize; both lie within their error
    bound of the truth (0: one machine, one CLOCK_MONOTONIC)."""
    from profiler.formats.clock import clock_drift_ppm

    prof = tmp_path / "prof"
    launch(impl, 2, "collectives", ["3"], prof, tmp_path,
           extra_env={"HOROVOD_PROFILE_CLOCK_SYNC": "rank"})
    h0 = read_raw(prof / "raw" / "rank-00000.hvprof").header
    h1 = read_raw(prof / "raw" / "rank-00001.hvprof").header
    assert h0["offset_method"] == h1["offset_method"] == 2
    assert h0["offset_ns"] == h0["offset_end_ns"] == 0  # rank 0 is the reference
    for h in (h0, h1):
        assert 0 < h["offset_at_ns"] < h["offset_end_at_ns"]
        assert h["offset_end_at_ns"] - h["offset_at_ns"] < 60e9
    assert 0 < h1["offset_err_ns"] and abs(h1["offset_ns"]) <= h1["offset_err_ns"] + 100
    assert 0 < h1["offset_end_err_ns"]
    assert abs(h1["offset_end_ns"]) <= h1["offset_end_err_ns"] + 100
    assert clock_drift_ppm(h0) == 0.0
    # the trace says both measurements and the drift between them
    from profiler.postjob.merge import merge

    merge(prof)
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    r1 = meta["ranks"][1]
    assert (r1["offset_ns"], r1["offset_end_ns"]) == (h1["offset_ns"], h1["offset_end_ns"])
    ppm = clock_drift_ppm(h1)
    assert r1["clock_drift_ppm"] == (None if ppm is None else round(ppm, 3))
    s = profiler_cli("summarize", str(prof))
    m = re.search(r"clock offsets: 1 rank\(s\) aligned to rank 0 within ([0-9.]+) (us|ms)",
                  s.stdout)
    assert m is not None, s.stdout
    said_ns = float(m.group(1)) * (1e3 if m.group(2) == "us" else 1e6)
    err = max(h1["offset_err_ns"], h1["offset_end_err_ns"])  # a loaded machine: ms
    assert abs(said_ns - err) <= 0.006 * err + 10, (said_ns, err)


@pytest.mark.parametrize("np_", [1, 2])
def test_every_collective_counted_exactly(impl: dict, tmp_path: Path, np_: int) -> None:
    n = 7
    prof = tmp_path / "prof"
    proc = launch(impl, np_, "collectives", [str(n)], prof, tmp_path)
    assert proc.stdout.count("RESULT OK") == np_, proc.stdout + proc.stderr
    for rank in range(np_):
        raw = read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert raw.problems == []
        assert raw.header["world_size"] == np_
        assert raw.header["dropped_records"] == 0
        # one host, one CLOCK_MONOTONIC: no measurement, offset exactly 0, and
        # no second measurement at MPI_Finalize
        assert raw.header["offset_method"] == 0 and raw.header["offset_ns"] == 0
        assert raw.header["offset_end_at_ns"] == 0
        assert raw.state & F.STATE_FINALIZED
        got = op_bytes(raw.records)
        assert got == expected_collectives(n, np_, rank)
        recs = raw.records
        names = np.array([F.op_name(int(o)) for o in recs["op"]])
        # flags: in-place, nonblocking, derived type, the error code
        inplace = recs[(names == "allreduce") & (recs["bytes"] == 64)]
        assert np.all(inplace["flags"] & F.FLAG_IN_PLACE)
        assert np.all(recs[names == "iallreduce"]["flags"] & F.FLAG_NONBLOCKING)
        derived = recs[(names == "bcast") & (recs["bytes"] == 120)]
        assert np.all(derived["flags"] & F.FLAG_DERIVED_TYPE)
        assert np.all(derived["dtype_size"] == 24) and np.all(derived["count"] == 5)
        err = recs[(names == "bcast") & (recs["bytes"] == 0)]
        assert len(err) == 1 and err["rc"][0] != 0 and err["flags"][0] & F.FLAG_ERROR
        ok = recs[~((names == "bcast") & (recs["bytes"] == 0))]
        assert np.all(ok["rc"] == 0)
        # one sequence per communicator, no gaps: the same call has the same
        # (comm, seq) on every rank
        world = recs[recs["comm"] == 0]
        assert sorted(world["seq"].tolist()) == list(range(len(world)))
        assert np.all(recs["t_end"] >= recs["t_start"])
    # the merged trace and summarize agree with the raw counts
    m = profiler_cli("merge", str(prof), cwd=tmp_path)
    assert m.returncode == 0, m.stderr
    s = profiler_cli("summarize", str(prof / "trace.json"), "--by", "op,bytes",
                     "--format", "json", cwd=tmp_path)
    assert s.returncode == 0, s.stderr
    rows = json.loads(s.stdout)
    total = collections.Counter()
    for r in rows:
        total[(r["op"], int(r["bytes"]))] += int(r["calls"])
    expect: collections.Counter[tuple[str, int]] = collections.Counter()
    for rank in range(np_):
        expect.update(expected_collectives(n, np_, rank))
    for key, calls in expect.items():
        if key[0] in ("init", "finalize"):
            continue
        assert total[key] == calls, (key, total[key], calls)


def test_thread_multiple_counts_exact(impl: dict, tmp_path: Path) -> None:
    threads, calls = 4, 1000
    prof = tmp_path / "prof"
    proc = launch(impl, 2, "threads", [str(threads), str(calls)], prof, tmp_path)
    if "NO_THREAD_MULTIPLE" in proc.stdout:
        pytest.skip("this MPI build does not provide MPI_THREAD_MULTIPLE")
    for rank in range(2):
        raw = read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert raw.problems == []
        recs = raw.records
        ar = recs[recs["op"] == F.OP_BY_CNAME["MPI_ALLREDUCE"]]
        assert len(ar) == threads * calls
        assert np.all(ar["bytes"] == 8) and np.all(ar["count"] == 1)
        # one communicator per thread, one track per thread, no torn record
        by_comm = collections.defaultdict(list)
        for c, s, t in zip(ar["comm"], ar["seq"], ar["track"]):
            by_comm[int(c)].append((int(s), int(t)))
        assert len(by_comm) == threads
        for entries in by_comm.values():
            assert sorted(s for s, _ in entries) == list(range(calls))
            assert len({t for _, t in entries}) == 1
        assert len({tuple(v)[0][1] for v in by_comm.values()}) == threads
        ids = {int(c["id"]) for c in raw.comms}
        assert len(ids) == len(raw.comms)  # world, its duplicates: distinct ids


def test_comm_ids_match_across_ranks(impl: dict, tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    launch(impl, 2, "threads", ["3", "10"], prof, tmp_path)
    tables = [read_raw(prof / "raw" / f"rank-{r:05d}.hvprof").comms for r in range(2)]
    ids = [sorted(int(x) for x in t["id"]) for t in tables]
    assert ids[0] == ids[1] and len(ids[0]) == 4


def test_sigkill_keeps_records_up_to_the_kill(impl: dict, tmp_path: Path) -> None:
    if impl["name"] != "openmpi":
        pytest.skip("the kill test drives Open MPI's mpirun")
    k = 20000
    prof = tmp_path / "prof"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof))
    p = subprocess.Popen(
        [impl["run"], "-n", "2", "-x", f"LD_PRELOAD={impl['lib']}", "-x", "HOROVOD_PROFILE",
         "-x", "HOROVOD_PROFILE_DIR", str(impl["bins"]["killed"]), str(k)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    pids = []
    deadline = time.time() + 120
    assert p.stdout is not None
    while len(pids) < 2 and time.time() < deadline:
        line = p.stdout.readline()
        if line.startswith("DONE"):
            pids.append(int(line.split()[3]))
    assert len(pids) == 2
    time.sleep(0.5)  # five flush periods (100 ms)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    try:
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for rank in range(2):
        raw = read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof")
        ar = raw.records[raw.records["op"] == F.OP_BY_CNAME["MPI_ALLREDUCE"]]
        assert len(ar) == k
        assert not raw.state & F.STATE_FINALIZED
    m = profiler_cli("merge", str(prof), cwd=tmp_path)
    assert m.returncode == 0, m.stderr
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    assert sorted(meta.get("partial_ranks", [])) == [0, 1]


def test_every_spelling_of_off_leaves_no_profile(impl: dict, tmp_path: Path) -> None:
    """HOROVOD_PROFILE's off words (profiler._env.OFF_WORDS, any case, or empty)
    turn off a preloaded program: no file, no line, the same results.  Every
    word under Open MPI; MPICH, whose ranks read the same function, one."""
    words = ["0", "false", "off", "no", "", "No"] if impl["name"] == "openmpi" else ["false"]
    for word in words:
        prof = tmp_path / f"prof-{word}"
        proc = launch(impl, 2, "collectives", ["2"], prof, tmp_path, {"HOROVOD_PROFILE": word})
        assert proc.stdout.count("RESULT OK") == 2, word
        assert not prof.exists() and not list(tmp_path.glob("horovod-profile*")), word
        assert "horovod-profiler" not in proc.stderr, word


def test_an_unknown_switch_value_says_one_line_and_profiles_nothing(impl: dict,
                                                                    tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    proc = launch(impl, 2, "collectives", ["2"], prof, tmp_path, {"HOROVOD_PROFILE": "maybe"})
    assert proc.stdout.count("RESULT OK") == 2
    assert not prof.exists()
    lines = [x for x in proc.stderr.splitlines() if "horovod-profiler" in x]
    assert lines == ["horovod-profiler: warning: HOROVOD_PROFILE='maybe' is none of "
                     "1/true/on/yes/full, summary, 0/false/off/no: this job is not profiled"]


def test_unusable_settings_are_said_once_in_the_tables_words(impl: dict,
                                                             tmp_path: Path) -> None:
    """Every C-side setting is checked by one piece of code (hooks/settings.c),
    once for the job (rank 0), NCCL's included; the defaults are used."""
    prof = tmp_path / "prof"
    proc = launch(impl, 2, "collectives", ["2"], prof, tmp_path, {
        "HOROVOD_PROFILE": "ON", "HOROVOD_PROFILE_CHUNK_KB": "3",
        "HOROVOD_PROFILE_NCCL_EVENTS": "1", "HOROVOD_PROFILE_HELPER": "sometimes",
        "HOROVOD_PROFILE_CLOCK_SYNC": "Rank"})
    assert proc.stdout.count("RESULT OK") == 2
    lines = sorted(x for x in proc.stderr.splitlines() if "horovod-profiler: warning" in x)
    assert lines == [
        "horovod-profiler: warning: ignoring HOROVOD_PROFILE_CHUNK_KB='3' (KiB, 4 to 1048576): "
        "using 256",
        "horovod-profiler: warning: ignoring HOROVOD_PROFILE_HELPER='sometimes' "
        "(on: 1/true/on/yes, off: 0/false/off/no): using on",
        "horovod-profiler: warning: ignoring HOROVOD_PROFILE_NCCL_EVENTS='1' (2 to 65536): "
        "using 1024"]
    raw = read_raw(prof / "raw" / "rank-00000.hvprof")
    assert raw.header["chunk_bytes"] == 256 * 1024



@pytest.mark.parametrize("np_", [2, 4])
def test_intercommunicator_ids_sizes_and_bytes(impl: dict, tmp_path: Path, np_: int) -> None:
    """tests/c/intercomm.c: world rank 0 is group A, ranks 1.. group B, joined by
    MPI_Intercomm_create (not wrapped: the communicator is first seen in a
    collective).  Every member of both groups records the same id for it and
    for its duplicate; the table's size and rank are the local group's; the
    allgatherv bytes are what this rank receives from the remote group (its
    counts array has one entry per remote rank: 3 ranks on one side read 1)."""
    n = 5
    prof = tmp_path / "prof"
    proc = launch(impl, np_, "intercomm", [str(n)], prof, tmp_path)
    assert proc.stdout.count("RESULT OK") == np_, proc.stdout + proc.stderr
    ids: dict[str, set[int]] = collections.defaultdict(set)
    seqs = []
    for rank in range(np_):
        raw = read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert raw.problems == [] and raw.header["dropped_records"] == 0
        recs, comms = raw.records, raw.comms
        names = np.array([F.op_name(int(o)) for o in recs["op"]])
        assert len(comms) == 4  # world, the split, the intercommunicator, its dup
        (inter,) = set(recs[names == "allgatherv"]["comm"].tolist())
        on_inter = recs[recs["comm"] == inter]
        assert collections.Counter(names[recs["comm"] == inter].tolist()) == {
            "allreduce": n, "allgatherv": n, "barrier": 1}
        dups = set(recs[(names == "allreduce") & (recs["comm"] != inter)]["comm"].tolist())
        assert len(dups) == 1
        dup = dups.pop()
        in_a = rank == 0
        local_size, local_rank = (1, 0) if in_a else (np_ - 1, rank - 1)
        remote_size = np_ - 1 if in_a else 1
        for idx in (inter, dup):
            e = comms[idx]
            assert (int(e["size"]), int(e["rank"])) == (local_size, local_rank)
            assert int(e["world_rank0"]) == (0 if in_a else 1)
        ids["inter"].add(int(comms[inter]["id"]))
        ids["dup"].add(int(comms[dup]["id"]))
        ids["world"].add(int(comms[0]["id"]))
        # bytes: 4-byte ints, remote local rank i sends i + 1 of them
        agv = recs[names == "allgatherv"]
        assert np.all(agv["bytes"] == 4 * remote_size * (remote_size + 1) // 2)
        assert np.all(on_inter["rc"] == 0)
        seqs.append(sorted(on_inter["seq"].tolist()))
    assert all(len(v) == 1 for v in ids.values()), ids  # equal on every member
    assert len(ids["inter"] | ids["dup"] | ids["world"]) == 3
    assert seqs == [list(range(2 * n + 1))] * np_
