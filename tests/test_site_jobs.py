"""`profiler jobs` over a store of records varied from a real one: ranking by
node-hours lost (with the finding that explains each), a regression planted on
purpose found against a clean history (and none in the clean history alone),
naming what changed; interconnects compared; JSON out; an offline HTML page
that escapes hostile names; bad records skipped with one line; bad arguments
exit 2; `ingest` loads records left beside profiles."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import profiler_cli
from site_fixtures import base_record, copy_fixture, varied

from profiler.cli import main
from profiler.site import query
from profiler.site.record import RECORD_NAME
from profiler.site.store import DirStore


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`profiler ARGS` in this process (the entry point's own run is tested once)."""
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


CLEAN = [80.0, 81.5, 79.0, 80.5, 79.5, 80.8]  # compute ms per step, run to run


def _history(base: dict[str, Any], *, planted: bool) -> list[dict[str, Any]]:
    runs = [varied(base, i, parts={"compute": c, "wait_ranks": 10.0 + 0.2 * (i % 3),
                                   "horovod": 5.0, "transfer": 5.0 + 0.1 * (i % 2)})
            for i, c in enumerate(CLEAN)]
    if planted:  # the same script with fusion off: transfer and Horovod's wait grow
        runs.append(varied(base, len(CLEAN), parts={"compute": 80.2, "wait_ranks": 10.1,
                                                    "horovod": 12.0, "transfer": 14.0},
                           settings={"HOROVOD_FUSION_THRESHOLD": "0"}))
    return runs


def test_regression_planted_is_found_and_a_clean_history_gives_none() -> None:
    base = base_record()
    assert query.regressions(_history(base, planted=False)) == []
    regs = query.regressions(_history(base, planted=True))
    assert sorted(r["metric"] for r in regs) == ["horovod_ms", "step_ms", "transfer_ms"]
    step = next(r for r in regs if r["metric"] == "step_ms")
    assert step["value"] == 116.3 and step["history_runs"] == 6
    lo, hi = step["interval"]
    assert lo < step["history_mean"] < hi < 116.3
    assert step["changed"] == ["HOROVOD_FUSION_THRESHOLD: 134217728 -> 0"]


