"""The step breakdown (analysis.breakdown) on traces whose parts are known to the
nanosecond, and the late-rank test against chance (analysis.stats) on
jobs where no rank is late and where one is."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from profiler.analysis.breakdown import (
    PARTS,
    breakdown_summary,
    caused_wait,
    counterfactual_gain,
    last_ranks,
    rank_breakdown,
    shifted_gain,
)
from profiler.analysis.findings import advise_frame
from profiler.analysis.stats import binom_sf, effective_n, most_often
from profiler.units import fmt_ms

MS = 1_000_000


def _row(**kw: object) -> dict[str, object]:
    base = {"backend": "app", "kind": "app", "bytes": 0, "count": 0, "comm": 0,
            "comm_size": 2, "thread_kind": "main", "tid": 100, "step": -1, "device": False,
            "flags": 0}
    base.update(kw)
    base["dur_ns"] = int(base["t_end_ns"]) - int(base["t_start_ns"])  # type: ignore[call-overload]
    return base


def horovod_job(arrive_ms: list[list[float]], *, step_ms: float = 100.0,
                cycle_ms: float | list[float] = 2.0,
                xfer_ms: float = 3.0, done_ms: float = 1.0, hook_ns: float = 0.0,
                negotiation_wait_ms: float = 0.0
                ) -> tuple[pd.DataFrame, dict[str, object]]:
    """A 2+ rank Horovod-like trace: in step s, rank r hands its last tensor to
    Horovod at arrive_ms[s][r] after the step's start and enters synchronize
    0.5 ms later; the last rank's arrival A is followed by cycle_ms of Horovod's
    cycle (a 0.2 ms control call in it), one data call of xfer_ms, and done_ms
    of completion, after which every rank leaves synchronize and the step ends
    1 ms later.  Every step starts when the previous one ended on that rank.
    cycle_ms may be a list: the cycle's wait in each step.  negotiation_wait_ms
    lengthens the control call by that much: the wait for the other ranks'
    cycles, inside the cycle's wait."""
    rows: list[dict[str, object]] = []
    n = len(arrive_ms[0])
    start = [0] * n
    seq = 0
    for s, arr in enumerate(arrive_ms):
        a_ns = [start[r] + int(arr[r] * MS) for r in range(n)]
        A = max(a_ns)
        cyc = cycle_ms[s] if isinstance(cycle_ms, list) else cycle_ms
        call0 = A + int(cyc * MS)
        call1 = call0 + int(xfer_ms * MS)
        e = call1 + int(done_ms * MS)
        for r in range(n):
            rows.append(_row(rank=r, op="tensor", t_start_ns=a_ns[r] - 10_000,
                             t_end_ns=a_ns[r], seq=0, bytes=4096, count=1024))
            rows.append(_row(rank=r, op="sync", t_start_ns=a_ns[r] + MS // 2, t_end_ns=e,
                             seq=s))
            c0 = A + int(0.5 * MS)
            rows.append(_row(rank=r, op="allreduce", backend="mpi", kind="control",
                             t_start_ns=c0, t_end_ns=c0 + MS // 5
                             + int(negotiation_wait_ms * MS), seq=seq, bytes=8,
                             thread_kind="horovod", tid=200, comm=1))
            rows.append(_row(rank=r, op="allreduce", backend="mpi", kind="data",
                             t_start_ns=call0, t_end_ns=call1, seq=seq + 1, bytes=1 << 20,
                             thread_kind="horovod", tid=200, comm=1))
            end = e + MS
            rows.append(_row(rank=r, op="step", t_start_ns=start[r], t_end_ns=end, seq=s,
                             step=s, count=32))
            start[r] = end
        seq += 2
    df = pd.DataFrame(rows).sort_values(["rank", "t_start_ns"]).reset_index(drop=True)
    meta: dict[str, object] = {}
    if hook_ns:
        meta["self_cost"] = {"ranks": [{"rank": r, "python_hook_ns": hook_ns * len(arrive_ms)}
                                       for r in range(n)]}
    return df, meta


