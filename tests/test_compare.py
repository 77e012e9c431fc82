"""Trace comparison: differences against run-to-run noise on synthesised traces with
known effects (one run a side: within-run noise only, never "significant"; several
runs a side: tests over the runs' values), Welch's test against an independent
computation, and the golden fused/unfused Horovod traces of tests/data/analysis
through `profiler compare`."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_fixtures import concat, training
from conftest import profiler_cli

from profiler.analysis import load
from profiler.analysis.compare import compare, run_test, welch
from profiler.analysis.stats import bootstrap_interval
from profiler.errors import ProfilerError

GOLDEN = Path(__file__).resolve().parent / "data" / "analysis"


def _jitter(seed: int, n: int, sigma_ns: float, shift_ns: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) + shift_ns for x in np.abs(rng.normal(0, sigma_ns, n))]


def test_one_run_a_side_measures_within_run_noise_and_calls_nothing_significant() -> None:
    """One run a side: a difference far outside the steps' spread gets its
    within-run interval and p-value, but no verdict (None; the runs' own drift
    is unknown); one inside it is not significant (False) either way."""
    n = 20
    base = training(steps=n, label="a", step_jitter_ns=_jitter(1, n, 300_000))
    slower = training(steps=n, label="b", step_jitter_ns=_jitter(2, n, 300_000, 2_000_000))
    same = training(steps=n, label="c", step_jitter_ns=_jitter(3, n, 300_000))
    t = compare(concat(base, slower, same))
    steps = t.loc[t["metric"] == "step_ms"].set_index("label")
    assert steps.loc["b", "diff"] == pytest.approx(2.0, abs=0.3)
    assert steps.loc["b", "significant"] is None
    assert steps.loc["b", "reason"] == "run-to-run variation unknown (one run per side)"
    assert steps.loc["b", "test"] == "within-run"
    assert steps.loc["b", "ci_low"] > 0
    assert steps.loc["b", "p_value"] < 1e-6
    assert steps.loc["c", "significant"] is False
    assert steps.loc["c", "ci_low"] < 0 < steps.loc["c", "ci_high"]
    assert set(steps["baseline"]) == {"a"}
    assert int(steps.loc["b", "n"]) == n - 1  # warm-up step left out
    assert (steps["runs"] == 1).all() and (steps["runs_baseline"] == 1).all()
    assert not (t["significant"] == True).any()  # noqa: E712 - nothing, on any metric


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
    lo, hi = bootstrap_interval((a, b), lambda x, y, axis=-1: x.mean(axis) - y.mean(axis))
    assert lo < -1.5 < hi
    # scipy's Welch is the one compare uses; constant samples: p 0 or 1, not NaN
    assert welch(np.ones(3), np.ones(4))[2] == 1.0
    assert welch(np.ones(3), np.zeros(4))[2] == 0.0


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
                                  ["{a}", "{b}", "--baseline", "nope"],
                                  ["{a}", "--vs"], ["{a}", "--vs", "missing.json"],
                                  ["{a}", "{b}", "--paired"],
                                  ["{a}", "{a}", "--vs", "{b}", "--paired"],
                                  ["{a}", "--vs", "{b}", "--labels", "x,y,z"],
                                  ["{a}", "--vs", "{b}", "{b}", "--labels", "x#1,x"]])
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
    # one run a side: beyond the within-run noise, no verdict
    assert r.significant is None and r.ci_low > 0 and r.test == "within-run"
    from profiler.cli.compare import _verdict

    lines = _verdict("b", "a", t.loc[t["label"] == "b"])
    assert lines[3] == (f"  steps a whole Horovod cycle late: {r.value:.0%} vs "
                        f"{r.baseline_value:.0%} (+{round(r.diff * 100)} points, within-run "
                        f"95% CI [+{round(r.ci_low * 100)}, +{round(r.ci_high * 100)}]; each "
                        "on its own HOROVOD_CYCLE_TIME): no verdict, run-to-run variation "
                        "unknown (one run per side)"), lines
    assert not any("second_cycle_share" in ln for ln in lines)  # not twice

    same = compare(_edge_pair(0.3, 0.3), cycles={"a": 1.0, "b": 1.0})
    (r,) = same.loc[same["metric"] == "second_cycle_share"].itertuples()
    assert r.diff == 0 and r.significant is False
    for null in (compare(_edge_pair(-1, -1), cycles={"a": 1.0, "b": 1.0}),
                 compare(_edge_pair(0.1, 0.3))):  # no cycle times given
        assert not (null["metric"] == "second_cycle_share").any()


# ------------------------------------------------------- repeated runs of each side


def _runs(side: str, offsets_us: list[float], *, shift_us: float = 0.0, seed: int = 0,
          steps: int = 20, noise_us: float = 100.0) -> list[pd.DataFrame]:
    """One side's runs, labelled side#1, side#2, ...: run i's steps take
    10 ms + shift_us + offsets_us[i] (the run's drift) plus |N(0, noise_us)| each
    (the within-run noise)."""
    out = []
    for i, off in enumerate(offsets_us):
        step_ns = 10_000_000 + int((shift_us + off) * 1e3)
        out.append(training(steps=steps, label=f"{side}#{i + 1}", step_ns=step_ns,
                            step_jitter_ns=_jitter(seed + i, steps, noise_us * 1e3)))
    return out


def _sides(a: list[pd.DataFrame], b: list[pd.DataFrame]) -> dict[str, list[str]]:
    return {"a": [f"a#{i + 1}" for i in range(len(a))],
            "b": [f"b#{i + 1}" for i in range(len(b))]}


def _step_means(frames: list[pd.DataFrame]) -> list[float]:
    """Each run's mean steady step time (ms), computed apart from compare."""
    out = []
    for f in frames:
        st = f.loc[(f["op"] == "step") & (f["rank"] == 0) & (f["step"] >= 1)]
        out.append(float((st["t_end_ns"] - st["t_start_ns"]).mean()) / 1e6)
    return out


def test_runs_that_differ_beyond_their_spread_are_significant() -> None:
    """Three runs a side, each run drifting by a few hundred us, b 2 ms slower
    in every run: Welch's t over the runs' values calls it, for step time and
    images/sec; a side's value is the mean of its runs'."""
    a = _runs("a", [300, -200, 100], seed=10)
    b = _runs("b", [-100, 250, -150], shift_us=2000, seed=20)
    t = compare(concat(*a, *b), runs=_sides(a, b))
    rows = t.loc[t["bucket"] == ""].set_index("metric")
    for metric in ("step_ms", "images_per_s"):
        r = rows.loc[metric]
        assert r["significant"] is True, (metric, r.to_dict())
        assert r["test"] == "welch-runs" and r["p_value"] < 0.01
        assert (r["runs"], r["runs_baseline"]) == (3, 3)
        assert r["reason"] == "the runs differ beyond their spread"
    r = rows.loc["step_ms"]
    assert r["value"] == pytest.approx(np.mean(_step_means(b)), rel=1e-9)
    assert r["baseline_value"] == pytest.approx(np.mean(_step_means(a)), rel=1e-9)
    assert 0 < r["ci_low"] < 2.0 < r["ci_high"] < 4.0
    assert rows.loc["images_per_s", "ci_high"] < 0  # slower steps: fewer images/sec
    assert int(r["n"]) == 3 * 19  # the steady steps of the three runs
    from profiler.cli.compare import _verdict

    lines = _verdict("b", "a", t.loc[t["label"] == "b"])
    assert lines[1].startswith("  images/sec: ") and lines[1].endswith(": significant")
    assert "p < 0.001" in lines[2] or "p = " in lines[2]
    assert lines[-1].startswith("  test: Welch's t over the runs' values (3 runs of b, 3 of a)")


def test_drift_between_runs_larger_than_the_steps_noise_is_not_significant() -> None:
    """The same rate on both sides, each run drifting by up to 1.5 ms while its
    steps vary by ~0.1 ms: one run against one is far outside the within-run
    noise (the trap of one run a side), but over three runs a side the
    difference is within their spread."""
    a = _runs("a", [1500, -1000, 200], seed=30)
    b = _runs("b", [-800, 1200, 600], seed=40)
    df = concat(*a, *b)
    t = compare(df, runs=_sides(a, b))
    rows = t.loc[t["bucket"] == ""].set_index("metric")
    for metric in ("step_ms", "images_per_s"):
        r = rows.loc[metric]
        assert r["significant"] is False, (metric, r.to_dict())
        assert r["test"] == "welch-runs" and r["p_value"] > 0.05
        assert r["ci_low"] < 0 < r["ci_high"]
        assert r["reason"] == "within the run-to-run spread"
    assert not (t["significant"] == True).any()  # noqa: E712 - none of the metrics
    # the control: the first run of each side alone is far outside the steps' noise
    one = compare(df, runs={"a": ["a#1"], "b": ["b#1"]})
    r1 = one.loc[one["metric"] == "step_ms"].iloc[0]
    assert r1["ci_high"] < 0 and r1["significant"] is None
    assert r1["reason"] == "run-to-run variation unknown (one run per side)"


def test_alternating_runs_are_paired() -> None:
    """Runs alternated A B A B: each pair shares the machine's drift (up to 3 ms)
    and b is 0.3 ms slower in every pair.  Unpaired, the drift hides it; paired
    (the test on the pairs' differences), it is significant, and the table and
    the verdict say which test was used."""
    drift = [0, 3000, -2000, 1000]
    a = _runs("a", drift, seed=50)
    b = _runs("b", drift, shift_us=300, seed=60)
    df = concat(*a, *b)
    welch_t = compare(df, runs=_sides(a, b))
    paired_t = compare(df, runs=_sides(a, b), paired=True)
    w = welch_t.loc[welch_t["metric"] == "step_ms"].iloc[0]
    p = paired_t.loc[paired_t["metric"] == "step_ms"].iloc[0]
    assert w["test"] == "welch-runs" and w["significant"] is False
    assert p["test"] == "paired-runs" and p["significant"] is True
    assert p["ci_low"] > 0.1 and p["ci_high"] < 0.5
    assert p["value"] == pytest.approx(w["value"]) and p["diff"] == pytest.approx(0.3, abs=0.1)
    from profiler.cli.compare import _verdict

    lines = _verdict("b", "a", paired_t.loc[paired_t["label"] == "b"])
    assert lines[-1].startswith("  test: paired t over the alternating runs' differences")
    with pytest.raises(ProfilerError, match="as many runs"):
        compare(concat(*a, *b[:3]), runs={"a": [f"a#{i}" for i in range(1, 5)],
                                          "b": ["b#1", "b#2", "b#3"]}, paired=True)


def test_one_run_on_a_side_gives_no_verdict() -> None:
    a = _runs("a", [0, 100, -100], seed=70)
    b = _runs("b", [0], shift_us=2000, seed=80)
    t = compare(concat(*a, *b), runs=_sides(a, b))
    r = t.loc[t["metric"] == "step_ms"].iloc[0]
    assert r["significant"] is None and r["test"] == "within-run"
    assert r["reason"] == "run-to-run variation unknown (fewer than 2 runs on a side)"
    assert (r["runs"], r["runs_baseline"]) == (1, 3)


def test_run_test_intervals() -> None:
    """run_test's interval is the t interval of the difference a - b: Welch's
    with Welch-Satterthwaite degrees of freedom, paired on the differences."""
    from scipy import stats

    a, b = np.array([10.0, 12.0, 11.0]), np.array([8.0, 8.5, 9.5, 9.0])
    r = run_test(a, b)
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 4
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    d = a.mean() - b.mean()
    assert (r.ci_low, r.ci_high) == pytest.approx((d - half, d + half), rel=1e-9)
    assert r.p_value == pytest.approx(welch(a, b)[2]) and r.significant
    x, y = np.array([1.0, 5.0, 3.0]), np.array([0.5, 4.6, 2.4])
    r = run_test(x, y, paired=True)
    dd = x - y
    half = stats.t.ppf(0.975, 2) * dd.std(ddof=1) / math.sqrt(3)
    assert (r.ci_low, r.ci_high) == pytest.approx((dd.mean() - half, dd.mean() + half))
    assert r.test == "paired-runs" and run_test(a[:1], b) is None
    same = run_test(np.array([2.0, 2.0]), np.array([2.0, 2.0]))
    assert same is not None and same.significant is False and same.p_value == 1.0


def _copies(tmp: Path, name: str, n: int) -> list[str]:
    """n copies of a golden trace's directory, name-1 ... name-n."""
    out = []
    for i in range(1, n + 1):
        d = tmp / f"{name}-{i}"
        shutil.copytree(GOLDEN / name, d)
        out.append(str(d / "trace.json"))
    return out


def test_cli_one_run_a_side_says_run_to_run_variation_is_unknown(tmp_path: Path) -> None:
    a, b = str(GOLDEN / "fused" / "trace.json"), str(GOLDEN / "unfused" / "trace.json")
    p = profiler_cli("compare", a, b, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "run-to-run variation unknown (one run per side)" in p.stdout
    assert not [ln for ln in p.stdout.splitlines() if ln.endswith(": significant")], p.stdout
    assert "one run per side: the intervals measure the noise within a run only" in p.stdout
    j = profiler_cli("compare", a, b, "--format", "json", cwd=tmp_path)
    rows = json.loads(j.stdout)
    assert rows and not any(r["significant"] is True for r in rows)
    assert {r["test"] for r in rows} <= {"within-run", ""}
    assert all(r["runs"] == 1 and r["runs_baseline"] == 1 for r in rows)


def test_cli_runs_of_each_side(tmp_path: Path) -> None:
    """`A1 A2 --vs B1 B2`: each side's runs; labels default to what the side's
    directory names share; --paired switches the test."""
    fused, unfused = _copies(tmp_path, "fused", 2), _copies(tmp_path, "unfused", 2)
    p = profiler_cli("compare", *fused, "--vs", *unfused, "--format", "json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert {(r["label"], r["baseline"]) for r in rows} == {("unfused", "fused")}
    calls = next(r for r in rows if r["metric"] == "data_calls_per_step")
    assert (calls["runs"], calls["runs_baseline"], calls["test"]) == (2, 2, "welch-runs")
    assert calls["value"] == 6.0 and calls["significant"] is True  # copies: no spread
    t = profiler_cli("compare", *fused, "--vs", *unfused, "--labels", "on,off", "--paired",
                     cwd=tmp_path)
    assert t.returncode == 0, t.stderr
    lines = t.stdout.splitlines()
    assert lines[0] == "off vs on:" and lines[1].startswith("  images/sec: ")
    assert any(ln.startswith("  test: paired t over the alternating runs' differences "
                             "(2 runs of off, 2 of on)") for ln in lines), t.stdout
