"""The start-up hook (horovod_profiler.pth -> profiler.collect.activate): nothing at all
without HOROVOD_PROFILE; with it, the library in the global scope, nothing heavy
imported, nothing printed or created by a process that never profiles, and an
exit status that never changes."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from conftest import base_env, mpirun, requires_mpi

PTH = Path(sysconfig.get_paths()["purelib"]) / "horovod_profiler.pth"
pytestmark = pytest.mark.skipif(not PTH.is_file(), reason="package not installed (no .pth)")

PROBE = ("import sys; print(sorted(m for m in sys.modules if m == 'profiler' or "
         "m.startswith('profiler.')), 'pandas' in sys.modules, 'pyarrow' in sys.modules, "
         "'numpy' in sys.modules)")


def py(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=base_env(**env),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("value", [None, "0", "false", "off", "no", "", " Off ", "NO"])
def test_nothing_without_horovod_profile(tmp_path: Path, value: str | None) -> None:
    env = {} if value is None else {"HOROVOD_PROFILE": value}
    p = py(PROBE, tmp_path, **env)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.strip() == "[] False False False"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rank", [None, "0", "1"])
def test_an_unknown_value_is_said_once_and_profiles_nothing(tmp_path: Path,
                                                            rank: str | None) -> None:
    """The activation is imported (the value is not an off word), says one
    line where the launcher ranks the process 0 or not at all, loads nothing."""
    env = {"HOROVOD_PROFILE": "sure"} | ({} if rank is None else {"HOROVOD_RANK": rank})
    p = py(PROBE + "; import ctypes; print(hasattr(ctypes.CDLL(None), 'hvprof_dir'))",
           tmp_path, **env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[1] == "False"  # the library was never loaded
    assert p.stderr.splitlines() == ([] if rank == "1" else [
        "horovod-profiler: warning: HOROVOD_PROFILE='sure' is none of 1/true/on/yes/full, "
        "summary, 0/false/off/no: this job is not profiled"])
    assert list(tmp_path.iterdir()) == []


def test_pth_line_costs_next_to_nothing() -> None:
    line = next(x for x in PTH.read_text().splitlines() if x.startswith("import"))
    code = compile(line, str(PTH), "exec")
    saved = os.environ.pop("HOROVOD_PROFILE", None)
    try:
        n = 20_000
        t0 = time.perf_counter()
        for _ in range(n):
            exec(code, {})
        per_call = (time.perf_counter() - t0) / n
    finally:
        if saved is not None:
            os.environ["HOROVOD_PROFILE"] = saved
    assert per_call < 50e-6  # measured ~0.3 us; "well under a millisecond"


def test_non_mpi_python_sees_nothing(tmp_path: Path) -> None:
    code = PROBE + "; import ctypes; ctypes.CDLL(None).hvprof_dir; sys.exit(3)"
    p = py(code, tmp_path, HOROVOD_PROFILE="1")
    assert p.returncode == 3, p.stderr
    assert p.stderr == ""
    # activated: the library is in the global scope (symbol found through dlopen(NULL)),
    # and nothing heavy was imported at start-up
    mods, pandas, pyarrow, numpy = p.stdout.strip().rsplit(" ", 3)
    assert "'profiler.collect.activate'" in mods and "'profiler.collect.native'" in mods
    assert (pandas, pyarrow, numpy) == ("False", "False", "False")
    assert list(tmp_path.iterdir()) == []


def test_pip_sees_nothing(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "pip", "--version"], cwd=tmp_path,
                       env=base_env(HOROVOD_PROFILE="1"), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stderr == ""
    assert list(tmp_path.iterdir()) == []


def test_bad_library_path_is_one_line(tmp_path: Path) -> None:
    p = py("print('ok')", tmp_path, HOROVOD_PROFILE="1", HVPROF_LIB=str(tmp_path / "x.so"))
    assert p.returncode == 0 and p.stdout == "ok\n"
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("horovod-profiler: error: profiling disabled")


JOB = """
import sys
from mpi4py import MPI
c = MPI.COMM_WORLD
c.Barrier()
sys.exit(int(sys.argv[1]))
"""


@requires_mpi
@pytest.mark.mpi
def test_exit_status_unchanged_when_the_exit_work_fails(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "ranks").write_text("a file where a directory should be")
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
           "HOROVOD_PROFILE_MERGE_TIMEOUT": "5"}
    p = mpirun(2, [sys.executable, str(script), "0"], env=env, cwd=tmp_path, check=False)
    assert p.returncode == 0, p.stderr
    errors = [x for x in p.stderr.splitlines() if x.startswith("horovod-profiler:")]
    assert any(x.startswith("horovod-profiler: error: ") for x in errors)
    assert all(x.startswith(("horovod-profiler: error: ", "horovod-profiler: warning: "))
               for x in errors)
    assert "Traceback" not in p.stderr
    # the raw files are intact: `profiler merge` can still recover the job
    (prof / "ranks").unlink()
    from profiler.postjob.merge import merge

    res = merge(prof)
    assert res.ranks == [0, 1] and res.calls == 2 * 3  # init, barrier, finalize


@requires_mpi
@pytest.mark.mpi
def test_exit_status_passes_through(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    p = mpirun(1, [sys.executable, str(script), "3"], cwd=tmp_path, check=False,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(tmp_path / "prof")})
    assert p.returncode == 3
    assert "horovod-profiler: trace written to" in p.stderr
