"""End to end under real mpirun (Open MPI + mpi4py), HOROVOD_PROFILE=1, no code change:
a script calls every wrapped collective N times with known sizes (3000-byte
messages, a derived datatype, in-place, non-blocking); the trace must hold
exactly those calls and bytes per rank, `profiler summarize --format json` must
report them, and the application's results must not change."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import mpirun, profiler_cli, requires_mpi

from profiler.analysis import load, load_meta
from profiler.formats import record as F

pytestmark = [requires_mpi, pytest.mark.mpi]

N = 3

JOB = r'''
import hashlib, sys
import numpy as np
from mpi4py import MPI

N = int(sys.argv[1])
c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
tri = n * (n + 1) // 2
digest = hashlib.sha256()
triple = MPI.DOUBLE.Create_contiguous(3).Commit()   # a derived datatype, 24 bytes

def keep(*arrays):
    for a in arrays:
        digest.update(np.ascontiguousarray(a).tobytes())

for it in range(N):
    a = (np.arange(750, dtype=np.float32) + r + it) / 7          # 3000 B
    b = np.empty_like(a); c.Allreduce(a, b, op=MPI.SUM); keep(b)
    x = np.full(8, r + 1.5 + it, dtype=np.float64)                # 64 B in place
    c.Allreduce(MPI.IN_PLACE, x, op=MPI.MAX); keep(x)
    i = np.arange(16, dtype=np.int32) * (r + 1); o = np.empty_like(i)
    req = c.Iallreduce(i, o, op=MPI.SUM); req.Wait(); keep(o)    # 64 B non-blocking
    s = np.arange(200, dtype=np.float32) * (r + 1); t = np.zeros_like(s)
    c.Reduce(s, t, op=MPI.SUM, root=0); keep(t)                   # 800 B
    buf = np.frombuffer(bytes(range(256)) * 12, dtype=np.uint8)[:3000].copy() if r == 0 \
        else np.zeros(3000, dtype=np.uint8)
    c.Bcast(buf, root=0); keep(buf)                               # 3000 B
    d = np.arange(15, dtype=np.float64) * (it + 1) if r == 0 else np.zeros(15)
    c.Bcast([d, 5, triple], root=0); keep(d)                      # 5 x derived = 120 B
    g = np.empty(10 * n, dtype=np.int32)
    c.Allgather(np.arange(10, dtype=np.int32) + r, g); keep(g)    # 40 n B
    counts = [k + 1 for k in range(n)]
    displs = [sum(counts[:k]) for k in range(n)]
    gv = np.empty(tri, dtype=np.int32)
    c.Allgatherv(np.full(r + 1, r, dtype=np.int32), [gv, counts, displs, MPI.INT])
    keep(gv)                                                      # 4 tri B
    gg = np.empty(10 * n, dtype=np.int32) if r == 0 else None
    c.Gather(np.arange(10, dtype=np.int32) * r, gg, root=0)       # 40 n B (recorded x n)
    if r == 0: keep(gg)
    gvv = np.empty(tri, dtype=np.int32) if r == 0 else None
    c.Gatherv(np.full(r + 1, r + 7, dtype=np.int32),
              [gvv, counts, displs, MPI.INT] if r == 0 else None, root=0)
    if r == 0: keep(gvv)                                          # root 4 tri, else 4 (r+1)
    at = np.empty(2 * n, dtype=np.float32)
    c.Alltoall(np.arange(2 * n, dtype=np.float32) + 10 * r, at); keep(at)   # 8 n B
    av = np.empty(3 * n, dtype=np.int32)
    c.Alltoallv([np.arange(3 * n, dtype=np.int32) + r, [3] * n, [3 * k for k in range(n)],
                 MPI.INT], [av, [3] * n, [3 * k for k in range(n)], MPI.INT]); keep(av)  # 12 n
    rs = np.empty(4, dtype=np.float32)
    c.Reduce_scatter(np.arange(4 * n, dtype=np.float32) + r, rs, [4] * n, op=MPI.SUM)
    keep(rs)                                                      # 16 n B
    rb = np.empty(4, dtype=np.float32)
    c.Reduce_scatter_block(np.arange(4 * n, dtype=np.float32) * (r + 2), rb, op=MPI.SUM)
    keep(rb)                                                      # 16 n B
    c.Barrier()
triple.Free()
with open(f"{sys.argv[2]}/digest-{r}", "w") as f:
    f.write(digest.hexdigest())
'''


def expected(size: int, rank: int) -> collections.Counter[tuple[str, int]]:
    tri = size * (size + 1) // 2
    per_iter = [
        ("allreduce", 3000), ("allreduce", 64), ("iallreduce", 64), ("reduce", 800),
        ("bcast", 3000), ("bcast", 120), ("allgather", 40 * size), ("allgatherv", 4 * tri),
        ("gather", 40 * size), ("gatherv", 4 * tri if rank == 0 else 4 * (rank + 1)),
        ("alltoall", 8 * size), ("alltoallv", 12 * size), ("reduce_scatter", 16 * size),
        ("reduce_scatter_block", 16 * size), ("barrier", 0),
    ]
    out: collections.Counter[tuple[str, int]] = collections.Counter()
    for key in per_iter:
        out[key] += N
    out[("init", 0)] += 1
    out[("finalize", 0)] += 1
    return out


def digests(d: Path) -> dict[int, str]:
    return {int(p.name.split("-")[1]): p.read_text() for p in d.glob("digest-*")}


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("job") / "job.py"
    p.write_text(JOB)
    return p


@pytest.fixture(scope="module")
def runs(script: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, str,
                                                                                     str]]:
    """np -> (profile dir, stdout, stderr) of a profiled run."""
    out = {}
    for np_ in (1, 2):
        d = tmp_path_factory.mktemp(f"np{np_}")
        res = tmp_path_factory.mktemp(f"results{np_}")
        p = mpirun(np_, [sys.executable, str(script), str(N), str(res)], cwd=d,
                   env={"HOROVOD_PROFILE": "1"})
        dirs = [x for x in d.iterdir() if x.name.startswith("horovod-profile-")]
        assert len(dirs) == 1, list(d.iterdir())  # one directory, the same for every rank
        out[np_] = (dirs[0], res, p.stderr)
    return out


@pytest.mark.parametrize("np_", [1, 2])
def test_exact_calls_and_bytes_per_rank(runs: dict, np_: int) -> None:
    d, _, stderr = runs[np_]
    lines = [x for x in stderr.splitlines() if x.startswith("horovod-profiler:")]
    total = sum(sum(expected(np_, r).values()) for r in range(np_))
    assert lines == [f"horovod-profiler: trace written to {d.name}/trace.json "
                     f"({np_} ranks, {total} calls)"]
    df = load(d / "trace.json")
    assert sorted(df["rank"].unique().tolist()) == list(range(np_))
    for r in range(np_):
        mine = df[df["rank"] == r]
        got = collections.Counter(zip(mine["op"].astype(str), mine["bytes"].astype(int)))
        assert got == expected(np_, r), r
        assert (mine["rc"] == 0).all()
        assert (mine["comm_size"] == np_).all() and (mine["comm_rank"] == r).all()
        assert mine["comm_name"].astype(str).unique().tolist() == ["MPI_COMM_WORLD"]
        assert mine["thread_kind"].astype(str).unique().tolist() == ["main"]
        derived = mine[(mine["op"] == "bcast") & (mine["bytes"] == 120)]
        assert derived["dtype"].astype(str).unique().tolist() == ["derived"]
        assert (derived["dtype_size"] == 24).all() and (derived["count"] == 5).all()
        assert ((derived["flags"] & F.FLAG_DERIVED_TYPE) != 0).all()
        inplace = mine[(mine["op"] == "allreduce") & (mine["bytes"] == 64)]
        assert inplace["in_place"].all() and inplace["redop"].astype(str).eq("max").all()
        assert not mine[(mine["op"] == "allreduce") & (mine["bytes"] == 3000)]["in_place"].any()
        nb = mine[mine["op"] == "iallreduce"]
        assert ((nb["flags"] & F.FLAG_NONBLOCKING) != 0).all() and (nb["dur_ns"] > 0).all()
        big = mine[(mine["op"] == "allreduce") & (mine["bytes"] == 3000)]
        assert big["dtype"].astype(str).eq("MPI_FLOAT").all() and (big["count"] == 750).all()
        roots = mine[mine["op"].isin(["reduce", "bcast", "gather", "gatherv"])]["root"]
        assert (roots == 0).all()
        assert (mine["dur_ns"] >= 0).all() and mine["t_start_ns"].is_monotonic_increasing
        # seq numbers the calls on the communicator, from 0, without gaps
        assert sorted(mine["seq"].tolist()) == list(range(len(mine)))
    meta = load_meta(d)
    assert meta["world_size"] == np_ and meta["missing_ranks"] == []
    assert meta["partial_ranks"] == []
    assert meta["mpi_version"].startswith("Open MPI")
    assert Path(meta["command"][0]).name == "job.py" and meta["command"][1] == str(N)
    assert [r["state"][-2:] for r in meta["ranks"]] == [["finalized", "closed"]] * np_
    assert all(k.startswith(("HOROVOD_", "NCCL_", "OMPI_MCA_", "MPICH_", "UCX_"))
               for k in meta["env"])


def test_same_call_matches_across_ranks(runs: dict) -> None:
    d = runs[2][0]
    df = load(d)
    calls = df[~df["op"].isin(["init", "finalize"])]
    a = calls[calls["rank"] == 0].set_index(["comm", "seq"])["op"].astype(str)
    b = calls[calls["rank"] == 1].set_index(["comm", "seq"])["op"].astype(str)
    assert len(a) == len(b) == 15 * N
    assert a.sort_index().equals(b.sort_index())
    # the clocks line up: rank 1's matching barrier overlaps rank 0's
    bar = calls[calls["op"] == "barrier"].set_index(["rank", "seq"])
    for seq in bar.loc[0].index:
        s0, e0 = bar.loc[(0, seq), ["t_start_ns", "t_end_ns"]]
        s1, e1 = bar.loc[(1, seq), ["t_start_ns", "t_end_ns"]]
        assert s0 <= e1 + 1_000_000 and s1 <= e0 + 1_000_000  # within 1 ms


@pytest.mark.parametrize("np_", [1, 2])
def test_summarize_json_reports_them(runs: dict, np_: int, tmp_path: Path) -> None:
    d = runs[np_][0]
    p = profiler_cli("summarize", str(d / "trace.json"), "--format", "json", "--by",
                     "rank,op,bytes", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = orjson.loads(p.stdout)
    got = collections.Counter()
    for row in rows:
        got[(row["rank"], row["op"], row["bytes"])] += row["calls"]
        assert row["total_bytes"] == row["bytes"] * row["calls"]
        assert row["max_us"] >= row["p99_us"] >= row["p50_us"] > 0
    want = collections.Counter()
    for r in range(np_):
        for (op, nbytes), calls in expected(np_, r).items():
            if op not in ("init", "finalize"):
                want[(r, op, nbytes)] += calls
    assert got == want
    table = profiler_cli("summarize", str(d / "trace.json"), cwd=tmp_path)
    assert table.returncode == 0 and "allreduce" in table.stdout and "*" in table.stdout


def test_results_unchanged_by_profiling(runs: dict, script: Path, tmp_path: Path) -> None:
    work, res = tmp_path / "work", tmp_path / "res"
    work.mkdir()
    res.mkdir()
    plain = mpirun(2, [sys.executable, str(script), str(N), str(res)], cwd=work)
    assert "horovod-profiler" not in plain.stderr
    assert list(work.iterdir()) == []  # unprofiled: nothing written
    ref = digests(res)
    assert sorted(ref) == [0, 1]
    assert digests(runs[2][1]) == ref


def test_trace_opens_as_chrome_trace(runs: dict) -> None:
    d = runs[2][0]
    doc = json.loads((d / "trace.json").read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == sum(sum(expected(2, r).values()) for r in range(2))
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in xs)
    assert {e["pid"] for e in xs} == {0, 1}


def test_profile_dir_env_and_merge_again(script: Path, tmp_path: Path) -> None:
    prof = tmp_path / "chosen"
    p = mpirun(2, [sys.executable, str(script), "1", str(tmp_path)], cwd=tmp_path,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    assert f"trace written to {prof}/trace.json (2 ranks," in p.stderr
    assert sorted(x.name for x in (prof / "ranks").iterdir()) == [
        "rank-00000.json", "rank-00000.parquet", "rank-00001.json", "rank-00001.parquet"]
    before = load(prof)
    (prof / "trace.json").unlink()
    r = profiler_cli("merge", str(prof), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"profiler: trace written to {prof}/trace.json (2 ranks, ")
    after = load(prof)
    assert np.array_equal(before["t_start_ns"].to_numpy(), after["t_start_ns"].to_numpy())


def test_summary_mode_counts_exact(runs: dict, script: Path, tmp_path: Path) -> None:
    """HOROVOD_PROFILE=summary: no per-call records, exact aggregate counts and bytes."""
    from profiler.analysis import load_aggregates

    prof = tmp_path / "prof"
    p = mpirun(2, [sys.executable, str(script), str(N), str(tmp_path)], cwd=tmp_path,
               env={"HOROVOD_PROFILE": "summary", "HOROVOD_PROFILE_DIR": str(prof)})
    total = sum(sum(expected(2, r).values()) for r in range(2))
    assert (f"horovod-profiler: trace written to {prof}/trace.json (2 ranks, {total} calls; "
            "summary mode: calls aggregated)") in p.stderr
    assert load_meta(prof)["mode"] == "summary"
    per_call = load(prof)
    assert not per_call["backend"].isin(["mpi"]).any()  # nothing recorded call by call
    agg = load_aggregates(prof)
    for r in range(2):
        mine = agg[agg["rank"] == r]
        got: collections.Counter[tuple[str, int]] = collections.Counter()
        for op, nbytes, calls in zip(mine["op"].astype(str), mine["bytes"], mine["calls"]):
            got[(op, int(nbytes))] += int(calls)
        assert got == expected(2, r), r
        assert (mine["total_ns"] >= mine["max_ns"]).all() and (mine["min_ns"] >= 0).all()
        # finalize is a marker taken just before PMPI_Finalize: two clock reads apart,
        # which can round to 0 ns; every collective takes time
        calls_only = mine[mine["op"].astype(str) != "finalize"]
        assert (calls_only["min_ns"] > 0).all(), calls_only
        assert [sum(h) for h in mine["hist"]] == mine["calls"].tolist()
    rows = orjson.loads(profiler_cli("summarize", str(prof), "--format", "json", "--by",
                                     "rank,op,bytes", cwd=tmp_path).stdout)
    got_cli = {(r["rank"], r["op"], r["bytes"]): r["calls"] for r in rows}
    want = {(r, op, b): c for r in range(2) for (op, b), c in expected(2, r).items()
            if op not in ("init", "finalize")}
    assert got_cli == want
    assert digests(tmp_path) == digests(runs[2][1])  # same results as the other runs
