"""A late rank of many, outside the first ranks of a bounded window: one pass over
every rank's collectives puts it in the window, the late-rank finding names it,
and its cost is the counterfactual the generator knows by construction (its
delays over the run).  The null: the same job without stragglers names no rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, profiler_cli

from profiler.analysis import load_meta
from profiler.analysis.findings import advise

SOURCE = ROOT / "tests" / "data" / "analysis" / "fused"
RANKS = 256
MAX_ROWS = 20_000


def synth(d: Path, stragglers: int, seed: int) -> Path:
    p = profiler_cli("synth", str(SOURCE / "trace.json"), "-o", str(d), "--ranks", str(RANKS),
                     "--calls-per-rank", "1500", "--stragglers", str(stragglers),
                     "--straggler-delay-us", "3000", "--straggler-share", "0.6",
                     "--seed", str(seed), "-q")
    assert p.returncode == 0, p.stderr
    return d


@pytest.fixture(scope="module")
def late_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth(tmp_path_factory.mktemp("win") / "late", 2, seed=8)


def test_a_straggler_outside_the_first_ranks_is_named_with_its_cost(late_job: Path) -> None:
    syn = load_meta(late_job)["synthetic"]
    injected = syn["stragglers"]
    assert min(injected) >= 16  # the precondition: the first ranks do not hold them
    a = advise(late_job, max_rows=MAX_ROWS)
    assert a.header["ranks"] == RANKS and a.header["ranks_analysed"] == 16 + len(injected)
    # two late ranks, two findings, each priced on its own delays (two causes at once)
    late = [f for f in a.findings if f.key == "late_ranks"]
    assert [f.significant for f in late] == [True, True]
    assert sorted(f.numbers["rank"] for f in late) == sorted(injected)
    for f in late:
        truth_ms = syn["data_delay_ns_by_straggler"][str(f.numbers["rank"])] / syn["steps"] / 1e6
        assert f.cost_ms == pytest.approx(truth_ms, rel=0.25)
    f = late[0]
    assert f.numbers["whole_job"]["ranks"] == RANKS
    assert set(f.numbers["whole_job"]["top"][:2]) == set(injected)


def test_no_straggler_no_rank_named(tmp_path: Path) -> None:
    a = advise(synth(tmp_path / "clean", 0, seed=5), max_rows=MAX_ROWS)
    assert a.header["ranks_analysed"] == 16 + 2  # two ranks like the others
    assert not [f for f in a.findings if f.key == "late_ranks" and f.significant]
