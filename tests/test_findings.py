"""Findings where the truth is known: generated traces with an injected late rank,
latency spikes at known sizes, negligible communication, dropped records and
unaligned clocks; and `profiler advise` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import sweep, training

from profiler.analysis.findings import advise_frame

DATA = Path(__file__).parent / "data" / "analysis"


def _by_key(advice, key):  # type: ignore[no-untyped-def]
    return [f for f in advice.findings if f.key == key]


def test_late_rank_named_and_its_cost_is_the_injected_delay() -> None:
    late_ns = 2_000_000
    df = training(steps=14, late_rank=1, late_ns=late_ns, step_ns=30_000_000)
    a = advise_frame(df, {})
    (f,) = _by_key(a, "late_ranks")
    assert f.numbers["rank"] == 1 and f.significant
    assert f.numbers["last_share"] == pytest.approx(1.0)
    # the other rank waits late_ns at each of the 2 data calls of every step: without
    # the lateness each call starts late_ns sooner, so the step ends 2 x late_ns
    # sooner (the counterfactual, the headline); the others' waiting averaged over
    # the 2 ranks (the breakdown's units) is late_ns per step
    assert f.cost_ms == pytest.approx(2 * late_ns / 1e6, rel=0.05)
    assert f.numbers["step_gain_ms"] == f.cost_ms
    assert f.numbers["others_wait_ms_per_step"] == pytest.approx(late_ns / 1e6, rel=0.05)
    assert "arrives late" in f.details[0]
    assert "chance alone gives 50%" in f.details[1]
    assert a.significant[0].key == "late_ranks"


def test_unaligned_clocks_make_no_late_rank_claim() -> None:
    df = training(steps=14, late_rank=1, late_ns=200_000)
    meta = {"ranks": [{"rank": 0, "offset_method": 0},
                      {"rank": 1, "offset_method": 1, "offset_err_ns": 3_000_000}]}
    (f,) = _by_key(advise_frame(df, meta), "late_ranks")
    assert not f.significant
    assert any("clocks are aligned within" in d for d in f.details)


def test_negligible_communication_gives_no_communication_finding() -> None:
    df = training(steps=14, step_ns=200_000_000, call_ns=(2_000, 3_000), tail_ns=50_000,
                  control_per_step=0, sync=True)
    a = advise_frame(df, {})
    # the one claim: communication is not the limit; what it explains is the
    # step outside synchronize
    assert [f.key for f in a.significant] == ["compute_bound"]
    (f,) = a.significant
    assert f.cost_label == "explains" and f.part == "compute"
    outside_ms = (200_000_000 - 5_000 - 50_000 + 25_000) / 1e6
    assert f.cost_ms == pytest.approx(outside_ms, rel=1e-6)
    # the breakdown sums to the step, and its transfer part is the calls after arrival
    parts = a.breakdown.set_index("part")["ms"]
    assert parts.sum() == pytest.approx(200.0, rel=1e-9)
    assert parts["transfer"] == pytest.approx(0.005, rel=1e-6)
    # without the synchronize rows there is nothing to split a step by: no breakdown,
    # no claim either way
    b = advise_frame(training(steps=14, step_ns=200_000_000, call_ns=(2_000, 3_000),
                              tail_ns=50_000, control_per_step=0), {})
    assert b.significant == [] and len(b.breakdown) == 0


def test_latency_spikes_at_known_sizes_are_named() -> None:
    sizes = sorted({1 << k for k in range(3, 21)} | {3 << k for k in range(3, 19)})
    spiky = {3 << 10: 4.0, 3 << 14: 5.0}
    df = sweep(sizes, spikes=spiky, noise=0.02, iters=15)
    (f,) = _by_key(advise_frame(df, {}), "latency_cliffs")
    assert set(f.numbers["sizes"]) == set(spiky)
    assert f.numbers["non_pow2"] == 2


def test_clean_bench_gives_no_padding_finding() -> None:
    sizes = sorted({1 << k for k in range(3, 21)} | {3 << k for k in range(3, 19)})
    df = sweep(sizes, noise=0.02, iters=15)
    assert _by_key(advise_frame(df, {}), "latency_cliffs") == []


def test_what_the_trace_cannot_support_is_said() -> None:
    df = sweep([1 << k for k in range(3, 12)], iters=5)  # no steps
    meta = {"ranks": [{"rank": 0, "dropped": 17}, {"rank": 1, "dropped": 0}],
            "dataset": {"aggregates": []}}
    keys = {f.key for f in advise_frame(df, meta).limits}
    assert {"dropped", "no_steps"} <= keys
    assert all(f.kind == "limit" for f in advise_frame(df, meta).limits)


def test_slow_transfers_against_the_runs_own_fastest() -> None:
    # the 1 MiB allreduce takes 2 ms longer in every other step: the run's own
    # fastest transfers of that size (p10) are the reference, the cost is the
    # injected 1 ms per step on average; waiting for a late rank is not counted
    extra = [0, 2_000_000] * 7
    df = training(steps=14, extra_comm_ns=extra, late_rank=1, late_ns=300_000,
                  step_ns=30_000_000)
    a = advise_frame(df, {})
    (f,) = _by_key(a, "efficiency")
    assert f.numbers["source"] == "own"
    steps = a.header["steps"]
    steady_extra = np.mean(extra[-steps:]) / 1e6
    assert f.cost_ms == pytest.approx(steady_extra, rel=0.05)
    lo, hi = f.cost_interval_ms
    assert lo <= f.cost_ms <= hi
    # against the run's own fastest transfers the figure is not claimed: any noise
    # makes the p10 look fast; a bench of the fabric decides (next test)
    assert not f.significant and "bench" in f.not_claimed
    # steady transfers: 4 KiB 200 us, 1 MiB 1 ms or 3 ms
    assert 0.3 < f.numbers["efficiency"] < 0.8
    # a run whose transfers never vary has no efficiency cost
    (g,) = _by_key(advise_frame(training(steps=14), {}), "efficiency")
    assert g.cost_ms == pytest.approx(0.0, abs=1e-9) and not g.significant


def test_transfers_against_a_bench_of_the_same_fabric() -> None:
    from profiler.analysis.findings import Context

    df = training(steps=14, step_ns=30_000_000)
    sizes = [1 << k for k in range(10, 23)]
    bench = sweep(sizes, alpha_us=2.0, bw_gbps=5.0, iters=5)
    a = advise_frame(df, {}, bench=Context(df=bench, meta={}))
    (f,) = _by_key(a, "efficiency")
    assert f.numbers["source"] == "bench"
    fast = {4096: 2_000 + 4096 / 5.0, 1 << 20: 2_000 + (1 << 20) / 5.0}  # ns, the bench's line
    excess_ms = ((200_000 - fast[4096]) + (1_000_000 - fast[1 << 20])) / 1e6
    assert f.cost_ms == pytest.approx(excess_ms, rel=0.03)
    assert f.numbers["efficiency"] == pytest.approx(sum(fast.values()) / 1_200_000, rel=0.03)
    by = {s["bytes"]: s for s in f.numbers["sizes"]}
    # allreduce bus bandwidth 2(n-1)/n x bytes / time, n = 2: the app's 1 MiB in 1 ms
    assert by[1 << 20]["busbw_gbps"] == pytest.approx((1 << 20) / 1e6, rel=1e-6)
    assert by[1 << 20]["reference_busbw_gbps"] == pytest.approx(
        (1 << 20) / fast[1 << 20], rel=0.03)
    # a bench of another rank count does not describe this fabric: a limit, no claim
    other = sweep(sizes, iters=5, ranks=4)
    b = advise_frame(df, {}, bench=Context(df=other, meta={}))
    assert _by_key(b, "efficiency") == []
    (lim,) = _by_key(b, "efficiency_bench")
    assert lim.kind == "limit" and "4 ranks against 2" in lim.details[0]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "profiler.cli", *args],
                          capture_output=True, text=True, timeout=120)


def test_advise_cli_text_and_json() -> None:
    trace = str(DATA / "fused" / "trace.json")
    p = _cli("advise", trace)
    assert p.returncode == 0, p.stderr
    first = " ".join(p.stdout.split("\n\n", 1)[0].split())
    assert "2 rank(s) on 1 host(s)" in first and "ms/step" in first
    assert "e+" not in p.stdout and "e-0" not in p.stdout
    # a trace recorded before synchronize was timed: no breakdown, and the waiting
    # at matched calls (tested against chance) is all there is to say about ranks
    assert "Where a step goes" not in p.stdout
    assert "1. " in p.stdout or "no significant finding" in p.stdout
    j = _cli("advise", trace, "--format", "json")
    assert j.returncode == 0
    doc = json.loads(j.stdout)
    assert doc["ranks"] == 2 and doc["steps"] > 0 and doc["breakdown"] == []
    assert "late_ranks" in {f["key"] for f in doc["findings"]}
    for f in doc["findings"]:
        if f["cost_interval_ms"]:
            lo, hi = f["cost_interval_ms"]
            assert lo <= f["cost_ms"] <= hi


@pytest.mark.parametrize("width", [80, 120])
def test_advise_fits_the_terminal(width: int) -> None:
    from profiler.analysis.findings import advise
    from profiler.cli.advise import render

    text = render(advise(DATA / "unfused" / "trace.json"), width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "\u2026" not in text



def test_advise_files_each_unclaimed_finding_under_what_it_is() -> None:
    # A finding that claims no cost is a description, not noise: a step that
    # waits 0.7 ms for Horovod's cycle is listed with its reason, not "below
    # the noise floor"; a cost the noise hides is; a failed test is "not
    # claimed".
    from profiler.analysis.findings import Advice
    from profiler.analysis.findings.base import Finding
    from profiler.cli.advise import render

    a = Advice(path="t.json", header={"ranks": 2, "hosts": 1}, findings=[
        Finding(key="horovod_wait", headline="Tensors wait 709 us per step for Horovod",
                details=["568 us waiting for Horovod's next cycle", "second line"]),
        Finding(key="efficiency", headline="Transfers run at 88%", cost_ms=0.0097,
                cost_interval_ms=(0.0066, 0.0128)),
        Finding(key="late_ranks", headline="Rank 1 is last", cost_ms=0.5,
                not_claimed="chance explains it"),
    ])
    lines = render(a, width=100).splitlines()
    heads = {h: lines.index(h) for h in ("Not claimed:", "Below the noise floor:",
                                          "Measured, no cost claimed:")}
    at = {k: next(i for i, x in enumerate(lines) if k in x)
          for k in ("Tensors wait", "Transfers run", "Rank 1 is last")}
    assert heads["Not claimed:"] < at["Rank 1 is last"] < heads["Below the noise floor:"]
    assert heads["Below the noise floor:"] < at["Transfers run"] < heads[
        "Measured, no cost claimed:"] < at["Tensors wait"]
    assert "568 us waiting for Horovod's next cycle" in lines[at["Tensors wait"]]
    assert "second line" not in "\n".join(lines)


@pytest.mark.parametrize("width", [80, 120])
def test_the_breakdown_bar_narrows_before_an_interval_is_cut(width: int) -> None:
    import pandas as pd

    from profiler.analysis.findings import Advice
    from profiler.cli.advise import render

    bd = pd.DataFrame({"part": ["compute", "wait_ranks", "horovod"],
                       "label": ["compute and the rest", "waiting for other ranks",
                                 "waiting for Horovod"],
                       "ms": [0.9621, 0.03735, 0.408], "lo_ms": [0.9559, 0.03372, 0.3963],
                       "hi_ms": [0.9683, 0.04098, 0.4196], "share": [0.68, 0.03, 0.29]})
    a = Advice(path="t.json", header={"ranks": 2, "hosts": 1, "steps": 2998, "step_ms": 1.22},
               breakdown=bd)
    lines = render(a, width=width).splitlines()
    rows = [x for x in lines if x.startswith("  ") and "[" in x]
    assert len(rows) == 3 and all(x.endswith("]") and len(x) <= width for x in rows)
    assert "[955.9 us, 968.3 us]" in rows[0]


def test_advise_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    p = _cli("advise", str(tmp_path / "nothing.json"))
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "profiler: error:" in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    p = _cli("advise", str(bad))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    p = _cli("advise", str(DATA / "fused" / "trace.json"), "--bench", str(bad))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_advise_cli_measures_against_a_bench_trace() -> None:
    # the recorded unfused run stands in for a bench of the same fabric (same
    # ranks and host): the efficiency finding says it was measured against it
    p = _cli("advise", str(DATA / "fused" / "trace.json"), "--bench",
             str(DATA / "unfused" / "trace.json"), "--format", "json")
    assert p.returncode == 0, p.stderr
    (f,) = [f for f in json.loads(p.stdout)["findings"] if f["key"] == "efficiency"]
    assert f["numbers"]["source"] == "bench" and "bench" in f["headline"]


def test_no_steps_trace_costs_nothing_per_step() -> None:
    df = sweep([1 << k for k in range(3, 12)], iters=5)
    a = advise_frame(df, {})
    assert a.findings and all(f.cost_ms is None for f in a.findings)
    assert not np.isfinite(a.header["step_ms"]) and a.header["steps"] == 0


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.full  # tests/test_scenarios.py's late rank covers the same path
def test_real_horovod_late_rank_is_named_with_the_injected_cost(tmp_path: Path) -> None:
    """Rank 1 sleeps 20 ms before its backward pass in every step of a real 2-rank
    Horovod job: advise names it, calls it late-arriving, its cost is that the
    step would end the injected delay sooner without it, and the waiting it
    causes, averaged over the 2 ranks like the breakdown, is half of it, each
    within 25%."""
    pytest.importorskip("horovod.torch")
    from conftest import mpirun

    from profiler.analysis.findings import advise

    delay_ms = 20.0
    prof = tmp_path / "prof"
    env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof), "STEPS": "24",
           "SLOW_EVERY_MS": str(delay_ms), "SLOW_RANK": "1"}
    job = Path(__file__).parent / "hvd_model_job.py"
    mpirun(2, [sys.executable, str(job)], env=env, cwd=tmp_path, timeout=240)
    a = advise(prof / "trace.json")
    (f,) = _by_key(a, "late_ranks")
    print(f.headline, f.cost_ms, f.cost_interval_ms, f.numbers)
    assert f.numbers["source"] == "sync"
    assert f.numbers["rank"] == 1 and f.significant
    assert f.numbers["last_share"] >= 0.75  # a busy machine delays rank 0 now and then
    assert "hands its gradients to Horovod later" in f.details[0]
    assert f.cost_ms == f.numbers["step_gain_ms"] == pytest.approx(delay_ms, rel=0.25)
    assert f.numbers["others_wait_ms_per_step"] == pytest.approx(delay_ms / 2, rel=0.25)


def test_large_samples_get_the_normal_interval_the_bootstrap_would_give() -> None:
    from profiler.analysis.findings import base

    v = np.random.default_rng(3).exponential(2.0, size=base.BOOTSTRAP_MAX + 1)
    mean, lo, hi = base.bootstrap_mean(v)
    assert mean == pytest.approx(float(v.mean()))
    _, blo, bhi = base.bootstrap_mean(v[:base.BOOTSTRAP_MAX])  # the bootstrap's own
    assert hi - lo == pytest.approx(bhi - blo, rel=0.15)
    assert lo < mean < hi


def test_a_cliff_over_most_sizes_is_found_confirmed_and_priced_by_the_run() -> None:
    # six of ten sizes on a slow algorithm (the cliff scenario's shape): the fit
    # alone cannot single them out, but each is slower than the 1 MiB call; the
    # replay confirms them, and the cost is the run's own time above its
    # reference (the log-log line through 64 KiB and 1 MiB), times one call a step
    from profiler.analysis.findings import Context

    k = 1024
    sizes = [16 * k, 32 * k, 64 * k, 128 * k, 160 * k, 192 * k, 224 * k, 256 * k, 500 * k,
             1024 * k]
    slow = {128 * k: 1_000_000, 160 * k: 1_300_000, 192 * k: 1_600_000, 224 * k: 1_900_000,
            256 * k: 2_200_000, 500 * k: 5_800_000}
    fast = {16 * k: 20_000, 32 * k: 30_000, 64 * k: 60_000, 1024 * k: 300_000}
    durs = [slow.get(s) or fast[s] for s in sizes]
    df = training(steps=14, sizes=sizes, call_ns=durs, step_ns=40_000_000, sync=True,
                  control_per_step=0)
    replay = sweep(sizes, iters=9, spikes={s: 20.0 for s in slow})
    a = advise_frame(df, {}, replay=Context(df=replay, meta={}))
    (f,) = _by_key(a, "latency_cliffs")
    assert sorted(f.numbers["confirmed"]) == sorted(slow) and f.significant

    def line(s: int) -> float:
        t = np.log(s / (64 * k)) / np.log(16)
        return min(60_000 * (300_000 / 60_000) ** t, 300_000)

    expected_ms = sum(d - line(s) for s, d in slow.items()) / 1e6
    assert f.cost_ms == pytest.approx(expected_ms, rel=1e-3)
    # the same run replayed without the cliff: nothing confirmed, nothing claimed
    b = advise_frame(df, {}, replay=Context(df=sweep(sizes, iters=9), meta={}))
    (g,) = _by_key(b, "latency_cliffs")
    assert not g.significant and g.numbers["confirmed"] == [] and g.cost_ms is None


def _with_cpu_rows(df, steps: int, step_ns: int, kind: str, wait_ns: int,  # type: ignore[no-untyped-def]
                   every: int = 1):
    """`df` with one schedstat row per step read (one in `every`) and rank for a
    thread of `kind` ("main" or "horovod"): `wait_ns` on the run queue, the rest
    of the step run."""
    import pandas as pd
    from analysis_fixtures import frame

    rows: dict[str, list] = {k: [] for k in df.columns if k != "comm_size"}
    for s in range(0, steps, every):
        for r in range(2):
            row = {k: df[k].iloc[0] for k in rows}
            row.update(t_start_ns=s * step_ns, t_end_ns=(s + 1) * step_ns, rank=r, op="cpu",
                       bytes=step_ns - wait_ns, count=wait_ns, seq=s, step=s, kind="app",
                       thread_kind=kind, tid=(100 if kind == "main" else 200) + r,
                       backend="app")
            for k in rows:
                rows[k].append(row[k])
    return pd.concat([df, frame({**rows, "comm_size": 2})], ignore_index=True)


def test_compute_that_waited_for_a_core_is_the_contentions_not_the_models() -> None:
    # 100 ms steps, nearly all compute, of which the main thread waited 70 ms a
    # step for a core: the contention (a cause, 70 ms) ranks above compute_bound
    # (a symptom), whose figure is the 30 ms of compute that remain
    steps, step_ns, wait_ns = 14, 100_000_000, 70_000_000
    df = training(steps=steps, step_ns=step_ns, call_ns=(2_000, 3_000), tail_ns=50_000,
                  control_per_step=0, sync=True)
    a = advise_frame(_with_cpu_rows(df, steps, step_ns, "main", wait_ns), {})
    keys = [f.key for f in a.significant]
    assert keys.index("cpu_contention") < keys.index("compute_bound"), keys
    (c,) = _by_key(a, "cpu_contention")
    (b,) = _by_key(a, "compute_bound")
    assert c.cost_ms == pytest.approx(wait_ns / 1e6, rel=0.02)
    assert b.cost_ms == pytest.approx(b.numbers["compute_ms"] - c.cost_ms, rel=1e-6)


def test_contention_is_measured_over_the_steps_read_only() -> None:
    # HOROVOD_PROFILE_CPU samples steps: rows in one step of three, a sync row
    # (without CPU figures) in every step.  The per-step table and the figure
    # come from the steps read; the others are not steps without waiting.
    from profiler.analysis.findings import Context
    from profiler.analysis.findings.contention import cpu_waits

    steps, step_ns, wait_ns = 30, 100_000_000, 70_000_000
    df = training(steps=steps, step_ns=step_ns, call_ns=(2_000, 3_000), tail_ns=50_000,
                  control_per_step=0, sync=True)
    df = _with_cpu_rows(df, steps, step_ns, "main", wait_ns, every=3)
    assert (df["op"].astype(str) == "sync").sum() == 2 * steps
    table = cpu_waits(Context(df=df, meta={}))
    assert table.index.tolist() == list(range(0, steps, 3))
    assert np.allclose(table.to_numpy(), wait_ns / 1e6)
    (c,) = _by_key(advise_frame(df, {}), "cpu_contention")
    assert c.cost_ms == pytest.approx(wait_ns / 1e6, rel=0.02) and c.significant
    # the steady steps leave step 0 out: 9 of the 10 read, of 29
    assert c.confidence.startswith("95% interval over 9 of 29 steady steps (those read")


@pytest.mark.parametrize("every", [3, 15])
def test_sampled_steps_of_an_uncontended_job_claim_no_contention(every: int) -> None:
    # the null for the case above: the same sampling, every rank's main thread
    # waiting 0.5% of its step (a thread alone on its core).  One step in 3:
    # the finding is stated and not claimed; one in 15 leaves 2 steps read,
    # too few for an interval: no finding at all.
    steps, step_ns = 30, 100_000_000
    df = training(steps=steps, step_ns=step_ns, call_ns=(2_000, 3_000), tail_ns=50_000,
                  control_per_step=0, sync=True)
    df = _with_cpu_rows(df, steps, step_ns, "main", 500_000, every=every)
    found = _by_key(advise_frame(df, {}), "cpu_contention")
    if every == 15:
        assert found == []
        return
    (c,) = found
    assert not c.significant and c.recommendation == ""
    assert c.headline == "The job's threads seldom wait for a CPU"
    assert c.cost_ms == pytest.approx(0.5, rel=0.02)


@pytest.mark.parametrize("wait_ms, claimed", [(16.0, True), (24.0, False)])
def test_transfers_are_not_the_links_when_horovods_thread_waited_half_of_them(
        wait_ms: float, claimed: bool) -> None:
    # 40 ms of exposed transfer a step; Horovod's thread waited 16 ms a step for
    # a core (the link's) or 24 ms (the link's or the cores': not claimed)
    steps, step_ns = 14, 100_000_000
    df = training(steps=steps, step_ns=step_ns, sizes=(1 << 20,), call_ns=(40_000_000,),
                  tail_ns=50_000, control_per_step=0, sync=True)
    a = advise_frame(_with_cpu_rows(df, steps, step_ns, "horovod", int(wait_ms * 1e6)), {})
    (f,) = _by_key(a, "transfer_bound")
    assert f.cost_ms == pytest.approx(40.0, rel=0.01)
    assert f.significant is claimed, f.details
    assert (f.not_claimed == "") is claimed


@pytest.mark.parametrize("bw_gbps, claimed", [(0.0275, True), (1.0, False)])
def test_a_bench_tells_a_slow_link_from_waiting_cores(bw_gbps: float, claimed: bool) -> None:
    # the unclaimed case above (Horovod's thread waited 24 of the 40 ms a step
    # for a core), now with a bench of the fabric: a link that needs 38 ms for
    # the run's 1 MiB call holds the step whatever the cores did (claimed); a
    # fabric that carries it in 1 ms leaves the transfer to the cores (not)
    from profiler.analysis.findings import Context

    steps, step_ns = 14, 100_000_000
    df = training(steps=steps, step_ns=step_ns, sizes=(1 << 20,), call_ns=(40_000_000,),
                  tail_ns=50_000, control_per_step=0, sync=True)
    df = _with_cpu_rows(df, steps, step_ns, "horovod", 24_000_000)
    bench = Context(df=sweep([1 << 18, 1 << 19, 1 << 20, 1 << 21], bw_gbps=bw_gbps, iters=5),
                    meta={})
    (f,) = _by_key(advise_frame(df, {}, bench=bench), "transfer_bound")
    assert f.significant is claimed, f.details
    assert (f.not_claimed == "") is claimed
    expected = (1 << 20) / bw_gbps / 1e6  # the bench's ms for the run's call, alpha aside
    assert f.numbers["fabric_ms"] == pytest.approx(expected, rel=0.02)
    assert any(("the link holds the step" if claimed else "explains little") in d
               for d in f.details)
