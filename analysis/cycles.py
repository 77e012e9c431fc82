"""Steps that wait whole Horovod cycles: the one test behind the
``second_cycles`` finding (findings/cycle.py) and ``profiler compare``'s
share of such steps.

A step's gradients that miss the cycle under way wait for the next one, so
where the compute sits near a cycle's length the step times fall in peaks
one cycle apart.  The test: of the steps between 0.35 and 0.65 of a cycle
above the fast level (the trough) and between 0.8 and 1.2 (the peak), the
peak holds more than its width's share (binomial, p < 0.01).  No one-peaked
spread of step times passes it: step times spread evenly over a cycle, or
noise whose density falls off above the fast steps.  A step within a quarter
cycle of k >= 1 whole cycles above the fast level waited k cycles more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stats import binom_sf

__all__ = ["EDGE_STEPS", "TROUGH", "PEAK", "NEAR", "EDGE_ALPHA", "CycleEdge", "cycle_edge"]

#: Steps needed to tell one peak from two.
EDGE_STEPS = 30
#: The windows of the test, in cycles above the fast level.
TROUGH = (0.35, 0.65)
PEAK = (0.8, 1.2)
#: A step within this share of a cycle of k whole cycles above the fast level
#: waited k cycles more.
NEAR = 0.25
EDGE_ALPHA = 0.01


@dataclass(frozen=True)
class CycleEdge:
    cycle_ms: float
    fast_ms: float  # the fast steps' level: the median of those within half a cycle of p10
    above: np.ndarray  # each step's time above the fast level, in cycles
    trough: int
    peak: int
    p_value: float

    @property
    def steps(self) -> int:
        return int(self.above.size)

    @property
    def passed(self) -> bool:
        return self.p_value < EDGE_ALPHA and self.peak > 0

    @property
    def waited(self) -> np.ndarray:
        """Per step: it waited one whole cycle or more."""
        k = np.rint(self.above)
        return (k >= 1) & (np.abs(self.above - k) <= NEAR)

    @property
    def at_fast(self) -> np.ndarray:
        return np.abs(self.above) <= NEAR


def cycle_edge(wall_ms: np.ndarray, cycle_ms: float) -> CycleEdge | None:
    """The test on per-step wall times (ms, NaN left out); None with fewer
    than EDGE_STEPS steps or no cycle."""
    w = np.asarray(wall_ms, dtype=float)
    w = w[np.isfinite(w)]
    if len(w) < EDGE_STEPS or not cycle_ms > 0:
        return None
    low = float(np.percentile(w, 10))
    fast = float(np.median(w[w < low + cycle_ms / 2]))
    above = (w - fast) / cycle_ms

    def between(lo: float, hi: float) -> int:
        return int(((above >= lo) & (above < hi)).sum())

    trough, peak = between(*TROUGH), between(*PEAK)
    p_peak = (PEAK[1] - PEAK[0]) / (PEAK[1] - PEAK[0] + TROUGH[1] - TROUGH[0])
    p = binom_sf(peak, trough + peak, p_peak) if trough + peak else 1.0
    return CycleEdge(cycle_ms=float(cycle_ms), fast_ms=fast, above=above, trough=trough,
                     peak=peak, p_value=float(p))