def test_parts_are_exact_and_sum_to_the_step() -> None:
    # rank 1 arrives 30 ms after rank 0 in every step
    df, meta = horovod_job([[50.0, 80.0]] * 5, hook_ns=0.25 * MS)
    bd = rank_breakdown(df, meta)
    assert len(bd) == 10 and (bd["source"] == "sync").all()
    parts = bd[[f"{p}_ms" for p in PARTS]].sum(axis=1)
    assert np.allclose(parts, bd["wall_ms"], rtol=0, atol=1e-9)
    r0 = bd.loc[bd["rank"] == 0].iloc[-1]
    r1 = bd.loc[bd["rank"] == 1].iloc[-1]
    # rank 0 entered synchronize 0.5 ms after its last tensor and waits for rank 1's
    assert r0["wait_ranks_ms"] == pytest.approx(29.5)
    assert r1["wait_ranks_ms"] == 0.0  # it was last
    for r in (r0, r1):
        assert r["transfer_ms"] == pytest.approx(3.0)
        assert r["completion_ms"] == pytest.approx(1.0)
        assert r["negotiation_ms"] == pytest.approx(0.2)
        assert r["profiler_ms"] == pytest.approx(0.25)
        assert r["unexplained_ms"] == pytest.approx(0.0, abs=1e-9)
    # after its own arrival rank 1 waits 0.5 ms less of the cycle (it entered late)
    assert r0["horovod_ms"] == pytest.approx(2.0 + 1.0)
    assert r1["horovod_ms"] == pytest.approx(1.5 + 1.0)
    # compute: everything outside synchronize, less the profiler's hooks
    assert r0["compute_ms"] == pytest.approx(r0["wall_ms"] - (29.5 + 3.0 + 3.0) - 0.25)
    s = breakdown_summary(bd).set_index("part")
    assert s["ms"].sum() == pytest.approx(bd.groupby("step")["wall_ms"].mean().mean())
    assert s.loc["wait_ranks", "ms"] == pytest.approx(29.5 / 2)


def test_last_rank_and_the_waiting_it_alone_causes() -> None:
    # 3 ranks: rank 2 last by 10 ms over rank 1, which is 5 ms after rank 0
    df, meta = horovod_job([[40.0, 45.0, 55.0]] * 6)
    bd = rank_breakdown(df, meta)
    lr = last_ranks(bd)
    assert (lr["last_rank"] == 2).all() and lr["lead_ms"].to_numpy() == pytest.approx(10.0)
    # because of rank 2 alone: rank 0 waited 10 ms of its 14.5, rank 1 all its 9.5
    # (it entered synchronize 0.5 ms after its last tensor); averaged over 3 ranks
    assert caused_wait(bd, 2) == pytest.approx(np.full(6, (10.0 + 9.5) / 3))
    assert caused_wait(bd, 0) == pytest.approx(np.zeros(6))


def test_binomial_tail_and_effective_trials() -> None:
    exact = sum(math.comb(50, k) for k in range(35, 51)) / 2 ** 50
    assert binom_sf(35, 50, 0.5) == pytest.approx(exact, rel=1e-9)
    assert binom_sf(0, 10, 0.3) == 1.0 and binom_sf(11, 10, 0.3) == 0.0
    assert effective_n(np.array([0, 1] * 20)) == 40  # anti-correlated: no shrink
    sticky = np.array([0] * 20 + [1] * 20)
    assert effective_n(sticky) < 3  # two runs are two observations, not forty


