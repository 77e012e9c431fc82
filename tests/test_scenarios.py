"""The diagnosis scenarios' fast subset (benchmarks/scenarios/suite.py): real
2-rank Horovod jobs with one known cause, or none, and what `profiler advise`
must conclude.  The whole suite, with three runs of each scenario and the
costs against their truths, is a benchmark (README, "Diagnoses you can trust")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "scenario_suite", ROOT / "benchmarks" / "scenarios" / "suite.py")
assert _spec is not None and _spec.loader is not None
suite = importlib.util.module_from_spec(_spec)
sys.modules["scenario_suite"] = suite
_spec.loader.exec_module(suite)

pytestmark = [pytest.mark.mpi, pytest.mark.horovod]


@pytest.fixture(scope="module", autouse=True)
def _horovod() -> None:
    pytest.importorskip("horovod.torch")


def _run(name: str, tmp_path: Path) -> object:
    r = suite.evaluate(suite.BY_NAME[name], 1, tmp_path, twin=False)
    print(name, r.first, r.cost_ms, r.truth_ms, r.false, r.findings)
    return r


def test_clean_job_blames_nothing(tmp_path: Path) -> None:
    r = _run("clean", tmp_path)
    assert r.false == [], r.findings
    assert not any(f["key"] in suite.NAMING and f["significant"] for f in r.findings)
    assert r.sum_error < 0.02  # the breakdown adds up to the job's own step time


def test_symmetric_jitter_is_waiting_that_blames_no_rank(tmp_path: Path) -> None:
    r = _run("jitter", tmp_path)
    assert r.first == "rank_waiting" and r.false == [], r.findings
    assert not any(f["key"] == "late_ranks" and f["significant"] for f in r.findings)
    # uniform(0, 60 ms) per rank: 10 ms of waiting per rank on average; the
    # machine's own variation only adds to it
    assert 0.75 * r.truth_ms <= r.cost_ms <= 1.6 * r.truth_ms


def test_a_late_rank_is_named_with_the_waiting_it_causes(tmp_path: Path) -> None:
    r = _run("late", tmp_path)
    assert r.first == "late_ranks" and r.false == [], r.findings
    assert r.cost_ms == pytest.approx(r.truth_ms, rel=suite.TOLERANCE)
    assert r.sum_error < 0.02


def test_a_cliff_made_by_the_mpi_library_is_confirmed_by_replay(tmp_path: Path) -> None:
    r = _run("cliff", tmp_path)
    assert r.first == "latency_cliffs", r.findings
    assert not any(f["key"] == "late_ranks" and f["significant"] for f in r.findings)
    # its twin without the rules file: the sizes may look slow in the run, the
    # replay dismisses them, and nothing names a size
    t = _run("cliff-twin", tmp_path)
    assert not any(f["key"] == "latency_cliffs" and f["significant"] for f in t.findings)
