"""`profiler bench`: size lists, replay plans, and real np=2 runs whose traces hold
every size asked and, with --sizes-from, the application's size histogram."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import concat, sweep
from conftest import PYTHON, mpirun, profiler_cli, requires_mpi

from profiler.analysis import load, load_meta
from profiler.analysis.interconnect import interconnect
from profiler.analysis.sizes import size_distribution
from profiler.bench import default_sizes, parse_size, parse_sizes, plan_from_frame
from profiler.errors import ProfilerError


def test_sizes_parse_and_ranges() -> None:
    assert parse_size("8") == 8 and parse_size("64K") == 65536
    assert parse_size("1.5M") == 3 << 19 and parse_size("1KiB") == 1024
    assert default_sizes(8, 64) == [8, 12, 16, 24, 32, 48, 64]
    assert default_sizes(16, 32, between=3) == [16, 20, 24, 28, 32]
    assert parse_sizes("8:16,1000,8") == [8, 12, 16, 1000]
    for bad in ("", "x", "1.3", "-4", "5Q"):
        with pytest.raises(ProfilerError):
            parse_sizes(bad)


def test_sweep_bus_bandwidth_uses_the_summary_factors() -> None:
    from profiler.analysis.summary import bus_factor
    from profiler.bench.sweep import OPS, busbw

    assert busbw(2.0, "allreduce", 4) == 3.0 and busbw(2.0, "alltoall", 4) == 1.5
    assert busbw(2.0, "bcast", 4) == 2.0 and busbw(2.0, "gatherv", 4) == 1.5
    assert busbw(0.0, "barrier", 4) == 0.0  # no factor, no data: as measured
    for op in OPS:
        if op != "barrier":
            assert busbw(1.0, op, 8) == bus_factor(op, 8), op


def test_plan_groups_data_calls_of_one_rank() -> None:
    a = sweep([8, 1024], iters=3, op="allreduce")
    b = sweep([64], iters=2, op="bcast")
    df = concat(a, b)
    df = df.drop(columns=["label"]) if "label" in df else df
    plan = plan_from_frame(df)
    got = {(e["op"], e["count"] * e["dtype_size"]): e["calls"] for e in plan}
    assert got == {("allreduce", 8): 3, ("allreduce", 1024): 3, ("bcast", 64): 2}
    assert all(e["dtype"] == "MPI_FLOAT" and e["comm_size"] == 2 for e in plan)


def test_interconnect_from_metadata() -> None:
    assert interconnect({"env": {"OMPI_MCA_btl": "tcp,self"}}) == "tcp"
    assert interconnect({"env": {"OMPI_MCA_btl": "vader,self"}}) == "shm"
    assert interconnect({"env": {"OMPI_MCA_btl": "self,openib"}}) == "btl=self,openib"
    assert interconnect({}) == ""


@pytest.mark.parametrize("args,needle", [
    (["--sizes", "13"], "not a multiple"),
    (["--sizes", "8K:1K"], "bad size range"),
    (["--collectives", "allreduce,nope"], "--collectives"),
    (["--backend", "nccl"], "needs cupy"),
    (["--iters", "0"], "--iters"),
    (["--sizes-from", "/nonexistent/trace.json"], "/nonexistent/trace.json"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str],
                                            needle: str) -> None:
    p = profiler_cli("bench", "-o", str(tmp_path / "out"), *args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profiler: error: ")
    assert needle in lines[0]
    assert "Traceback" not in p.stderr


@requires_mpi
@pytest.mark.mpi
def test_np2_sweep_records_every_size_asked(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    sizes = [8, 24, 1024, 1536, 65536, 98304]  # whole float32 elements per rank at np=2
    p = profiler_cli("bench", "-o", str(out), "--np", "2", "--collectives",
                     "allreduce,bcast,allgather", "--sizes", ",".join(map(str, sizes)),
                     "--iters", "3", "--warmup", "1", "--transport", "tcp", timeout=240,
                     cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    # nccl-tests columns on stdout, one row per op and size
    assert "algbw" in p.stdout and "busbw" in p.stdout
    rows = [ln.split() for ln in p.stdout.splitlines() if ln and not ln.startswith("#")]
    assert len(rows) == 3 * len(sizes)
    assert [int(r[0]) for r in rows[: len(sizes)]] == sizes
    df = load(out / "trace.json")
    for op in ("allreduce", "bcast", "allgather"):
        for rank in (0, 1):
            sel = df.loc[(df["op"] == op) & (df["rank"] == rank)]
            counts = sel.groupby("bytes").size().to_dict()
            assert counts == {s: 3 for s in sizes}, (op, rank, counts)
    # nothing but the measured calls (and MPI_Init/Finalize) was recorded
    assert set(df["op"].astype(str)) <= {"allreduce", "bcast", "allgather", "init",
                                         "finalize"}
    meta = load_meta(out / "trace.json")
    assert interconnect(meta) == "tcp"
    assert (out / "bench.json").is_file()


@requires_mpi
@pytest.mark.mpi
def test_sizes_from_reproduces_the_application_histogram(tmp_path: Path) -> None:
    app = tmp_path / "app"
    mpirun(2, [PYTHON, "-m", "profiler.workloads.mpi4py_collectives", "--sizes",
               "8,1000,3000,65536", "--repeat", "3", "--ops",
               "allreduce,bcast,allgather,alltoallv,reduce_scatter"],
           env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(app)}, cwd=tmp_path)
    if not (app / "trace.json").is_file():
        assert profiler_cli("merge", str(app), cwd=tmp_path).returncode == 0
    out = tmp_path / "replay"
    p = profiler_cli("bench", "-o", str(out), "--np", "2", "--sizes-from",
                     str(app / "trace.json"), "--warmup", "1", timeout=240, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    a = size_distribution(load(app / "trace.json"), bucket="exact", by_op=True)
    b = size_distribution(load(out / "trace.json"), bucket="exact", by_op=True)
    key = ["op", "size", "calls", "bytes"]
    assert len(a) > 0
    assert a[key].reset_index(drop=True).equals(b[key].reset_index(drop=True))
    # and on every rank, not only the lowest
    pa = size_distribution(load(app / "trace.json"), bucket="exact", by_op=True, rank=None)
    pb = size_distribution(load(out / "trace.json"), bucket="exact", by_op=True, rank=None)
    assert pa[key].reset_index(drop=True).equals(pb[key].reset_index(drop=True))