def _late_counts(runs: int, steps: int, late_ms: float, rng: np.random.Generator,
                 jitter_ms: float = 20.0, ranks: int = 2) -> tuple[int, int]:
    """(runs where advise named a late rank, runs where it named rank 1)."""
    named = right = 0
    for _ in range(runs):
        arr = rng.uniform(30.0, 30.0 + jitter_ms, size=(steps, ranks))
        arr[:, 1] += late_ms
        df, meta = horovod_job(arr.tolist())
        a = advise_frame(df, meta)
        late = [f for f in a.findings if f.key == "late_ranks" and f.significant]
        named += bool(late)
        right += bool(late) and late[0].numbers["rank"] == 1
    return named, right


def test_no_rank_is_named_where_chance_explains_the_order() -> None:
    """Symmetric jitter, no late rank: over 60 jobs of 40 steps, a rank is named
    at most at the test's false-alarm rate (1%; 2 of 60 allowed for the
    Bonferroni bound's slack), and the waiting is still reported, unblamed."""
    rng = np.random.default_rng(11)
    named, _ = _late_counts(60, 40, 0.0, rng)
    assert named <= 2
    arr = rng.uniform(30.0, 50.0, size=(40, 2))
    a = advise_frame(*horovod_job(arr.tolist()))
    (w,) = [f for f in a.findings if f.key == "rank_waiting"]
    assert w.significant and "no rank is consistently last" in w.headline
    assert "chance alone gives 50%" in w.details[0]
    # its cost is the breakdown's wait part: nothing else is claimed for it
    assert w.cost_ms == pytest.approx(a.breakdown.set_index("part").loc["wait_ranks", "ms"])


def test_a_late_rank_is_named_with_the_waiting_it_causes() -> None:
    rng = np.random.default_rng(12)
    named, right = _late_counts(20, 40, 15.0, rng)
    assert named == right == 20
    arr = rng.uniform(30.0, 40.0, size=(40, 2))
    arr[:, 1] += 25.0
    a = advise_frame(*horovod_job(arr.tolist()))
    (f,) = [f for f in a.findings if f.key == "late_ranks"]
    assert f.significant and f.part == "wait_ranks" and f.numbers["rank"] == 1
    # rank 0 waits 25 ms + the jitter difference; averaged over the 2 ranks, ~12.5 ms
    wait = f.numbers["others_wait_ms_per_step"]
    assert wait == pytest.approx(25.0 / 2, rel=0.15)
    assert wait <= a.breakdown.set_index("part").loc["wait_ranks", "ms"] + 1e-9
    # the headline: the step without the 25 ms excess, the 0-10 ms jitter kept
    assert f.numbers["excess_ms"] == pytest.approx(25.0, rel=0.1)
    assert f.cost_ms == f.numbers["step_gain_ms"]
    assert f.cost_ms == pytest.approx(25.0 - 10.0 / 6, rel=0.1)


def _step_ms(df: pd.DataFrame) -> float:
    st = df.loc[df["op"] == "step"]
    return float(((st["t_end_ns"] - st["t_start_ns"]) / 1e6).groupby(st["step"]).mean().mean())


@pytest.mark.parametrize("seed", range(6))
def test_a_late_rank_costs_what_its_twin_says(seed: int) -> None:
    """Every rank's arrival jitters by 0-40 ms and rank 1 is 25 ms later besides;
    its twin is the same job without the 25 ms.  The headline cost is within
    15% of the twin's difference in step time; the rank's whole lead, which
    also removes its share of the common jitter, overshoots it at 2 ranks."""
    rng = np.random.default_rng(100 + seed)
    n = 2 + seed % 3
    twin = rng.uniform(20.0, 60.0, size=(60, n))
    late = twin.copy()
    late[:, 1] += 25.0
    df, meta = horovod_job(late.tolist())
    truth = _step_ms(df) - _step_ms(horovod_job(twin.tolist())[0])
    (f,) = [f for f in advise_frame(df, meta).findings if f.key == "late_ranks"]
    assert f.significant and f.numbers["rank"] == 1
    assert f.cost_ms == pytest.approx(truth, rel=0.15)
    lo, hi = f.cost_interval_ms
    assert lo <= truth <= hi or abs(f.cost_ms - truth) < 0.05 * truth
    if n == 2:  # the old figures: the others' waiting too low, the whole lead too high
        assert f.numbers["others_wait_ms_per_step"] < 0.8 * truth
        assert f.numbers["whole_lead_ms_per_step"] > 1.2 * truth


