"""Sampling: profiler.sampling(on), `with profiler.paused()`, and
HOROVOD_PROFILE_SAMPLE_STEPS=N (one step in N), in a real mpi4py job under
mpirun.  Paused calls are neither recorded nor lost: they are counted in the
raw header's unsampled_calls, and the recorded calls keep their sequence
numbers, so the same call still matches across ranks by (comm, seq)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import base_env, mpirun, requires_mpi

from profiler.formats import dataset, schema
from profiler.formats.raw import read_header

pytestmark = [requires_mpi, pytest.mark.mpi]

EVERY = 3
STEPS = 7  # steps 0..6 are closed by 8 step() calls; the 8th opens step 7

JOB = r"""
import sys
import numpy as np
from mpi4py import MPI
import profiler

c = MPI.COMM_WORLD
a = np.ones(4); b = np.empty(4)
for i in range(5): c.Allreduce(a, b)          # recorded (before any step)
profiler.sampling(False)
for i in range(5): c.Allreduce(a, b)          # paused
profiler.sampling(True)
for i in range(5): c.Allreduce(a, b)          # recorded
with profiler.paused():
    for i in range(3): c.Bcast(a)              # paused
    with profiler.paused():                    # nests
        c.Bcast(a)
    c.Bcast(a)                                 # still paused after the inner block
c.Bcast(a)                                     # recorded again
for i in range(%(steps)d):
    profiler.step(images=2)
    c.Allreduce(a, b); c.Barrier()
