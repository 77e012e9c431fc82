"""Late ranks of many tell one story.  `profiler synth` moves a straggler's arrival
at synchronize with its delay at the collective its gradients ride in, as a real
late rank's would, records what it injected, and refuses a job whose arrivals
and collectives disagree; the late-rank finding then names every injected
straggler of 512, priced within 25% of what synth recorded, and the same job
without stragglers names none.  (1024 ranks: benchmarks/scale_stragglers.py.)

The template is a real 2-rank Horovod job (tests/hvd_model_job.py, whose
hvd.DistributedOptimizer leaves the synchronize and tensor marks the step
breakdown reads arrivals from), without CPU figures (a template's CPU waits
would be every generated rank's, and claimed as contention)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mpirun, profiler_cli, requires_mpi

from profiler.analysis import load, load_meta
from profiler.analysis.breakdown import rank_breakdown
from profiler.analysis.findings import advise
from profiler.synth import (
    DisagreementError,
    SynthConfig,
    calls_for_steps,
    check_arrivals,
    make_plan,
    median_step_ns,
    rank_table,
    read_template,
    synthesize,
)

pytestmark = [requires_mpi, pytest.mark.mpi, pytest.mark.horovod]

JOB = Path(__file__).parent / "hvd_model_job.py"
SHARE = 0.9  # of the steps' collectives: each of K stragglers is late in 0.9/K of the steps
MAX_ROWS = 30_000  # advise's window: the first 16 ranks and those the whole-job pass names


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("template")
    prof = d / "prof"
    # a longer cycle: fewer of Horovod's idle cycles before the first step to repeat
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof), "HOROVOD_PROFILE_CPU": "0",
           "HOROVOD_CYCLE_TIME": "5", "STEPS": "12"}
    mpirun(2, [sys.executable, str(JOB)], env=env, cwd=d, timeout=240)
    return prof / "trace.json"


def config(template: Path, ranks: int, stragglers: int, seed: int, steps: int = 60
           ) -> SynthConfig:
    """About `steps` steps; the delay a fifth of the template's step (its machine
    sets the step, so a fixed delay could be lost in it or swamp it)."""
    tmpl = read_template(template)
    return SynthConfig(ranks=ranks, calls_per_rank=calls_for_steps(tmpl, steps),
                       stragglers=stragglers, seed=seed, straggler_share=SHARE,
                       straggler_delay_ns=median_step_ns(tmpl) // 5)


def synth_cli(template: Path, d: Path, cfg: SynthConfig) -> Path:
    p = profiler_cli("synth", str(template), "-o", str(d), "--ranks", str(cfg.ranks),
                     "--calls-per-rank", str(cfg.calls_per_rank), "--stragglers",
                     str(cfg.stragglers), "--straggler-share", str(cfg.straggler_share),
                     "--straggler-delay-us", str(cfg.straggler_delay_ns / 1e3),
                     "--seed", str(cfg.seed), "-q")
    assert p.returncode == 0, p.stderr
    return d


def named(a) -> dict[int, float]:  # type: ignore[no-untyped-def]
    return {int(f.numbers["rank"]): float(f.cost_ms) for f in a.findings
            if f.key == "late_ranks" and f.significant}


# ---------------------------------------------------------------------------
# the generator
# ---------------------------------------------------------------------------
def test_a_stragglers_arrival_moves_with_its_delay(template: Path, tmp_path: Path) -> None:
    cfg = config(template, ranks=8, stragglers=2, seed=3, steps=24)
    res = synthesize(template, tmp_path / "job", cfg)
    syn = load_meta(res.directory)["synthetic"]
    inj = syn["injected"]
    assert inj["model"] == "arrivals" and sorted(inj["by_straggler"]) == \
        sorted(str(r) for r in res.stragglers)
    # the plan again (the same arguments give the same job): each step's delay
    plan = make_plan(read_template(template), cfg)
    a = plan.arrivals
    delayed = plan.straggler_of >= 0
    assert delayed.any() and set(np.flatnonzero(delayed)) <= set(a.gate)  # only at gates
    by_step = {r: {int(s): 0 for s in a.step} for r in res.stragglers}
    for g, s in zip(a.gate, a.step):
        if plan.straggler_of[g] >= 0:
            by_step[plan.stragglers[plan.straggler_of[g]]][int(s)] = int(plan.delay[g])
    # the breakdown reads each straggler's arrival that much after the others':
    # its delay, give or take the jitter (1.5 x 2 us) and clock residuals (0.5 us)
    bd = rank_breakdown(load(res.directory))
    arr = bd.pivot_table(index="step", columns="rank", values="arrival_ns", aggfunc="max")
    for r in res.stragglers:
        after = (arr[r] - arr.drop(columns=[r]).median(axis=1)).dropna()
        want = np.array([by_step[r].get(int(s), 0) for s in after.index])
        assert len(after) >= 20 and (want > 0).sum() >= 5
        assert np.abs(after.to_numpy() - want).max() < 5_000
        total = syn["injected"]["by_straggler"][str(r)]
        assert total["late_steps"] == sum(1 for v in by_step[r].values() if v > 0)
        assert total["delay_ns"] == sum(by_step[r].values())
        assert total["delay_ns_per_step"] == pytest.approx(total["delay_ns"] / inj["steps"])


def test_arrivals_that_disagree_with_the_collectives_are_refused(
        template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(template, ranks=8, stragglers=2, seed=3, steps=24)
    tmpl = read_template(template)
    plan = make_plan(tmpl, cfg)
    late = plan.stragglers[0]
    # the generator's own rows agree, every rank's
    for r in range(cfg.ranks):
        check_arrivals(tmpl, plan, cfg, r, rank_table(tmpl, plan, cfg, r))
    # a straggler delayed at its collectives whose arrivals stayed where they were
    # (what synth wrote before): the late-rank finding would read an on-time rank
    stale = rank_table(tmpl, plan, cfg, late, arrivals=False)
    with pytest.raises(DisagreementError, match=f"rank {late}, step .* disagree"):
        check_arrivals(tmpl, plan, cfg, late, stale)
    # a rank with no delay is late by its jitter at most: nothing to refuse
    calm = next(r for r in range(cfg.ranks) if r not in plan.stragglers)
    check_arrivals(tmpl, plan, cfg, calm, rank_table(tmpl, plan, cfg, calm, arrivals=False))
    # and the code that builds the job refuses to write it
    import profiler.synth as S

    real = S.rank_table
    monkeypatch.setattr(S, "rank_table", lambda *a, **k: real(*a, **k, arrivals=False))
    with pytest.raises(DisagreementError, match="arrivals and collectives disagree"):
        synthesize(template, tmp_path / "refused", cfg)


# ---------------------------------------------------------------------------
# the finding
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def job512(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_cli(template, tmp_path_factory.mktemp("s512") / "job",
                     config(template, ranks=512, stragglers=2, seed=1))


def test_512_ranks_every_straggler_named_at_its_cost(job512: Path) -> None:
    syn = load_meta(job512)["synthetic"]
    injected = syn["injected"]["by_straggler"]
    assert len(injected) == 2
    a = advise(job512, max_rows=MAX_ROWS)
    assert a.header["ranks"] == 512 and a.header["window"]
    got = named(a)
    assert set(got) == {int(r) for r in injected}
    for r, cost in got.items():
        truth_ms = injected[str(r)]["delay_ns_per_step"] / 1e6
        assert cost == pytest.approx(truth_ms, rel=0.25), (r, cost, truth_ms)
    late = [f for f in a.findings if f.key == "late_ranks" and f.significant]
    for f in late:
        assert f.numbers["source"] == "sync"
        assert "hands its gradients to Horovod later" in f.details[0]
        # the whole-job pass ranks it among the two the others wait for most, and
        # its leads over every matched call come to the same cost
        whole = f.numbers["whole_job"]
        assert whole["ranks"] == 512 and whole["rank_order"] in (1, 2)
        assert set(whole["top"][:2]) == set(got)
        truth_ms = injected[str(f.numbers["rank"])]["delay_ns_per_step"] / 1e6
        assert whole["gain_ms_per_step"] == pytest.approx(truth_ms, rel=0.25)
    # what the two cause is not left to the unblamed waiting
    (w,) = [f for f in a.findings if f.key == "rank_waiting"]
    assert not w.significant


def test_512_ranks_without_stragglers_name_none(template: Path, tmp_path: Path) -> None:
    d = synthesize(template, tmp_path / "null", config(template, ranks=512, stragglers=0,
                                                      seed=1), trace_events=2_000).directory
    assert load_meta(d)["synthetic"]["injected"]["by_straggler"] == {}
    a = advise(d, max_rows=MAX_ROWS)
    assert a.header["window"] and named(a) == {}


def test_every_rank_read_names_the_same_stragglers(template: Path, tmp_path: Path) -> None:
    """No window (64 ranks, every row loaded): the same story, chance 1/64."""
    res = synthesize(template, tmp_path / "job", config(template, ranks=64, stragglers=2,
                                                        seed=2), trace_events=2_000)
    injected = load_meta(res.directory)["synthetic"]["injected"]["by_straggler"]
    a = advise(res.directory)
    assert not a.header["window"]
    got = named(a)
    assert set(got) == {int(r) for r in injected}
    for r, cost in got.items():
        assert cost == pytest.approx(injected[str(r)]["delay_ns_per_step"] / 1e6, rel=0.25)