def test_a_rank_with_no_excess_would_gain_nothing() -> None:
    """Symmetric jitter: the counterfactual moves nothing, whichever rank is asked."""
    arr = np.random.default_rng(7).uniform(20.0, 60.0, size=(400, 3))
    bd = rank_breakdown(horovod_job(arr.tolist())[0])
    for rank in range(3):
        gain, excess = counterfactual_gain(bd, rank)
        assert len(gain) == 400 and excess < 3.0
        assert float(gain.mean()) < 1.5


def test_a_rank_late_for_a_stretch_is_not_a_consistently_late_rank() -> None:
    """Rank 1 is late in the first 28 of 40 steps (a neighbour's job, then
    quiet): 70% of steps, but in two runs of steps, not 40 independent ones."""
    arr = np.full((40, 2), 30.0)
    arr[:28, 1] += 10.0
    arr[28:, 0] += 10.0
    test = most_often(np.where(arr[:, 1] > arr[:, 0], 1, 0), 2)
    assert test is not None and test.share == pytest.approx(0.7)
    assert not test.significant and test.n_eff < 5


def _edge_job(extra_ms: np.ndarray) -> tuple[pd.DataFrame, dict[str, object]]:
    """Steps whose gradients are ready 0.9 ms in, on both ranks, and then wait
    0.7 ms plus extra_ms[s] for Horovod's cycle (1 ms, the default): in
    synchronize (entered 0.5 ms after the last gradient) 0.25 ms plus
    extra_ms[s] for Horovod, the completion's 0.05 ms included; a step of
    2.7 ms plus extra_ms[s]."""
    n = len(extra_ms)
    return horovod_job([[0.9, 0.9]] * n, cycle_ms=[0.7 + float(x) for x in extra_ms],
                       xfer_ms=0.05, done_ms=0.05)


def _edge(extra_ms: np.ndarray) -> list:
    a = advise_frame(*_edge_job(extra_ms))
    return [f for f in a.findings if f.key == "second_cycles"]


def test_steps_a_whole_cycle_apart_are_claimed() -> None:
    # 30% of the steps miss the cycle under way and wait one more (1 ms), with
    # 20 us of noise on every step: the peak a cycle above the fast steps
    rng = np.random.default_rng(5)
    missed = rng.random(200) < 0.3
    extra = np.where(missed, 1.0, 0.0) + rng.normal(0, 0.02, 200).clip(-0.15, 0.15)
    (f,) = _edge(extra)
    assert f.significant and not f.not_claimed and f.cost_label == "explains"
    n = f.numbers["steps"]
    assert n == 199  # the steady steps: the first is left out
    missed, extra = missed[-n:], extra[-n:]
    assert f.numbers["share"] == missed.mean()  # every missed step, no other
    assert f.numbers["trough"] == 0 and f.numbers["peak"] == missed.sum()
    # drawn from the wait for Horovod: each missed step's extra wait, over all steps
    fast_hv = np.median(0.25 + extra[~missed])
    want = np.where(missed, np.maximum(0.25 + extra - fast_hv, 0), 0).mean()
    assert f.cost_ms == pytest.approx(want, abs=1e-6)
    assert f.numbers["fast_ms"] == pytest.approx(2.7 + np.median(extra[~missed]), abs=1e-6)
    # no CPU rows: nothing says the cores are short, so the shorter cycle is offered
    assert "HOROVOD_CYCLE_TIME=0.5" in f.recommendation
    assert "compare" in f.check


@pytest.mark.parametrize("null", ["uniform", "two cycles", "exponential", "half-cycle",
                                  "few steps"])
