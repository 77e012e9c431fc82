"""Horovod's timeline as a third, coarse source of NCCL calls
(profiler/postjob/timeline_nccl.py).

The timeline is synthesized from the real Horovod CPU timeline fixture
(tests/data/horovod_timeline_fused.json) by renaming its collective
activities as a GPU build of Horovod writes them (MPI_ALLREDUCE ->
NCCL_ALLREDUCE, MPI_BCAST -> NCCL_BCAST: horovod/common/ops/
nccl_operations.cc); everything else (fused responses, spans, shapes) is the
real file's."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import PYTHON, base_env, mpirun, profiler_cli, requires_mpi

from profiler.collect.native import library_path
from profiler.formats import timeline as T
from profiler.postjob import timeline_nccl

pytestmark = pytest.mark.timeout(180)

DATA = Path(__file__).parent / "data"
STANDIN = Path(__file__).parent / "standin"


def nccl_timeline(path: Path) -> Path:
    text = (DATA / "horovod_timeline_fused.json").read_text()
    path.write_text(text.replace('"MPI_ALLREDUCE"', '"NCCL_ALLREDUCE"')
                    .replace('"MPI_BCAST"', '"NCCL_BCAST"'))
    return path


def test_coarse_rows_one_per_fused_nccl_activity(tmp_path: Path) -> None:
    tl = T.parse(nccl_timeline(tmp_path / "timeline.json"))
    ops = T.fused_ops(tl)
    nccl = ops[ops["comm_activity"].astype(str).str.startswith("NCCL_")]
    assert len(nccl) > 0 and len(nccl) == len(ops[ops["comm_activity"].astype(str) != ""])
    rows, unknown = timeline_nccl.coarse_rows(tl, 1000.0, 2)
    done = nccl[np.isfinite(nccl["t_end_us"].to_numpy(dtype=float))]
    assert unknown == 0 and len(rows) == len(done)
    want = {"NCCL_ALLREDUCE": "nccl_allreduce", "NCCL_BCAST": "nccl_broadcast"}
    assert rows["op"].astype(str).tolist() == [want[a] for a in done["comm_activity"]]
    assert rows["bytes"].tolist() == done["tensor_bytes"].fillna(0).astype(np.int64).tolist()
    assert (rows["source"].astype(str) == "timeline").all()
    assert rows["t_start_ns"].tolist() == \
        np.rint(1000.0 + done["t_start_us"].to_numpy() * 1e3).astype(np.int64).tolist()
    assert (rows["dur_ns"] >= 0).all() and not rows["device"].any()


_PY_GPU_NO_NCCL = textwrap.dedent("""
    import ctypes, sys
    from mpi4py import MPI                # opens the raw file (MPI_Init)
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # "the CUDA driver" (stand-in)
    MPI.COMM_WORLD.allreduce(1)
""")


@requires_mpi
def test_timeline_rows_when_no_path_saw_nccl(tmp_path: Path) -> None:
    """A Horovod-like job whose NCCL is invisible (MPI control traffic, the CUDA
    driver loaded, no NCCL record) and a Horovod timeline in the directory:
    the merge adds the timeline's NCCL activities as coarse rows, once."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    driver = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-fPIC", "-shared", str(STANDIN / "cuda_driver_standin.c"),
                    "-o", str(driver)], check=True)
    prof = tmp_path / "prof"
    mpirun(1, [PYTHON, "-c", _PY_GPU_NO_NCCL, str(driver)], cwd=tmp_path,
           env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                "HOROVOD_PROFILE_MERGE_TIMEOUT": "10"})
    tl = nccl_timeline(prof / "timeline.json")
    ops = T.fused_ops(T.parse(tl))
    n = int((ops["comm_activity"].astype(str).str.startswith("NCCL_")
             & np.isfinite(ops["t_end_us"].to_numpy(dtype=float))).sum())
    from profiler.analysis import load, load_meta
    from profiler.postjob.merge import merge

    for _ in range(2):  # a second merge replaces the rows, never adds them again
        merge(prof)
        df = load(prof / "trace.json")
        got = df[df["source"].astype(str) == "timeline"]
        assert len(got) == n and set(got["backend"].astype(str)) == {"nccl"}
        assert len(df[df["backend"].astype(str) == "nccl"]) == n
    meta = load_meta(prof / "trace.json")
    info = meta["nccl_timeline"]
    assert info["status"] == "added" and info["seen_by"] == "timeline" and info["rows"] == n
    out = profiler_cli("summarize", str(prof / "trace.json"), cwd=tmp_path,
                       env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "Horovod's timeline" in x)
    assert line.startswith(f"NCCL: {n} call(s) from Horovod's timeline") and len(line) <= 80


def test_no_timeline_rows_when_the_plugin_recorded_nccl(tmp_path: Path) -> None:
    """NCCL records exist (the plugin path, stand-in NCCL linked statically):
    the same timeline adds nothing."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    app = tmp_path / "app"
    subprocess.run(["gcc", "-std=gnu11", "-DNO_CUDA", "-DSTANDIN_PROFILER_V=7", "-pthread",
                    str(STANDIN / "nccl_app.c"), str(STANDIN / "nccl_standin.c"), "-o", str(app),
                    "-ldl"], check=True)
    prof = tmp_path / "prof"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof), RANK="0",
                   WORLD_SIZE="1", NCCL_PROFILER_PLUGIN=str(library_path()))
    p = subprocess.run([str(app), "steps", "4"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    nccl_timeline(prof / "timeline.json")
    from profiler.analysis import load, load_meta
    from profiler.postjob.merge import merge

    merge(prof)

    df = load(prof / "trace.json")
    assert len(df[df["backend"].astype(str) == "nccl"]) == 4
    assert "source" not in df.columns or not (df["source"].astype(str) == "timeline").any()
    info = load_meta(prof / "trace.json")["nccl_timeline"]
    assert info["status"] == "absent" and "not counted again" in info["reason"]
