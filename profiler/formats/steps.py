"""A job's step time and images/sec: one definition each, for every door.

The post-job merge (trace.json's metadata), the watcher (raw files), and the
analysis (advise's header, the breakdown, compare, summarize, the report, the
notebooks) all compute these two figures here, from the same integers, so
they agree to the last digit on the same steps.

* The steady steps: when some steps carry images and others none, the
  application marked its warm-up with 0 images, so exactly the steps with
  images count; otherwise the first ``warmup`` steps are left out (every step
  kept when there are no more).  Each rank applies the rule to its own steps
  (they are the job's steps: every rank runs them).
* Step time: the mean of the ranks' own step times over the steady steps
  (total rank-step ns / rank-steps).  Not a step's window from the earliest
  rank's start to the latest rank's end: where the ranks' boundaries are
  skewed, that window is longer than any rank's step by the skew.
* Images/sec: the images of a step over the step time
  (images / steps / step time), so that step time x images/sec is exactly the
  images a step trains.  Where every rank runs every steady step this is the
  images over the ranks' mean time in steady steps.  Not the ranks' own rates
  summed: with ranks at different rates that sum is no rate the job ran at.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["StepTotals", "StepFold", "steady_mask", "warmup_marked", "rank_totals",
           "window_totals", "job_totals", "step_ms", "images_per_s", "WARMUP_STEPS"]

#: Steps left out at the start when the application did not mark its warm-up.
WARMUP_STEPS = 1


def warmup_marked(steps: int, with_images: int) -> bool:
    """The rule's first half: the application marked its warm-up (some of its
    steps carry images, the others none), so exactly the steps with images
    count; otherwise the first `warmup` steps are left out."""
    return 0 < with_images < steps


def steady_mask(step: np.ndarray, images: np.ndarray, warmup: int = WARMUP_STEPS
                ) -> np.ndarray:
    """Which of these steps (one entry per step, any order; images of the step)
    count: the rule of the module doc."""
    step = np.asarray(step)
    images = np.asarray(images)
    if warmup_marked(len(images), int((images > 0).sum())):
        return images > 0
    keep = np.ones(len(step), dtype=bool)
    if len(step) > warmup:
        keep[np.argsort(step, kind="stable")[:warmup]] = False
    return keep


@dataclass(frozen=True)
class StepTotals:
    """Integers the two figures come from: over the steady steps, the images
    (all ranks), the ranks' own step time summed (ns), the rank-steps counted,
    and the distinct steps."""

    images: int = 0
    rank_ns: int = 0
    rank_steps: int = 0
    steps: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"images": self.images, "rank_ns": self.rank_ns,
                "rank_steps": self.rank_steps, "steps": self.steps}


def rank_totals(step: np.ndarray, t_start_ns: np.ndarray, t_end_ns: np.ndarray,
                images: np.ndarray, warmup: int = WARMUP_STEPS) -> StepTotals:
    """One rank's steady steps (its step rows: number, start, end, images)."""
    step = np.asarray(step, dtype=np.int64)
    if not len(step):
        return StepTotals()
    imgs = np.asarray(images, dtype=np.int64)
    dur = np.maximum(np.asarray(t_end_ns, dtype=np.int64)
                     - np.asarray(t_start_ns, dtype=np.int64), 0)
    keep = steady_mask(step, imgs, warmup)
    n = int(keep.sum())
    return StepTotals(images=int(imgs[keep].sum()), rank_ns=int(dur[keep].sum()),
                      rank_steps=n, steps=n)


def window_totals(dur_ns: np.ndarray, images: np.ndarray) -> StepTotals:
    """The steps of a window inside a run (the watcher's recent steps): the
    rule with no warm-up to leave out, a window has none."""
    dur = np.maximum(np.asarray(dur_ns, dtype=np.int64), 0)
    return rank_totals(np.arange(len(dur)), np.zeros(len(dur), dtype=np.int64), dur,
                       images, warmup=0)


class StepFold:
    """One rank's steps folded as they arrive (the watcher reads a running
    job's records chunk by chunk), keeping only what the rule needs: the
    totals of every step and of the steps with images, and the first
    `warmup` steps by number.  totals() is rank_totals() of every step added,
    to the last integer."""

    def __init__(self, warmup: int = WARMUP_STEPS) -> None:
        self.warmup = warmup
        self.steps = 0
        self.ns = 0
        self.images = 0
        self.timed_steps = 0  # steps with images
        self.timed_ns = 0
        self.first: list[tuple[int, int, int]] = []  # (step, ns, images), lowest numbers

    def add(self, step: np.ndarray, dur_ns: np.ndarray, images: np.ndarray) -> None:
        """Steps (their numbers, durations and images), in any order."""
        step = np.asarray(step, dtype=np.int64)
        dur = np.maximum(np.asarray(dur_ns, dtype=np.int64), 0)
        imgs = np.asarray(images, dtype=np.int64)
        timed = imgs > 0
        self.steps += len(step)
        self.ns += int(dur.sum())
        self.images += int(imgs.sum())
        self.timed_steps += int(timed.sum())
        self.timed_ns += int(dur[timed].sum())
        if self.warmup > 0 and len(step):
            low = np.argsort(step, kind="stable")[:self.warmup]
            self.first = sorted(self.first + [(int(step[i]), int(dur[i]), int(imgs[i]))
                                              for i in low])[:self.warmup]

    def totals(self) -> StepTotals:
        """The steady steps' totals (the rule of the module doc)."""
        if warmup_marked(self.steps, self.timed_steps):
            return StepTotals(images=self.images, rank_ns=self.timed_ns,
                              rank_steps=self.timed_steps, steps=self.timed_steps)
        n, ns, images = self.steps, self.ns, self.images
        if n > self.warmup:
            n -= len(self.first)
            ns -= sum(d for _s, d, _i in self.first)
            images -= sum(i for _s, _d, i in self.first)
        return StepTotals(images=images, rank_ns=ns, rank_steps=n, steps=n)


def job_totals(ranks: list[StepTotals]) -> StepTotals:
    """The job's totals from its ranks' (each rank runs the job's steps: the
    distinct steps are the most any rank ran)."""
    return StepTotals(images=sum(r.images for r in ranks), rank_ns=sum(r.rank_ns for r in ranks),
                      rank_steps=sum(r.rank_steps for r in ranks),
                      steps=max((r.steps for r in ranks), default=0))


def step_ms(t: StepTotals) -> float:
    """The step time in ms (module doc); nan without steps or time."""
    if t.rank_steps <= 0 or t.rank_ns <= 0:
        return float("nan")
    return t.rank_ns / t.rank_steps / 1e6


def images_per_s(t: StepTotals) -> float:
    """Images/sec (module doc): exact integer products, one division; nan
    without steps or time."""
    if t.steps <= 0 or t.rank_ns <= 0 or t.rank_steps <= 0:
        return float("nan")
    return t.images * t.rank_steps * 1_000_000_000 / (t.steps * t.rank_ns)