def test_one_spread_of_step_times_is_not_a_second_cycle(null: str) -> None:
    # the nulls: gradients reaching Horovod at random moments of its cycle
    # (the wait spread evenly over it, or over two), noise falling off above
    # the fast steps, two peaks half a cycle apart (not Horovod's cycle), and
    # too few steps
    rng = np.random.default_rng(11)
    extra = {"uniform": rng.uniform(0, 1.0, 300),
             "two cycles": rng.uniform(0, 2.0, 300),
             "exponential": rng.exponential(0.3, 300),
             "half-cycle": np.where(rng.random(300) < 0.3, 0.5, 0.0) + rng.normal(0, 0.02, 300),
             "few steps": np.where(np.arange(20) % 3 == 0, 1.0, 0.0)}[null]
    found = _edge(extra)
    assert all(not f.significant and f.cost_ms is None for f in found)
    if null == "two cycles":  # a fifth of the steps sit a cycle up: said, and why not claimed
        (f,) = found
        assert f.not_claimed and f.numbers["p_value"] >= 0.01 and f.numbers["peak"] >= 30
    if null in ("uniform", "half-cycle", "few steps"):
        assert found == []


def test_a_remedy_at_the_cycle_edge_says_the_step_moves_by_whole_cycles() -> None:
    """At the edge (second_cycles claimed), each claimed remedy says that its
    saving shows as steps that stop missing the cycle; not beside a finding
    that recommends nothing, and not when the edge failed its test."""
    from profiler.analysis.findings import Finding, _at_the_cycle_edge

    def found(edge_cost: float | None) -> list[Finding]:
        return [
            Finding(key="second_cycles", headline="", cost_ms=edge_cost,
                    significant=edge_cost is not None,
                    numbers={"share": 0.28, "cycle_time_ms": 1.0}),
            Finding(key="fusion", headline="", cost_ms=0.06, significant=True,
                    recommendation="HOROVOD_FUSION_THRESHOLD=0"),
            Finding(key="late_ranks", headline="", cost_ms=0.5, significant=False,
                    recommendation="look at rank 1"),
            Finding(key="horovod_wait", headline="", cost_ms=None, significant=False)]

    fs = found(0.3)
    _at_the_cycle_edge(fs)
    assert [len(f.details) for f in fs] == [0, 1, 0, 0]
    assert fs[1].details[0].startswith(
        "this job's steps sit at Horovod's cycle edge (28% wait a whole 1 ms cycle more")
    assert "second_cycle_share" in fs[1].details[0]
    fs = found(None)  # the edge's test failed: a spread, not whole cycles
    _at_the_cycle_edge(fs)
    assert [len(f.details) for f in fs] == [0, 0, 0, 0]


def test_one_step_time_for_the_header_and_the_breakdown_on_skewed_steps() -> None:
    """Steps of 30-40 ms with one in five 4x longer: mean and median differ by a
    fifth.  The header's step time is the mean, the breakdown's parts sum to it,
    and step time x images/sec gives the images of a step (64 here: 2 ranks of
    32)."""
    from profiler.analysis.throughput import steady_steps, step_table

    rng = np.random.default_rng(5)
    arr = rng.uniform(30.0, 40.0, size=(40, 2))
    arr[::5] *= 4.0
    df, meta = horovod_job(arr.tolist())
    a = advise_frame(df, meta)
    walls = steady_steps(step_table(df))["wall_ms"].to_numpy(dtype=float)
    assert abs(np.median(walls) - np.mean(walls)) > 0.2 * np.mean(walls)  # skewed indeed
    step = a.header["step_ms"]
    assert step == pytest.approx(float(np.mean(walls)), rel=1e-12)
    assert float(a.breakdown["ms"].sum()) == pytest.approx(step, rel=1e-9)
    assert step * a.header["images_per_s"] / 1e3 == pytest.approx(64.0, rel=0.01)


