"""The notebooks run unedited: each is executed with nbclient (it generates its own
traces under mpirun) and the test fails if a cell raises.  Outputs must be stripped
in the repository.  A notebook's first cell holds its parameters; the test may
set some after it, as papermill does (PARAMETERS), to keep the default tier short."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest
from conftest import MPI_ENV, requires_mpi

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
#: parameters set after a notebook's first cell: two of the four fabrics (shared
#: memory and a simulated host pair at 1 Gbit/s) exercise every cell of 01
PARAMETERS = {"01_interconnect_comparison": 'FABRICS = ["shm", "tcp-1gbit"]\n'}


def test_notebooks_are_numbered_and_stripped() -> None:
    names = [p.name for p in NOTEBOOKS]
    assert names == ["01_interconnect_comparison.ipynb", "02_tensor_fusion.ipynb",
                     "03_throughput_and_scaling.ipynb"]
    for p in NOTEBOOKS:
        nb = nbformat.read(p, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, p.name
        # public API only: nothing private from the package
        src = "\n".join(c.source for c in nb.cells)
        assert "._" not in src.replace("._exit", ""), p.name


@requires_mpi
@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbclient import NotebookClient

    for k, v in MPI_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebooks' generated traces land here
    for k in [k for k in os.environ if k.startswith("HOROVOD_PROFILE")]:
        monkeypatch.delenv(k)
    nb = nbformat.read(path, as_version=4)
    if path.stem in PARAMETERS:
        first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(first + 1, nbformat.v4.new_code_cell(PARAMETERS[path.stem]))
    client = NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError when a cell fails
    wall = time.perf_counter() - t0
    assert wall < 180, f"{path.name} took {wall:.0f} s"
