"""`profiler bench --pattern ps`: parameter server push+pull through server ranks on
simulated hosts of their own, beside MPI_Allreduce on the same rate-limited
links; the MXNet proposal's table must keep its shape (time falls with more servers,
allreduce at or below the best server count)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import profiler_cli, requires_mpi
from simcluster_fixture import cluster_available

from profiler.bench import ps

pytestmark = [requires_mpi, pytest.mark.mpi]


def test_link_bound_model() -> None:
    # 8 MiB, 4 workers, 200 Mbit/s = 25e6 B/s per link and direction
    p = 8 * 2**20
    assert ps.predicted(4, 1, p, 200e6) == pytest.approx(2 * 4 * p / 25e6)
    assert ps.predicted(4, 4, p, 200e6) == pytest.approx(2 * p / 25e6)
    assert ps.predicted(4, None, p, 200e6) == pytest.approx(1.5 * p / 25e6)


@pytest.mark.full
def test_ps_table_has_the_seed_shape(tmp_path: Path) -> None:
    ok, why = cluster_available()
    if not ok:
        print(f"SKIP simulated cluster: {why}")
        pytest.skip(f"simulated cluster unavailable: {why}")
    out = tmp_path / "ps"
    p = profiler_cli("bench", "--pattern", "ps", "--servers", "1,2,4", "--workers", "4",
                     "--payload", "4M", "--rate", "200mbit", "--rounds", "1", "-o", str(out),
                     timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    print("\n" + p.stdout)
    assert "MXNet proposal: 400 MB, 8 workers" in p.stdout
    doc = json.loads((out / "bench-ps.json").read_text())
    t = {r["servers"]: r["ps_median_s"] for r in doc["results"]}
    assert t[1] > 1.5 * t[2] > 1.5 * 1.5 * t[4], t  # halves (about) with each doubling
    # the links are rate-limited: no faster than the rate allows
    for s, secs in t.items():
        assert secs >= 0.95 * ps.predicted(4, s, 4 * 2**20, 200e6), (s, secs)
    ar = max(r["allreduce_median_s"] for r in doc["results"])
    assert ar <= t[4], (ar, t)  # allreduce at or below the best server count
    # each job is a profile: its MPI_Allreduce calls are in the trace
    meta = json.loads((out / "servers-4" / "trace.json").read_bytes())["horovod_profiler"]
    assert meta["world_size"] == 8 and len(meta["hosts"]) == 8
