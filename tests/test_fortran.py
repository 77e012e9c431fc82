"""Fortran programs under the profiler, and the wrappers' one list.

tests/c/fortran.F90 through each of MPI's Fortran bindings (mpif.h, `use
mpi`, `use mpi_f08`), under LD_PRELOAD and real mpirun at np=2: exact records
per rank (op, bytes, datatype, flags, communicator), the same as a C program
making those calls gets.  Open MPI's bindings call PMPI_* directly and are
reached through the Fortran wrappers generated from hooks/mpi_protos.py;
MPICH's mpif.h and `use mpi` call the C MPI_* functions; MPICH's `use
mpi_f08` calls PMPI_* with descriptor buffers (mpi_*_f08ts_), which nothing
here wraps, and the documentation says so: no profile.

Then the list itself: hooks/mpi_wrappers.c and hooks/mpi_fortran.c are what
scripts/gen_mpi_wrappers.py writes from it, and the library exports exactly
the MPI symbols it names."""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, mpich_library, requires_mpi
from test_capture_c import C_DIR, MPI_IMPLS, impl_available, launch

from profiler.collect import native
from profiler.formats import record as F
from profiler.formats.raw import read_raw

pytestmark = [requires_mpi, pytest.mark.mpi]

BINDINGS = {1: "mpif.h", 2: "use mpi", 3: "use mpi_f08"}
FORTRAN = {"openmpi": "mpifort", "mpich": "mpifort.mpich"}
IN_PLACE, NONBLOCKING, FROM_STATUS = F.FLAG_IN_PLACE, F.FLAG_NONBLOCKING, F.FLAG_FROM_STATUS


def expected(rank: int) -> collections.Counter[tuple[str, int, str, int, int]]:
    """(op, bytes, datatype, flags, communicator index) -> records for one rank
    of tests/c/fortran.F90 at np=2."""
    dbl, int_, flt = "MPI_DOUBLE", "MPI_INT", "MPI_FLOAT"
    rows = [
        ("init", 0, "unknown", 0, 0),
        ("allreduce", 800, dbl, 0, 0),               # 100 DOUBLE PRECISION
        ("allreduce", 40, int_, IN_PLACE, 0),        # MPI_IN_PLACE, 10 INTEGER
        ("bcast", 100, int_, 0, 0),
        ("iallreduce", 64, flt, NONBLOCKING, 0),     # completed by MPI_Wait
        ("bcast", 64, dbl, NONBLOCKING, 0),          # MPI_Ibcast, by MPI_Waitall
        ("barrier", 0, "unknown", NONBLOCKING, 0),   # MPI_Ibarrier, by MPI_Waitall
        ("allgather", 24, int_, 0, 0),               # 3 INTEGER x 2 ranks
        ("reduce", 16, int_, 0, 0),
        ("alltoall", 16, int_, 0, 0),
        ("send", 40, dbl, 0, 0) if rank == 0 else ("recv", 40, dbl, FROM_STATUS, 0),
        ("allreduce", 4, int_, 0, 1),                # on MPI_Comm_split's communicator
        ("barrier", 0, "unknown", 0, 0),
        ("finalize", 0, "unknown", 0, 0),
    ]
    return collections.Counter(rows)


def records_of(path: Path) -> collections.Counter[tuple[str, int, str, int, int]]:
    recs = read_raw(path).records
    return collections.Counter(
        (F.op_name(int(r["op"])), int(r["bytes"]), F.DTYPES[int(r["dtype"])][1],
         int(r["flags"]), int(r["comm"])) for r in recs)


@pytest.fixture(scope="module", params=["openmpi", "mpich"])
def fimpl(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An MPI implementation with its Fortran compiler: the three programs, and
    a profiler library built with it (Open MPI: the installed one)."""
    name = request.param
    if name == "openmpi" and shutil.which("mpicc.openmpi") is None:
        MPI_IMPLS["openmpi"] = ("mpicc", "mpirun", "-x")
    if not impl_available(name) or shutil.which(FORTRAN[name]) is None:
        pytest.skip(f"{name} with Fortran is not installed")
    _, run, xflag = MPI_IMPLS[name]
    out = tmp_path_factory.mktemp(f"fortran-{name}")
    bins = {}
    for b in BINDINGS:
        exe = out / f"fortran{b}"
        # mpif.h declares no interfaces: gfortran 10+ needs leave to pass
        # buffers of several types to one routine
        subprocess.run([FORTRAN[name], f"-DBINDING={b}", "-fallow-argument-mismatch", "-O1",
                        str(C_DIR / "fortran.F90"), "-o", str(exe)], check=True, cwd=out)
        bins[b] = exe
    lib = native.library_path() if name == "openmpi" else mpich_library(tmp_path_factory)
    return {"name": name, "bins": bins, "lib": lib, "run": run, "xflag": xflag}


@pytest.mark.parametrize("binding", sorted(BINDINGS))
def test_fortran_program_counts_are_exact(fimpl: dict, binding: int, tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    impl = dict(fimpl, bins={"fortran": fimpl["bins"][binding]})
    # no trace.json at exit: the raw files are what this test reads
    proc = launch(impl, 2, "fortran", [], prof, tmp_path, {"HOROVOD_PROFILE_MERGE": "0"})
    assert "fortran calls ok" in proc.stdout  # results unchanged by the profiler
    if fimpl["name"] == "mpich" and binding == 3:
        # documented (docs/guide/profiling.md, "What is wrapped"): MPICH's
        # mpi_f08 binding calls PMPI_* from symbols the library does not wrap
        assert not (prof / "raw").exists()
        return
    for rank in (0, 1):
        got = records_of(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert got == expected(rank), f"{BINDINGS[binding]}, rank {rank}"


def test_the_generated_wrappers_are_up_to_date() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_mpi_wrappers.py"),
                           "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _list() -> list:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_mpi_wrappers
    finally:
        sys.path.pop(0)
    return gen_mpi_wrappers.load()


def test_the_library_wraps_exactly_the_list() -> None:
    """Every MPI_* and mpi_* function the library exports is named in
    hooks/mpi_protos.py, and every entry is exported (built here against Open
    MPI 4.1: no large-count forms)."""
    protos = _list()
    c_names, f_names = set(), set()
    for p in protos:
        names = [p.name]
        if p.body == "collective":
            names.append("I" + p.name[0].lower() + p.name[1:])
        c_names.update(f"MPI_{n}" for n in names)
        if p.fortran:
            for n in names:
                low = f"mpi_{n.lower()}"
                f_names.update({f"{low}_", f"{low}__", low, low.upper(), f"{low}_f08_"})
    out = subprocess.run(["nm", "-D", "--defined-only", native.library_path()],
                         capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines()
                if line.split()[-2:-1] in (["T"], ["W"])}
    got_c = {s for s in exported if s.startswith("MPI_") and not s.isupper()}
    got_f = {s for s in exported if s.lower().startswith("mpi_") and s not in got_c}
    assert got_c == c_names
    assert got_f == f_names
    assert len(c_names) == 55 and {"MPI_Ialltoallv", "MPI_Ireduce_scatter_block",
                                   "MPI_Ibarrier"} <= c_names