profiler.step(images=2)
"""


def allreduce_seqs_expected() -> list[int]:
    # Sequence numbers on COMM_WORLD count every call (MPI_Init is 0).  Before
    # the steps: 15 allreduces (5 paused), 6 bcasts (5 paused), seq 1..21.
    rec = list(range(1, 6)) + list(range(11, 16))
    # step k holds allreduce seq 22 + 2k and barrier 23 + 2k
    rec += [22 + 2 * k for k in range(STEPS) if k % EVERY == 0]
    return rec


def unsampled_expected() -> int:
    paused_before_steps = 5 + 5
    paused_steps = 2 * sum(1 for k in range(STEPS) if k % EVERY != 0)
    finalize = 0 if STEPS % EVERY == 0 else 1  # it falls in step STEPS, not sampled
    return paused_before_steps + paused_steps + finalize


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    d = tmp_path_factory.mktemp("sampling")
    script = d / "job.py"
    script.write_text(JOB % {"steps": STEPS})
    out: dict[str, Path | str] = {}
    for mode in ("1", "summary"):
        prof = d / f"prof-{mode}"
        p = mpirun(2, [sys.executable, str(script)], cwd=d,
                   env={"HOROVOD_PROFILE": mode, "HOROVOD_PROFILE_DIR": str(prof),
                        "HOROVOD_PROFILE_SAMPLE_STEPS": str(EVERY)})
        out[mode] = prof
        out[mode + "-stderr"] = p.stderr
    return out


def test_header_counts_unsampled_calls_exactly(job: dict) -> None:
    for rank in (0, 1):
        h = read_header(job["1"] / "raw" / f"rank-{rank:05d}.hvprof")
        assert h["unsampled_calls"] == unsampled_expected()
        assert h["dropped_records"] == 0
        meta = json.loads((job["1"] / "ranks" / f"rank-{rank:05d}.json").read_bytes())
        assert meta["unsampled_calls"] == unsampled_expected()
    trace_meta = json.loads((job["1"] / "trace.json").read_bytes())["horovod_profiler"]
    assert [r["unsampled_calls"] for r in trace_meta["ranks"]] == [unsampled_expected()] * 2
    line = [x for x in job["1-stderr"].splitlines() if "trace written" in x]
    assert len(line) == 1 and f"{2 * unsampled_expected()} calls not sampled" in line[0]


def test_recorded_calls_keep_their_sequence_numbers(job: dict) -> None:
    frames = {r: pd.read_parquet(job["1"] / "ranks" / f"rank-{r:05d}.parquet")
              for r in (0, 1)}
    for r, df in frames.items():
        ar = df[df["op"] == "allreduce"]
        assert ar["seq"].tolist() == allreduce_seqs_expected(), r
        bc = df[df["op"] == "bcast"]
        assert bc["seq"].tolist() == [21], r  # the one bcast after the paused block
        assert (df["op"] == "finalize").sum() == (1 if STEPS % EVERY == 0 else 0)
    keys = [set(zip(f.loc[f["backend"] == "mpi", "op"].astype(str),
                    f.loc[f["backend"] == "mpi", "seq"])) for f in frames.values()]
    assert keys[0] == keys[1]  # the same calls, matched by (op, seq), on both ranks


def test_one_step_in_n_is_recorded(job: dict) -> None:
    df = pd.read_parquet(job["1"] / "ranks" / "rank-00000.parquet")
    steps = df[df["op"] == "step"]
    assert steps["seq"].tolist() == list(range(STEPS))  # every step record is written
    assert steps["count"].tolist() == [2] * STEPS
    in_steps = df[(df["backend"] == "mpi") & (df["step"] >= 0)]
    sampled = [k for k in range(STEPS) if k % EVERY == 0]
    assert sorted(set(in_steps["step"])) == sampled
    assert in_steps.groupby("step").size().tolist() == [2] * len(sampled)  # allreduce+barrier


def test_summary_mode_aggregates_only_sampled_calls(job: dict) -> None:
    prof = job["summary"]
    for rank in (0, 1):
        h = read_header(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert h["unsampled_calls"] == unsampled_expected()
        agg_file = prof / "ranks" / f"rank-{rank:05d}.agg.parquet"
        agg = pd.read_parquet(agg_file)
        # the aggregate schema every reader checks (dataset.AGG_KINDS) is the one written
        agg_schema = pq.read_schema(agg_file)
        assert dataset.schema_columns(agg_schema, aggregates=True) == schema.AGG_COLUMNS
        calls = agg.groupby("op", observed=True)["calls"].sum().to_dict()
        n_sampled_steps = sum(1 for k in range(STEPS) if k % EVERY == 0)
        assert calls["allreduce"] == 10 + n_sampled_steps
        assert calls["bcast"] == 1
        assert calls["barrier"] == n_sampled_steps
        assert h["aggregated_calls"] == sum(calls.values())


def test_bad_sample_steps_value_warns_once_and_records_everything(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB % {"steps": 2})
    prof = tmp_path / "prof"
    p = mpirun(2, [sys.executable, str(script)], cwd=tmp_path,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                    "HOROVOD_PROFILE_SAMPLE_STEPS": "every-other"})
    warnings = [x for x in p.stderr.splitlines() if "SAMPLE_STEPS" in x]
    # once for the job (rank 0), not once per rank
    assert len(warnings) == 1 and warnings[0].startswith("horovod-profiler: warning: ")
    for rank in (0, 1):
        h = read_header(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert h["unsampled_calls"] == 10  # only the explicitly paused calls


def test_api_is_a_no_op_without_profiling(tmp_path: Path) -> None:
    import subprocess

    code = ("import profiler\nprofiler.sampling(False)\nwith profiler.paused():\n"
            "    pass\nprofiler.sampling(True)\nprint('ok')\n")
    for env in ({}, {"HOROVOD_PROFILE": "1"}):  # off; on but no MPI: nothing opened
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=base_env(**env),
                           capture_output=True, text=True, timeout=60)
        assert (p.returncode, p.stdout, p.stderr) == (0, "ok\n", "")
    assert list(tmp_path.iterdir()) == []


WINDOW_JOB = r"""
import sys, time
import numpy as np
from mpi4py import MPI
import profiler

c = MPI.COMM_WORLD
a = np.ones(4); b = np.empty(4)
t0 = time.monotonic()
for i in range(5): c.Allreduce(a, b)          # in the window (when it is open)
with profiler.paused():                       # the application pauses: the window,
    for i in range(4): c.Bcast(a)             # open, must not switch it back on
    time.sleep(0.3)                           # (the helper checks every 100 ms)
    for i in range(4): c.Bcast(a)