def test_a_script_run_under_new_names_is_compared_with_its_own_history(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Jobs named anew each time (a date in the name), one script: by name
    each has no history; by script the planted run is found against the
    others, and a record without a script is left out."""
    base = base_record()
    runs = _history(base, planted=True)
    for i, r in enumerate(runs):
        r["job"].update(name=f"resnet-2026-11-{i + 1:02d}", script="train_resnet.py")
    assert query.regressions(runs) == []
    regs = query.regressions(runs, by="script")
    assert sorted(r["metric"] for r in regs) == ["horovod_ms", "step_ms", "transfer_ms"]
    assert {r["script"] for r in regs} == {"train_resnet.py"}
    runs[-1]["job"]["script"] = ""
    assert query.regressions(runs, by="script") == []
    with pytest.raises(ValueError):
        query.regressions(runs, by="user")
    (tmp_path / "store").mkdir()
    store = DirStore(tmp_path / "store")
    runs[-1]["job"]["script"] = "train_resnet.py"
    for r in runs:
        store.put(r)
    rc, out, _ = cli(capsys, "jobs", "regressions", "--store", str(store.root), "--by", "script")
    assert rc == 0 and out.splitlines()[0].split()[0] == "script"
    assert "train_resnet.py" in out and "HOROVOD_FUSION_THRESHOLD: 134217728 -> 0" in out


def test_ranking_by_node_hours_lost_with_the_explaining_finding() -> None:
    base = base_record()
    recs = [varied(base, 0, name="small", hours=1, hosts=1),
            varied(base, 1, name="big", hours=2, hosts=4,
                   parts={"compute": 50.0, "wait_ranks": 30.0, "horovod": 10.0,
                          "transfer": 10.0}),
            varied(base, 2, name="mid", hours=1, hosts=4)]
    nosteps = varied(base, 3, name="nosteps")
    nosteps["breakdown"], nosteps["node_hours_comm"], nosteps["node_hours_wait"] = [], None, None
    rows = query.ranking([*recs, nosteps])
    assert [r["name"] for r in rows] == ["big", "mid", "small", "nosteps"]
    assert rows[0]["lost_node_hours"] == 8 * 0.5  # 8 node-hours, half of the step lost
    assert rows[0]["wait_node_hours"] == 8 * 0.3
    assert rows[-1]["lost_node_hours"] is None
    # the fixture's findings: the late rank (waiting) explains it, not the control plane
    assert rows[0]["finding_key"] == "late_ranks"
    assert [r["name"] for r in query.ranking(recs, top=1)] == ["big"]


def test_interconnects_compare_the_same_job() -> None:
    base = base_record()
    recs = [varied(base, i, transports=["tcp"], parts={"compute": 80.0, "wait_ranks": 0.0,
                                                       "horovod": 5.0, "transfer": 15.0})
            for i in range(2)]
    recs += [varied(base, 5, transports=["sm/vader"],
                    parts={"compute": 80.0, "wait_ranks": 0.0, "horovod": 5.0,
                           "transfer": 3.0})]
    rows = {r["interconnect"]: r for r in query.interconnects(recs)}
    assert set(rows) == {"tcp", "sm/vader"}
    assert rows["tcp"]["runs"] == 2 and rows["tcp"]["comm_ms"] == 20.0
    assert rows["sm/vader"]["comm_ms"] == 8.0
    assert abs(rows["sm/vader"]["comm_share"] - 8.0 / 88.0) < 1e-3


def test_cli_json_html_bad_records_and_bad_arguments(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOROVOD_PROFILE_STORE", raising=False)
    store = tmp_path / "store"
    store.mkdir()
    base = base_record()
    evil = "<script>alert('x')</script>"
    for r in _history(base, planted=True) + [varied(base, 20, name=evil, user="mallory")]:
        DirStore(store).put(r)
    me = next(store.iterdir())
    (me / "broken.json").write_text('{"schema": "horovod-profiler/job-rec')
    # the real entry point, once
    p = profiler_cli("jobs", "rank", "--store", str(store), "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert len(rows) == 8 and rows[0]["name"] == "resnet"  # 2 hosts x 1 h, 30% lost
    warn = p.stderr.splitlines()
    assert len(warn) == 1 and warn[0].startswith(f"profiler: warning: {me / 'broken.json'}")
    rc, out, _ = cli(capsys, "jobs", "regressions", "--store", str(store), "--name", "resnet")
    assert rc == 0 and "HOROVOD_FUSION_THRESHOLD: 134217728 -> 0" in out
    rc, out, _ = cli(capsys, "jobs", "list", "--store", str(store), "--user", "mallory",
                     "--format", "json")
    assert [r["name"] for r in json.loads(out)] == [evil]
    page = tmp_path / "jobs.html"
    rc, out, err = cli(capsys, "jobs", "html", "--store", str(store), "-o", str(page))
    assert rc == 0, err
    text = page.read_text()
    assert evil not in text and "&lt;script&gt;alert(" in text
    assert re.findall(r'data-figure="([a-z]+)"', text) == ["ranking", "history",
                                                           "interconnects"]
    assert text.count("<script src=") == 0 and "plotly" in text  # offline: inlined
    for bad in (["jobs", "list", "--store", str(store), "--since", "yesterday"],
                ["jobs", "frobnicate"], ["jobs", "list"], ["jobs", "html", "--store", str(store)],
                ["jobs", "rank", "--store", str(store), "--top", "0"],
                ["jobs", "ingest", "--store", str(store), str(tmp_path / "nope")]):
        rc, out, err = cli(capsys, *bad)
        assert rc == 2, (bad, err)
        assert len(err.splitlines()) == 1 and err.startswith("profiler: error: "), err


def test_ingest_loads_records_left_beside_profiles(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record kept beside its profile (the store was down) and a profile with
    no record at all (made now) are both loaded; a broken one is named."""
    jobs = tmp_path / "jobs"
    a = copy_fixture(jobs / "a")
    (a / RECORD_NAME).write_text(json.dumps(varied(base_record(), 7)))
    copy_fixture(jobs / "deep" / "b")
    bad = jobs / "c"
    bad.mkdir()
    (bad / RECORD_NAME).write_text("{")
    store = tmp_path / "store"
    store.mkdir()
    rc, out, err = cli(capsys, "jobs", "ingest", str(jobs), "--store", str(store))
    assert rc == 2  # one was not loaded
    assert out.strip() == f"2 job record(s) loaded into {store}, 1 not"
    assert len(err.splitlines()) == 1 and str(bad) in err
    ids = sorted(r["job"]["job_id"] for r in DirStore(store).select().records)
    assert len(ids) == 2 and "1007" in ids
