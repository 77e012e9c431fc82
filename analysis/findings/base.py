"""What every analyzer returns (`Finding`) and what every analyzer reads (`Context`:
one trace's rows and metadata, with the per-step tables computed once)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ..stats import BOOTSTRAP_MAX, bootstrap_mean

__all__ = ["Finding", "Context", "bootstrap_mean", "BOOTSTRAP_MAX", "SIGNIFICANT_SHARE",
           "MIN_STEPS"]

#: A cost counts as significant when the lower end of its interval exceeds this
#: share of the step time (and 0.05 ms): below it, run-to-run noise on a busy
#: machine hides it.
SIGNIFICANT_SHARE = 0.01
MIN_COST_MS = 0.05
#: Steady steps needed for a per-step claim.
MIN_STEPS = 3


@dataclass
class Finding:
    """One answer: what was found, what it costs, how sure, what to do.

    cost_ms: milliseconds per step the job loses to it (None: no step-time cost
    can be claimed, e.g. background-thread time that may overlap compute);
    cost_interval_ms: its 95% interval; cost_img_s: images/sec lost;
    significant: the interval clears the noise floor and the finding passed
    the test against its null; kind: "finding" or "limit" (something the
    data cannot support); part: the part of the step breakdown
    (analysis.breakdown.PARTS) its cost is drawn from ("" when it claims no
    step time); null: what the finding was tested against, in plain words;
    cost_label: "cost" (time the job loses to it) or "explains" (time it
    accounts for, which is not all to be saved); not_claimed: why a finding
    that looked like one is not claimed (it failed its test against its null,
    or that test was not run), "" otherwise."""

    key: str
    headline: str
    details: list[str] = field(default_factory=list)
    cost_ms: float | None = None
    cost_interval_ms: tuple[float, float] | None = None
    cost_img_s: float | None = None
    confidence: str = ""
    recommendation: str = ""
    check: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    significant: bool = False
    kind: str = "finding"
    part: str = ""
    null: str = ""
    cost_label: str = "cost"
    not_claimed: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cost_interval_ms"] = list(self.cost_interval_ms) if self.cost_interval_ms else None
        return d


@dataclass
class Context:
    """One trace for the analyzers: its rows (every column the analyzers use),
    its metadata block, and the label a comparison gives it."""

    df: pd.DataFrame
    meta: dict[str, Any]
    path: str = ""

    @cached_property
    def rank_steps(self) -> pd.DataFrame:
        from ..throughput import rank_steps

        return rank_steps(self.df) if "op" in self.df.columns else pd.DataFrame()

    @cached_property
    def step_table(self) -> pd.DataFrame:
        from ..throughput import step_table

        return step_table(self.df, ranked=self.rank_steps)

    @cached_property
    def steady(self) -> pd.DataFrame:
        """The job's steady steps (throughput.steady_steps)."""
        from ..throughput import steady_steps

        t = self.step_table
        return steady_steps(t) if len(t) else t

    @cached_property
    def steady_rank_steps(self) -> pd.DataFrame:
        rs = self.rank_steps
        if rs.empty or self.steady.empty:
            return rs.iloc[0:0]
        return rs.loc[rs["step"].isin(self.steady["step"])]

    @cached_property
    def steady_df(self) -> pd.DataFrame:
        """The rows that start inside the steady steps (the whole trace without
        steps): what per-step costs are computed from."""
        s = self.steady
        if not len(s) or "t_start_ns" not in self.df.columns:
            return self.df
        lo, hi = int(s["t_start_ns"].min()), int(s["t_end_ns"].max())
        t = self.df["t_start_ns"].to_numpy()
        return self.df.loc[(t >= lo) & (t < hi)]

    @cached_property
    def matched(self) -> pd.DataFrame:
        """The steady data collectives matched across ranks
        (analysis.imbalance.match_calls; every call where the trace does not
        classify calls).  Horovod's per-cycle control allreduce waits for the
        other background threads' cycle phase, not for a rank: left out."""
        from ..imbalance import match_calls

        kinds = ["data"] if "kind" in self.df.columns else None
        return match_calls(self.steady_df, kinds=kinds)

    @cached_property
    def breakdown(self) -> pd.DataFrame:
        """The steady steps' per-rank breakdown (analysis.breakdown.rank_breakdown)."""
        from ..breakdown import rank_breakdown

        if not self.n_steps:
            return rank_breakdown(self.df.iloc[0:0])
        bd = rank_breakdown(self.df, self.meta)
        return bd.loc[bd["step"].isin(self.steady["step"])].reset_index(drop=True)

    @cached_property
    def parts(self) -> pd.DataFrame:
        """The job's breakdown over the steady steps (analysis.breakdown.breakdown_summary)."""
        from ..breakdown import breakdown_summary

        return breakdown_summary(self.breakdown)

    def part_ms(self, part: str) -> float:
        """The mean ms per step of one part (0 when there is no breakdown)."""
        p = self.parts
        hit = p.loc[p["part"] == part, "ms"] if len(p) else p
        return float(hit.iloc[0]) if len(hit) else 0.0

    @property
    def n_steps(self) -> int:
        return len(self.steady)

    @cached_property
    def step_ms(self) -> float:
        """Step time of the steady steps analysed (nan without steps): the one
        definition (profiler.formats.steps.step_ms, through
        throughput.run_step_ms) of every door -- compare, the breakdown, whose
        parts sum to it, summarize, the watcher, trace.json -- so that step
        time x images/sec is the images of a step."""
        from ..throughput import run_step_ms

        return run_step_ms(self.steady) if self.n_steps else float("nan")

    @cached_property
    def images_per_s(self) -> float:
        """Images/sec of the steady steps analysed (throughput.run_images_per_s)."""
        from ..throughput import run_images_per_s

        return run_images_per_s(self.steady)

    @cached_property
    def is_window(self) -> bool:
        """The rows analysed are a window of the job (some of its ranks or steps,
        analysis.load's bounded selection), not the whole job."""
        return bool(self.df.attrs.get("selection"))

    @cached_property
    def job_images_per_s(self) -> float:
        """The whole job's images/sec: trace.json's (the merge computed it over
        every rank's steady steps, the same definition) when the rows analysed
        are a window of the job, else images_per_s.  A window's own rate is
        that of the ranks in it: at 1024 ranks, 18 ranks' worth."""
        ips = self.meta.get("images_per_sec")
        if self.is_window and isinstance(ips, (int, float)) and np.isfinite(ips) and ips > 0:
            return float(ips)
        return self.images_per_s

    @cached_property
    def job_step_ms(self) -> float:
        """The whole job's step time: trace.json's when the rows analysed are a
        window (as job_images_per_s), else step_ms."""
        ms = self.meta.get("step_ms")
        if self.is_window and isinstance(ms, (int, float)) and np.isfinite(ms) and ms > 0:
            return float(ms)
        return self.step_ms

    @cached_property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in pd.unique(self.df["rank"])) if len(self.df) else []

    @cached_property
    def hosts(self) -> list[str]:
        hs = self.meta.get("hosts")
        if isinstance(hs, list) and hs:
            return [str(h) for h in hs]
        return sorted({str(r.get("host", "")) for r in self.meta.get("ranks") or []
                       if isinstance(r, dict)} - {""})

    def cost_img_s(self, cost_ms: float) -> float | None:
        """Images/sec the job gains if `cost_ms` per step were removed from the
        step time analysed (step_ms): the job's rate (job_images_per_s) scaled
        by the step's shortening, so the same figures as the header's."""
        ips, step = self.job_images_per_s, self.step_ms
        if not (np.isfinite(ips) and np.isfinite(step)) or step <= cost_ms or cost_ms <= 0:
            return None
        return ips * (step / (step - cost_ms) - 1.0)

    def significant(self, lo_ms: float) -> bool:
        floor = max(MIN_COST_MS, SIGNIFICANT_SHARE * self.step_ms) if np.isfinite(
            self.step_ms) else MIN_COST_MS
        return bool(np.isfinite(lo_ms) and lo_ms > floor)


Analyzer = Callable[[Context], Sequence[Finding]]