def test_claimed_costs_together_never_exceed_the_step() -> None:
    """Each claim is a counterfactual on its own; taken in rank order, one is
    at most what the claims above leave of the step and says so, and a
    claim cut below the noise floor is no longer claimed."""
    from types import SimpleNamespace

    from profiler.analysis.findings import Finding, _within_the_step

    ctx = SimpleNamespace(step_ms=10.0, cost_img_s=lambda ms: ms * 2.0,
                          significant=lambda lo: lo > 0.5)
    fs = [Finding(key="late_ranks", headline="", cost_ms=7.0, cost_interval_ms=(6.0, 8.0),
                  significant=True, part="wait_ranks"),
          Finding(key="cpu_contention", headline="", cost_ms=5.0,
                  cost_interval_ms=(4.0, 6.0), significant=True, part="compute"),
          Finding(key="second_cycles", headline="", cost_ms=1.0, cost_interval_ms=(0.8, 1.2),
                  significant=True, part="horovod"),
          Finding(key="efficiency", headline="", cost_ms=4.0, significant=False),
          Finding(key="compute_bound", headline="", cost_ms=2.0, significant=True,
                  part="compute")]
    _within_the_step(fs, ctx)  # type: ignore[arg-type]
    # the symptom (the rest of compute) is no cause: left as it is
    assert [f.cost_ms for f in fs] == [7.0, 3.0, 0.0, 4.0, 2.0]
    assert fs[1].cost_interval_ms == (3.0, 3.0) and fs[1].cost_img_s == 6.0
    assert fs[1].numbers["cost_alone_ms"] == 5.0 and "overlap" in fs[1].details[0]
    assert fs[1].significant and not fs[2].significant  # nothing left of the step
    assert fs[0].details == [] and fs[3].details == []  # a minor finding is no claim
    assert sum(f.cost_ms for f in fs[:4] if f.significant) <= 10.0


def test_the_first_screen_reconciles_the_parts_and_the_claims() -> None:
    """Rank 1 is 25 ms late: the waiting part is marked with its finding's
    number, and one line sets the claimed costs against the step, in text and
    JSON alike."""
    import html

    from profiler.analysis.report import _findings_section
    from profiler.cli.advise import render

    rng = np.random.default_rng(12)
    arr = rng.uniform(30.0, 40.0, size=(40, 2))
    arr[:, 1] += 25.0
    df, meta = horovod_job(arr.tolist())
    a = advise_frame(df, meta)
    n = next(i for i, f in enumerate(a.significant, 1) if f.key == "late_ranks")
    # the report's findings say the same sentence, over the same numbered list
    assert html.escape(a.reconciliation()) in _findings_section(df, [""], {"": meta}, False)
    assert a.part_claims()["wait_ranks"][0] == n
    text = render(a, width=120)
    (wait,) = [ln for ln in text.splitlines() if ln.startswith("  waiting for other ranks")]
    assert wait.endswith(f"\u2190 {n}")
    step, got = a.header["step_ms"], a.claimed_ms
    assert 0 < got <= step
    nums = ", ".join(str(i) for i, _ in a.causes)
    assert (f"The causes found ({nums}) claim {fmt_ms(got)} of the {fmt_ms(step)} step"
            in " ".join(text.split()))
    doc = a.to_dict()["reconciliation"]
    assert doc["claimed_ms"] == pytest.approx(got)
    assert doc["unexplained_ms"] == pytest.approx(step - got)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_steps_without_images_say_in_one_line_how_to_give_them(framework: str) -> None:
    """Steps whose image count is unknown (0) give no images/sec: one limit
    says so and how to give it, in the job's framework's words; with images,
    no such line."""
    from profiler.analysis.figures import step_timeline
    from profiler.cli.advise import render

    rng = np.random.default_rng(3)
    df, meta = horovod_job(rng.uniform(30.0, 40.0, size=(30, 2)).tolist())
    assert "no_images" not in {f.key for f in advise_frame(df, meta).limits}
    assert "images/sec" in {t.name for t in step_timeline(df).data}
    df.loc[df["op"] == "step", "count"] = 0
    # the report's step figure draws no rate of 0, and its title says why
    fig = step_timeline(df)
    assert "images/sec" not in {t.name for t in fig.data}
    assert "images/sec unknown" in fig.layout.title.text
    meta = {**meta, "steps_marked_by": ["tf.function calls" if framework == "tensorflow"
                                        else "optimizer.step (PyTorch)"]}
    a = advise_frame(df, meta)
    (lim,) = [f for f in a.limits if f.key == "no_images"]
    assert "HOROVOD_PROFILE_BATCH_SIZE=N" in lim.details[0]
    assert ("closure" in lim.details[0]) == (framework == "tensorflow")
    assert ("set_batch_size" in lim.details[0]) == (framework == "torch")
    assert "images/sec unknown" in render(a)