profiler.sampling(True)
time.sleep(max(0.0, float(sys.argv[1]) - (time.monotonic() - t0)))
for i in range(6): c.Barrier()                # after the window closed (if it does)
"""


@pytest.mark.parametrize("window, recorded", [
    pytest.param("0:", {"allreduce": 5, "barrier": 6, "bcast": 0}, marks=pytest.mark.full),
    ("0:1.5", {"allreduce": 5, "barrier": 0, "bcast": 0}),  # both cuts at once
    pytest.param("3600:", {"allreduce": 0, "barrier": 0, "bcast": 0}, marks=pytest.mark.full),
])
def test_time_window_and_the_application_switch_combine(tmp_path: Path, window: str,
                                                        recorded: dict[str, int]) -> None:
    """HOROVOD_PROFILE_WINDOW and profiler.sampling()/paused() are both switches: a
    call is recorded when neither pauses it (neither overrides the other)."""
    script = tmp_path / "job.py"
    script.write_text(WINDOW_JOB)
    prof = tmp_path / "prof"
    p = mpirun(1, [sys.executable, str(script), "2.5"], cwd=tmp_path,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                    "HOROVOD_PROFILE_WINDOW": window})
    assert p.returncode == 0, p.stderr
    df = pd.read_parquet(prof / "ranks" / "rank-00000.parquet")
    got = {op: int((df["op"] == op).sum()) for op in recorded}
    assert got == recorded
    h = read_header(prof / "raw" / "rank-00000.hvprof")
    # every MPI call is recorded or counted as unsampled (init and finalize included)
    mpi = int((df["backend"] == "mpi").sum())
    assert mpi + h["unsampled_calls"] == 2 + 5 + 8 + 6, (mpi, h["unsampled_calls"])


def test_unusable_settings_are_said_once_by_rank_0(tmp_path: Path) -> None:
    """Every HOROVOD_PROFILE_* value the library cannot use: one warning line for
    the job (rank 0), saying what is done instead; the run records as if unset.
    (HOROVOD_PROFILE itself: an unknown value profiles nothing, test_activation.)"""
    script = tmp_path / "job.py"
    script.write_text(JOB % {"steps": 2})
    prof = tmp_path / "prof"
    bad = {"HOROVOD_PROFILE_CHUNK_KB": "lots",
           "HOROVOD_PROFILE_FLUSH_MS": "-3", "HOROVOD_PROFILE_HELPER": "maybe",
           "HOROVOD_PROFILE_SIGNALS": "2", "HOROVOD_PROFILE_CLOCK": "fast",
           "HOROVOD_PROFILE_CLOCK_SYNC": "node", "HOROVOD_PROFILE_TIMELINE": "sometimes",
           "HOROVOD_PROFILE_WINDOW": "5-10"}
    p = mpirun(2, [sys.executable, str(script)], cwd=tmp_path,
               env={**bad, "HOROVOD_PROFILE": "Yes", "HOROVOD_PROFILE_DIR": str(prof)})
    said = [x for x in p.stderr.splitlines() if x.startswith("horovod-profiler: warning: ")]
    for name, value in bad.items():
        mine = [x for x in said if f"ignoring {name}='{value}' (" in x]
        assert len(mine) == 1, (name, said)
    assert len(said) == len(bad), said
    for rank in (0, 1):
        h = read_header(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert h["mode"] == 0 and h["chunk_bytes"] == 256 << 10  # full mode, the default
        assert h["unsampled_calls"] == 10  # the window ignored: only the paused calls


def test_unusable_python_side_settings_are_said_once(tmp_path: Path) -> None:
    """The variables the Python side reads at exit (the trace window, the merge
    timeout): one line each for the job, the defaults used, the trace written."""
    script = tmp_path / "job.py"
    script.write_text(JOB % {"steps": 2})
    prof = tmp_path / "prof"
    bad = {"HOROVOD_PROFILE_TRACE_EVENTS": "many", "HOROVOD_PROFILE_TRACE_RANKS": "0",
           "HOROVOD_PROFILE_TRACE_STEPS": "nan", "HOROVOD_PROFILE_MERGE_TIMEOUT": "soon"}
    p = mpirun(2, [sys.executable, str(script)], cwd=tmp_path,
               env={**bad, "HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    said = [x for x in p.stderr.splitlines() if x.startswith("horovod-profiler: warning: ")]
    for name, value in bad.items():
        mine = [x for x in said if f"ignoring {name}='{value}' (" in x]
        assert len(mine) == 1, (name, said)
    assert len(said) == len(bad), said
    assert (prof / "trace.json").is_file()
    assert "trace written to" in p.stderr
