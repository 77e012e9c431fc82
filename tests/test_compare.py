"""Trace comparison: differences against run-to-run noise on synthesised traces with
known effects, Welch's test against an independent computation, and the golden
fused/unfused Horovod traces of tests/data/analysis through `profiler compare`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_fixtures import concat, training
from conftest import profiler_cli
from profiler.analysis import load
from profiler.analysis.compare import bootstrap_diff, compare, welch

from profiler.errors import ProfilerError

GOLDEN = Path(__file__).resolve().parent / "data" / "analysis"


def _jitter(seed: int, n: int, sigma_ns: float, shift_ns: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) + shift_ns for x in np.abs(rng.normal(0, sigma_ns, n))]


def test_real_effect_is_significant_and_noise_is_not() -> None:
    n = 20
    base = training(steps=n, label="a", step_jitter_ns=_jitter(1, n, 300_000))
    slower = training(steps=n, label="b", step_jitter_ns=_jitter(2, n, 300_000, 2_000_000))
    same = training(steps=n, label="c", step_jitter_ns=_jitter(3, n, 300_000))
    t = compare(concat(base, slower, same))
    steps = t.loc[t["metric"] == "step_ms"].set_index("label")
    assert steps.loc["b", "diff"] == pytest.approx(2.0, abs=0.3)
    assert steps.loc["b", "significant"] is True
    assert steps.loc["b", "ci_low"] > 0
    assert steps.loc["b", "p_value"] < 1e-6
    assert steps.loc["c", "significant"] is False
    assert steps.loc["c", "ci_low"] < 0 < steps.loc["c", "ci_high"]
    assert set(steps["baseline"]) == {"a"}
    assert int(steps.loc["b", "n"]) == n - 1  # warm-up step left out


def test_fusion_like_change_in_calls_and_sizes() -> None:
    fused = training(steps=12, label="fused", sizes=(16384,), call_ns=(300_000,))
    unfused = training(steps=12, label="unfused", sizes=(4096, 4096, 8192),
                       call_ns=(100_000, 100_000, 200_000))
    t = compare(concat(fused, unfused), baseline="fused")
    m = {(r.metric, r.bucket): r for r in t.itertuples()}
    calls = m[("data_calls_per_step", "")]
    assert (calls.value, calls.baseline_value) == (3.0, 1.0)
    nbytes = m[("data_bytes_per_step", "")]
    assert nbytes.diff == 0 and nbytes.significant is False
    assert m[("calls_per_step", "4096")].value == 2.0
    assert m[("calls_per_step", "4096")].baseline_value == 0.0
    assert m[("calls_per_step", "16384")].baseline_value == 1.0
    lat = m[("mean_us", "8192")] if ("mean_us", "8192") in m else None
    assert lat is None  # no baseline calls of that size: no latency comparison


def test_welch_matches_an_independent_t_integration() -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0])
    b = np.array([2.0, 3.0, 4.0, 5.0, 6.0])
    t, df, p = welch(a, b)
    va, vb = a.var(ddof=1) / 4, b.var(ddof=1) / 5
    assert t == pytest.approx((2.5 - 4.0) / math.sqrt(va + vb))
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 3 + vb**2 / 4))
    # two-sided tail of Student's t by direct numerical integration of the density
    x = np.linspace(abs(t), 200.0, 2_000_001)
    dens = (math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
            * (1 + x * x / df) ** (-(df + 1) / 2))
    tail = float(np.sum((dens[1:] + dens[:-1]) / 2 * np.diff(x)))
    assert p == pytest.approx(2 * tail, rel=1e-4)
    lo, hi = bootstrap_diff(a, b, lambda s: s.mean(axis=1))
    assert lo < -1.5 < hi


def test_compare_needs_labels() -> None:
    with pytest.raises(ProfilerError):
        compare(training(steps=2))
    with pytest.raises(ProfilerError):
        compare(concat(training(steps=2, label="x"), training(steps=2, label="y")),
                baseline="z")


def test_golden_fused_vs_unfused() -> None:
    expected = json.loads((GOLDEN / "expected.json").read_text())
    df = load(GOLDEN / "fused" / "trace.json", GOLDEN / "unfused" / "trace.json",
              label=["fused", "unfused"])
    t = compare(df, baseline="fused")
    steps = t.loc[t["bucket"] == ""].set_index("metric")
    for metric, want in expected["compare"].items():
        assert steps.loc[metric, "value"] == pytest.approx(want["value"], rel=1e-6), metric
        assert steps.loc[metric, "baseline_value"] == pytest.approx(
            want["baseline_value"], rel=1e-6), metric
    # images/sec is one figure: compare's is summarize's (throughput_summary),
    # and both are within 1% of the ranks' own rates summed (each rank's images
    # over the time from its first steady step's start to its last one's end).
    # Until 12-05 compare averaged each step's own rate (fused: 1,059 img/s
    # where the ranks made 649) and summarize summed the steps' windows,
    # counting the ranks' skew once a step (569).
    from profiler.analysis.throughput import rank_steps, throughput_summary

    thr = throughput_summary(df).set_index("label")
    per_rank = rank_steps(df)
    for lb, col in (("unfused", "value"), ("fused", "baseline_value")):
        rate = float(thr.loc[lb, "images_per_s"])
        assert rate == pytest.approx(expected["images_per_s"][lb], rel=1e-6)
        assert steps.loc["images_per_s", col] == pytest.approx(rate, rel=1e-9)
        mine = per_rank.loc[per_rank["label"].astype(str) == lb]
        mine = mine.loc[mine["step"] >= 1]  # the steady steps: the first is warm-up
        own = sum(float(g["images"].sum()) / (g["t_end_ns"].max() - g["t_start_ns"].min()) * 1e9
                  for _, g in mine.groupby("rank"))
        assert rate == pytest.approx(own, rel=0.01), lb
        # and the step time agrees with it: the ranks' own steps, not the job
        # windows, which the ranks' skew made 13% longer (fused) until 12-05
        step_ms = steps.loc["step_ms", col]
        assert step_ms == pytest.approx(thr.loc[lb, "step_ms_mean"], rel=1e-9)
        assert step_ms / 1e3 * rate == pytest.approx(2 * 16, rel=0.01), lb  # 2 ranks x 16
    # invariants of the workload: same gradient bytes every step, 6 tensors unfused
    assert steps.loc["data_bytes_per_step", "value"] == 21672.0
    assert steps.loc["data_bytes_per_step", "baseline_value"] == 21672.0
    assert steps.loc["data_bytes_per_step", "significant"] is False
    assert steps.loc["data_calls_per_step", "value"] == 6.0
    assert steps.loc["data_calls_per_step", "baseline_value"] < 6.0


def test_verdict_says_images_were_not_recorded() -> None:
    # steps without a batch size count 0 images: "0 vs 0, within the noise"
    # would read as a verdict on throughput
    from profiler.cli.compare import _verdict

    for images, want in ((0, "  images/sec: not recorded"), (32, "  images/sec: ")):
        t = compare(concat(training(steps=12, label="a", images=images),
                           training(steps=12, label="b", images=images)))
        lines = _verdict("b", "a", t.loc[t["label"] == "b"])
        assert lines[1].startswith(want) and lines[2].startswith("  step time (ms): ")
        assert ("not recorded" in lines[1]) == (images == 0)


def test_cli_compare_json_and_table(tmp_path: Path) -> None:
    a, b = str(GOLDEN / "fused" / "trace.json"), str(GOLDEN / "unfused" / "trace.json")
    p = profiler_cli("compare", a, b, "--labels", "fused,unfused", "--format", "json",
                     cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    byte_row = next(r for r in rows if r["metric"] == "data_bytes_per_step")
    assert byte_row["label"] == "unfused" and byte_row["baseline"] == "fused"
    assert byte_row["diff"] == 0 and byte_row["significant"] is False
    p = profiler_cli("compare", a, b, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "data_calls_per_step" in p.stdout and "95% CI" in p.stdout
    # the verdict first: images/sec and step time with their intervals
    lines = p.stdout.splitlines()
    assert lines[0] == "unfused vs fused:"
    assert lines[1].startswith("  images/sec: ") and lines[2].startswith("  step time (ms): ")
    assert "e-0" not in p.stdout and "e+" not in p.stdout
    full = profiler_cli("compare", a, b, "--all", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    assert full.stdout.startswith(p.stdout.split("(--all")[0].splitlines()[0])
    assert "exposed_ms_per_step" in full.stdout and len(full.stdout) > len(p.stdout)


@pytest.mark.parametrize("args", [["only-one.json"], ["a.json", "b.json"],
                                  ["{a}", "{b}", "--labels", "x"],
                                  ["{a}", "{b}", "--baseline", "nope"]])
def test_cli_compare_bad_input(tmp_path: Path, args: list[str]) -> None:
    a, b = str(GOLDEN / "fused" / "trace.json"), str(GOLDEN / "unfused" / "trace.json")
    argv = [x.format(a=a, b=b) for x in args]
    p = profiler_cli("compare", *argv, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("profiler: error: ")
    assert len(p.stderr.strip().splitlines()) == 1


def _edge_pair(share_a: float, share_b: float, seed: int = 5) -> pd.DataFrame:
    """Two jobs of test_breakdown's cycle edge, 200 steps each: in a, share_a
    of the steps miss the cycle under way and wait one more (1 ms); in b,
    share_b; the same 20 us of noise on every step."""
    from test_breakdown import _edge_job

    rng = np.random.default_rng(seed)
    u = rng.random(200)
    noise = rng.normal(0, 0.02, 200).clip(-0.15, 0.15)
    out = []
    for label, share in (("a", share_a), ("b", share_b)):
        if share < 0:  # the null: the wait spread evenly over a cycle
            extra = np.random.default_rng(seed + 1).uniform(0, 1.0, 200)
        else:
            extra = np.where(u < share, 1.0, 0.0) + noise
        df, _ = _edge_job(extra)
        out.append(df.assign(label=label))
    both = pd.concat(out, ignore_index=True)
    return both.assign(label=both["label"].astype("category"))


def test_the_share_of_steps_a_cycle_late_is_compared() -> None:
    """After halving the cycle, a job's steps wait a second cycle less often:
    compare gives each trace's exact share (steady steps) and calls the
    difference; the same share in both is within the noise; a job without
    the second peak in either trace gets no row (a share of 'late' steps in
    one spread of step times would mean nothing)."""
    t = compare(_edge_pair(0.1, 0.3), cycles={"a": 1.0, "b": 1.0})
    (r,) = t.loc[t["metric"] == "second_cycle_share"].itertuples()
    u = np.random.default_rng(5).random(200)[1:]  # the first step is the warm-up
    assert (r.label, r.baseline, r.n, r.n_baseline) == ("b", "a", 199, 199)
    assert r.value == (u < 0.3).mean() and r.baseline_value == (u < 0.1).mean()
    assert r.significant is True and r.ci_low > 0
    from profiler.cli.compare import _verdict

    lines = _verdict("b", "a", t.loc[t["label"] == "b"])
    assert lines[3] == (f"  steps a whole Horovod cycle late: {r.value:.0%} vs "
                        f"{r.baseline_value:.0%} (+{round(r.diff * 100)} points, 95% CI "
                        f"[+{round(r.ci_low * 100)}, +{round(r.ci_high * 100)}]; each on its "
                        "own HOROVOD_CYCLE_TIME): significant"), lines
    assert not any("second_cycle_share" in ln for ln in lines)  # not twice

    same = compare(_edge_pair(0.3, 0.3), cycles={"a": 1.0, "b": 1.0})
    (r,) = same.loc[same["metric"] == "second_cycle_share"].itertuples()
    assert r.diff == 0 and r.significant is False
    for null in (compare(_edge_pair(-1, -1), cycles={"a": 1.0, "b": 1.0}),
                 compare(_edge_pair(0.1, 0.3))):  # no cycle times given
        assert not (null["metric"] == "second_cycle_share").any()