def test_a_long_cycles_cost_holds_the_negotiations_wait_for_the_other_ranks() -> None:
    """HOROVOD_CYCLE_TIME=20: the gradients wait 15 ms for the cycle, 8 of them
    in the negotiation's control call (the other ranks' cycles come later).
    A 1 ms cycle scales the whole wait by 1/20: the step would be 15 x 19/20 =
    14.25 ms shorter.  The idle part alone (6.8 ms x 19/20) would miss half."""
    rng = np.random.default_rng(8)
    arr = rng.uniform(30.0, 31.0, size=(30, 3)).tolist()
    df, meta = horovod_job(arr, cycle_ms=15.0, negotiation_wait_ms=8.0)
    meta = {**meta, "env": {"HOROVOD_CYCLE_TIME": "20"}}
    (f,) = [f for f in advise_frame(df, meta).findings if f.key == "cycle_time"]
    assert f.significant and f.numbers["negotiation_ms"] == pytest.approx(8.2, abs=0.01)
    # 14.5-15 ms a rank: the last rank enters synchronize 0.5 ms after its tensor
    assert 14.5 <= f.numbers["cycle_wait_ms"] <= 15.0
    assert f.cost_ms == pytest.approx(f.numbers["cycle_wait_ms"] * 19 / 20, rel=0.01)
    assert f.cost_ms == pytest.approx(15.0 * 19 / 20, rel=0.05)
    idle_only = f.numbers["idle_ms"] * 19 / 20
    assert idle_only < 0.5 * f.cost_ms
    assert f"{fmt_ms(f.numbers['cycle_wait_ms'])} after the last gradient" in f.headline
    # at Horovod's default cycle the same wait claims nothing
    (d,) = [f for f in advise_frame(*horovod_job(arr, cycle_ms=15.0,
                                                 negotiation_wait_ms=8.0)).findings
            if f.key in ("cycle_time", "horovod_wait")]
    assert d.key == "horovod_wait" and d.cost_ms is None and not d.significant


def test_a_shift_gains_the_step_only_where_it_moves_the_last_arrival() -> None:
    # rank 1 arrives 30 ms after rank 0 in every step
    bd = rank_breakdown(*horovod_job([[50.0, 80.0]] * 6))
    steps = sorted(bd["step"].unique())

    def shift(**by_rank: float) -> pd.DataFrame:
        return pd.DataFrame({int(r[1:]): [v] * len(steps) for r, v in by_rank.items()},
                            index=steps)

    assert np.allclose(shifted_gain(bd, shift(r1=20.0)), 20.0)  # still last: all of it
    assert np.allclose(shifted_gain(bd, shift(r1=45.0)), 30.0)  # now rank 0 ends the wait
    assert np.allclose(shifted_gain(bd, shift(r0=10.0)), 0.0)  # the early rank: nothing
    assert np.allclose(shifted_gain(bd, shift(r0=10.0, r1=10.0)), 10.0)  # every rank
    assert np.allclose(shifted_gain(bd, shift(r1=-5.0)), 0.0)  # never later than it was
