"""Statistics the analysis shares: the bootstrap interval of a mean, and tests
of findings against chance.

A finding that names one of several candidates (a rank, a message size) must
show that the data single it out more often than chance would.  The rule used
here: count how often each candidate is "the one" over independent trials
(steps), compare the most frequent candidate's count with Binomial(n, 1/k),
correct for having looked at every candidate (Bonferroni: k tests), and shrink
n to the effective number of independent trials when consecutive trials are
correlated (a rank that is slow for a stretch of steps is not n independent
observations).

One bootstrap serves the whole analysis (bootstrap_interval: scipy.stats.bootstrap,
percentile intervals, SEED): findings and `profiler compare` alike, so an
interval is the same wherever it is shown and the same on every run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SEED", "N_BOOT", "bootstrap_interval", "BOOTSTRAP_MAX", "bootstrap_mean", "ALPHA",
           "binom_sf", "effective_n", "ChanceTest", "most_often"]

#: The false-alarm rate accepted for a finding that names a candidate.
ALPHA = 0.01


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (exact; n up to
    a few thousand, a normal approximation with continuity correction above)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    if n > 5000:
        mu, sd = n * p, math.sqrt(n * p * (1 - p))
        return 0.5 * math.erfc((k - 0.5 - mu) / (sd * math.sqrt(2)))
    lp, lq = math.log(p), math.log1p(-p)
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp
            + (n - i) * lq for i in range(k, n + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def effective_n(hits: np.ndarray) -> float:
    """Trials' effective number: n (1 - r) / (1 + r) with r the lag-1
    autocorrelation of the 0/1 series (when positive); n when independent."""
    x = np.asarray(hits, dtype=np.float64)
    n = x.size
    if n < 3 or x.std() == 0:
        return float(n)
    r = float(np.corrcoef(x[:-1], x[1:])[0, 1])
    if not np.isfinite(r) or r <= 0:
        return float(n)
    return max(1.0, n * (1 - r) / (1 + r))


@dataclass
class ChanceTest:
    """The most frequent candidate and the test of its count against chance."""

    candidate: int
    count: int
    trials: int
    candidates: int
    share: float
    chance: float
    n_eff: float
    p_value: float       # one-sided, Bonferroni-corrected over the candidates
    significant: bool

    def describe(self, what: str = "steps") -> str:
        """'last in 27 of 50 steps; chance 50%; p = 0.67' in plain words."""
        p = ("p < 0.001" if self.p_value < 1e-3 else f"p = {self.p_value:.2g}")
        eff = (f", {self.n_eff:.0f} independent" if self.n_eff < 0.9 * self.trials else "")
        return (f"{self.count} of {self.trials} {what}{eff}; chance alone gives "
                f"{self.chance:.0%} ({p})")


def most_often(winners: np.ndarray, candidates: int, *, alpha: float = ALPHA
               ) -> ChanceTest | None:
    """Test whether the most frequent value of `winners` (one per trial, ints)
    wins more often than 1/candidates of the trials by chance."""
    w = np.asarray(winners, dtype=np.int64)
    if w.size == 0 or candidates < 2:
        return None
    vals, counts = np.unique(w, return_counts=True)
    return chance_test(w, int(vals[int(np.argmax(counts))]), candidates, alpha=alpha)


def chance_test(winners: np.ndarray, candidate: int, candidates: int, *,
                alpha: float = ALPHA) -> ChanceTest | None:
    """Test whether `candidate` wins more often than 1/candidates of the trials
    (one winner per trial) by chance; Bonferroni-corrected over the candidates,
    so that it holds for a candidate chosen by any rule (the most frequent, the
    costliest)."""
    w = np.asarray(winners, dtype=np.int64)
    if w.size == 0 or candidates < 2:
        return None
    top = int(candidate)
    count = int((w == top).sum())
    n = int(w.size)
    chance = 1.0 / candidates
    n_eff = effective_n(w == top)
    # the count scaled to the effective trials keeps the observed share
    k_eff = int(math.ceil(count / n * n_eff - 1e-9))
    p = min(1.0, binom_sf(k_eff, int(round(n_eff)), chance) * candidates)
    return ChanceTest(candidate=top, count=count, trials=n, candidates=candidates,
                      share=count / n, chance=chance, n_eff=n_eff, p_value=p,
                      significant=p < alpha)


#: The analysis's one bootstrap seed: every interval is reproducible.
SEED = 7
#: Resamples per bootstrap interval.
N_BOOT = 1000


def bootstrap_interval(samples: Sequence[np.ndarray], statistic: Callable[..., np.ndarray],
                       *, n: int = N_BOOT, level: float = 0.95, seed: int = SEED
                       ) -> tuple[float, float]:
    """Percentile-bootstrap interval of statistic(*samples) (scipy.stats.bootstrap):
    each sample is resampled on its own; `statistic` takes the samples and
    axis=-1.  NaN when a sample has fewer than 2 values."""
    from scipy import stats

    arrays = [np.asarray(s, dtype=np.float64) for s in samples]
    if not arrays or any(a.size < 2 for a in arrays):
        return float("nan"), float("nan")
    res = stats.bootstrap(arrays, statistic, n_resamples=n, vectorized=True, axis=-1,
                          method="percentile", confidence_level=level,
                          rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return float(ci.low), float(ci.high)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.mean(x, axis=axis))


#: Above this many values the interval is the normal one (mean +- 1.96
#: standard errors): the bootstrap's would agree, at n x len(values) memory.
BOOTSTRAP_MAX = 1024


def bootstrap_mean(values: np.ndarray, *, n: int = N_BOOT, seed: int = SEED
                   ) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean and its 95% percentile-bootstrap interval
    (bootstrap_interval; the normal interval above BOOTSTRAP_MAX values)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return float("nan"), float("nan"), float("nan")
    if len(v) == 1:
        return float(v[0]), float(v[0]), float(v[0])
    mean = float(v.mean())
    if len(v) > BOOTSTRAP_MAX:
        half = 1.96 * float(v.std(ddof=1)) / np.sqrt(len(v))
        return mean, mean - half, mean + half
    lo, hi = bootstrap_interval((v,), _mean, n=n, seed=seed)
    return mean, lo, hi
