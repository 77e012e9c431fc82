"""The helper's flush period: its default, HOROVOD_PROFILE_FLUSH_MS, and
hvprof_set_flush_ms (the within-run A/B's switch,
benchmarks/overhead/ab_corpus.py).

A rank reads its own raw file from disk while it runs: while the helper
has no period (0), none of its calls reach the file in six default
periods; given one back, all of them do at once, and the later calls
within a few periods."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import mpirun, requires_mpi

pytestmark = [requires_mpi, pytest.mark.mpi]

JOB = r'''
import json, sys, time
import numpy as np
from mpi4py import MPI
from profiler.collect import native
from profiler.formats.raw import read_raw

c = MPI.COMM_WORLD
a = np.ones(4); b = np.empty(4)
out = {}


def on_disk():
    recs = read_raw(native.raw_path()).records
    return int((recs["op"] == 1).sum())  # MPI_Allreduce


def calls(n):
    for _ in range(n):
        c.Allreduce(a, b)


out["period"] = native.set_flush_ms(0)          # no ticks from now on
out["bad"] = [native.set_flush_ms(-1), native.set_flush_ms(60001)]
time.sleep(0.3)                                  # the tick under way ends
calls(50)
time.sleep(0.6)                                  # six default periods
out["held"] = on_disk()
out["was_held"] = native.set_flush_ms(20)        # wakes the helper at once
time.sleep(0.3)
out["released"] = on_disk()
calls(30)
time.sleep(0.3)                                  # fifteen periods of 20 ms
out["ticking"] = on_disk()
print("OUT " + json.dumps(out), flush=True)
'''


def run(tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, int]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    p = mpirun(1, [sys.executable, str(script)], cwd=tmp_path,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(tmp_path / "prof"),
                    **(env or {})})
    line = next(x for x in p.stdout.splitlines() if x.startswith("OUT "))
    out: dict[str, int] = json.loads(line[4:])
    return out


def test_set_flush_ms_holds_and_releases_the_helper(tmp_path: Path) -> None:
    out = run(tmp_path)
    assert out["period"] == 100  # the default
    assert out["bad"] == [-1, -1]  # out of range: refused, nothing changed
    assert out["held"] == 0  # no period: the 50 calls wait in the thread's buffer
    assert out["was_held"] == 0
    assert out["released"] == 50  # a period again: written at once
    assert out["ticking"] == 80


def test_the_period_comes_from_the_environment(tmp_path: Path) -> None:
    out = run(tmp_path, {"HOROVOD_PROFILE_FLUSH_MS": "40"})
    assert out["period"] == 40
    assert out["held"] == 0 and out["released"] == 50 and out["ticking"] == 80
