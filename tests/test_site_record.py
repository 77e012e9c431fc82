"""The job record (profiler.site.record): made from a real two-rank profile
with the analysis facade's own figures, small, versioned, identity from each
scheduler's variables, only the settings it names; refused or skipped with
one line when it is of a newer version, partial or corrupted; written beside
the profile always, and a store that cannot take it costs one line, not the
job."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from site_fixtures import FIXTURE, as_user, base_record, chown_tree, copy_fixture, shared_tmp

from profiler.analysis.facade import TraceAnalysis
from profiler.site.record import (
    RECORD_NAME,
    SCHEMA_VERSION,
    RecordError,
    build_record,
    check,
    dumps,
    identity,
    loads,
    record_job,
)


def test_record_holds_the_facades_figures_and_stays_small() -> None:
    rec = base_record()
    ta = TraceAnalysis.open(FIXTURE / "trace.json")
    advice = ta.advise()
    assert rec["schema_version"] == SCHEMA_VERSION == 1
    assert rec["steps"] == advice.header["steps"] == 12
    assert rec["step_ms"] == pytest.approx(advice.header["step_ms"], rel=1e-3)
    assert rec["images_per_s"] == pytest.approx(advice.header["images_per_s"], rel=1e-3)
    assert rec["ranks"] == 2 and rec["hosts"] == ["vm"]
    assert [f["key"] for f in rec["findings"]] == [f.key for f in advice.findings]
    # bytes and calls per kind and op are the summary's, every bucket kept;
    # Horovod's negotiation (control) apart from its data on the same op
    summ = ta.summary(("kind", "op", "bucket"))
    ops = {(o["kind"], o["op"]): o for o in rec["ops"]}
    assert len(ops) == len(rec["ops"]) == summ.groupby(["kind", "op"], observed=True).ngroups
    assert sum(o["calls"] for o in ops.values()) == int(summ["calls"].sum())
    assert sum(o["bytes"] for o in ops.values()) == int(summ["total_bytes"].sum())
    assert sum(len(o["buckets"]) for o in ops.values()) == len(summ)
    data = summ.loc[(summ["kind"] == "data") & (summ["op"] == "allreduce"), "calls"].sum()
    assert ops[("data", "allreduce")]["calls"] == int(data) == 38
    assert ops[("control", "allreduce")]["calls"] > ops[("data", "allreduce")]["calls"]
    assert rec["versions"]["mpi"].startswith("Open MPI")
    assert rec["dropped"] == 0
    size = len(dumps(rec))
    assert 1_000 < size < 16_000, size
    assert loads(dumps(rec)) == rec


def test_identity_from_each_scheduler_else_host_and_pid() -> None:
    meta = {"ranks": [{"rank": 0, "host": "n1", "pid": 42}], "command": ["train.py", "-x"],
            "job_id": "0xab"}
    cases = {
        "slurm": ({"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "bert", "SLURM_JOB_USER": "ann",
                   "SLURM_JOB_PARTITION": "a100"}, ("7", "bert", "ann", "a100")),
        "pbs": ({"PBS_JOBID": "8.pbs", "PBS_JOBNAME": "gpt", "PBS_O_LOGNAME": "bo",
                 "PBS_QUEUE": "q1"}, ("8.pbs", "gpt", "bo", "q1")),
        "lsf": ({"LSB_JOBID": "9", "LSB_JOBNAME": "vit", "LSFUSERNAME": "cy",
                 "LSB_QUEUE": "normal"}, ("9", "vit", "cy", "normal")),
        "flux": ({"FLUX_JOB_ID": "f1x"}, ("f1x", "train.py", None, "")),
    }
    for sched, (env, (jid, name, user, part)) in cases.items():
        got = identity(env, meta)
        assert (got["scheduler"], got["job_id"], got["name"], got["partition"]) == (
            sched, jid, name, part)
        if user is not None:
            assert got["user"] == user
        assert got["id"] == f"{sched}-{jid}-0xab".replace(".", ".")
    none = identity({}, meta)
    assert (none["scheduler"], none["job_id"], none["name"]) == ("none", "n1-42", "train.py")


def test_only_the_named_settings_never_the_environment(tmp_path: Path) -> None:
    d = copy_fixture(tmp_path / "p")
    trace = d / "trace.json"
    doc = json.loads(trace.read_text())
    doc["horovod_profiler"]["env"].update({"HOROVOD_FUSION_THRESHOLD": "0",
                                           "HOROVOD_CYCLE_TIME": "5",
                                           "HOROVOD_SECRET_TOKEN": "hunter2",
                                           "NCCL_ALGO": "Ring"})
    trace.write_text(json.dumps(doc))
    rec = build_record(trace, {"AWS_SECRET_ACCESS_KEY": "x", "SLURM_JOB_ID": "1"})
    assert rec["settings"] == {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "0",
                               "HOROVOD_PROFILE": "1", "NCCL_ALGO": "Ring"}
    text = dumps(rec).decode()
    assert "hunter2" not in text and "AWS_SECRET" not in text


def test_newer_partial_and_corrupted_records_are_refused_in_one_line() -> None:
    rec = base_record()
    newer = dict(rec, schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(RecordError, match=r"^x\.json: job record of schema version 2, newer"):
        check(newer, "x.json")
    partial = {k: v for k, v in rec.items() if k != "ops"}
    with pytest.raises(RecordError, match="without a valid 'ops'"):
        check(partial)
    with pytest.raises(RecordError, match="not JSON"):
        loads(dumps(rec)[:200], "cut.json")
    with pytest.raises(RecordError, match="not a horovod-profiler job record"):
        loads(b'{"a": 1}')


def test_record_beside_always_and_a_store_that_fails_costs_one_line(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    d = copy_fixture(tmp_path / "p")
    # a store that does not exist: the record stays beside, one line names ingest
    assert record_job(d, str(tmp_path / "no-such-store"), {}) == 0
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and f"job record kept at {d / RECORD_NAME}" in err[0]
    assert f"profiler jobs ingest {d}" in err[0]
    assert loads((d / RECORD_NAME).read_bytes())["steps"] == 12
    # an unreachable database: the same, quickly
    os.unlink(d / RECORD_NAME)
    assert record_job(d, f"postgresql:///x?host={tmp_path}/nowhere", {}) == 0
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and "not stored" in err[0] and (d / RECORD_NAME).exists()
    # no trace: no record, one line, status 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert record_job(empty, "", {}) == 2
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"horovod-profiler: no job record for {empty}")


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to another user (needs root)")
def test_a_read_only_store_keeps_the_record_beside() -> None:
    """A store this user may not write (root's 0755 folder, written as nobody):
    exit status 0, the record beside the profile, one line."""
    with shared_tmp() as tmp:
        d = copy_fixture(tmp / "p")
        chown_tree(d, 65534, 65534)
        store = tmp / "store"
        store.mkdir(mode=0o755)
        p = as_user(65534, 65534, [sys.executable, "-m", "profiler.site.record", str(d)],
                    {"HOROVOD_PROFILE_STORE": str(store)})
        assert p.returncode == 0, p.stderr
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and "not stored" in lines[0] and "Permission denied" in lines[0]
        assert (d / RECORD_NAME).exists() and list(store.iterdir()) == []


def test_a_full_disk_keeps_the_record_beside(tmp_path: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    """A store on a full file system (a 64 KiB tmpfs, filled): one line, the
    record beside the profile, nothing torn left in the store."""
    from test_robust_faults import tmpfs

    d = copy_fixture(tmp_path / "p")
    with tmpfs(tmp_path / "full", "size=64k") as mnt:
        if mnt is None:
            pytest.skip("mount is not permitted here (the read-only store covers the path)")
        with open(mnt / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        assert record_job(d, str(mnt), {}) == 0
        err = capfd.readouterr().err.splitlines()
        assert len(err) == 1 and "No space left on device" in err[0], err
        assert (d / RECORD_NAME).exists()
        assert [p.name for p in mnt.rglob("*") if p.is_file()] == ["filler"]


def test_the_exit_waits_for_the_record_a_bounded_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record slower than HOROVOD_PROFILE_RECORD_TIMEOUT is ended, with one line."""
    from profiler.postjob.site_record import record_at_exit

    d = copy_fixture(tmp_path / "p")
    monkeypatch.setenv("HOROVOD_PROFILE_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("HOROVOD_PROFILE_RECORD_TIMEOUT", "0.05")
    lines: list[str] = []
    t = time.monotonic()
    record_at_exit(str(d), lines.append)
    assert time.monotonic() - t < 5
    assert len(lines) == 1 and "took longer than 0.05 s" in lines[0]
    assert f"profiler jobs ingest {d}" in lines[0] and not (d / RECORD_NAME).exists()
    monkeypatch.setenv("HOROVOD_PROFILE_RECORD_TIMEOUT", "0")  # no record at all
    record_at_exit(str(d), lines.append)
    assert len(lines) == 1 and not (d / RECORD_NAME).exists()
    # without a store (no site activation) no record at exit: `jobs ingest` makes it
    monkeypatch.setenv("HOROVOD_PROFILE_RECORD_TIMEOUT", "20")
    monkeypatch.delenv("HOROVOD_PROFILE_STORE")
    record_at_exit(str(d), lines.append)
    assert len(lines) == 1 and not (d / RECORD_NAME).exists()
