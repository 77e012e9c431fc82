"""Latency-vs-size model: piecewise alpha-beta fit, anomalies, padding what-if.

Model.  A collective of n bytes takes ``t(n) = alpha + beta * n`` (alpha: latency,
1/beta: bandwidth; 1 byte/ns = 1 GB/s).  Real curves have knees where the MPI
library or NCCL switches protocol or algorithm (eager -> rendezvous, recursive
doubling -> ring), so the fit is *piecewise*: the sorted sizes are split into
contiguous regions (in log-size order) and each region gets its own alpha and
beta.

Fitting (:func:`fit_curve`):

1. The input is one latency per distinct size: the median over all calls of that
   size (robust against the occasional preempted call).
2. Each region is fitted by least squares on *relative* error,
   ``sum(((t_i - alpha - beta n_i) / t_i)^2)`` (latencies span decades; an
   absolute fit would ignore small messages), with alpha >= 0 and beta >= 0
   (closed form from prefix sums).
3. Breakpoints: the best split into K regions (K = 1..max_regions, at least
   ``min_sizes`` sizes each) is found exactly by segmented least squares
   (dynamic programming); K is chosen by BIC with 3 parameters per region
   (alpha, beta, breakpoint) and a floor on the residual variance (0.1% relative)
   so that a noise-free curve is not split into arbitrary regions.
4. Robustness: the first fit uses only power-of-two sizes when there are enough
   of them (the known anomaly class is non-power-of-two sizes, which must not
   pull the reference curve up); then sizes whose latency sits far above the fit
   (see below) are excluded and the fit is repeated on all remaining sizes until
   the set is stable.

Anomalies (:func:`anomalies`).  With ``r = ln(median / fit)`` per size and a
robust scale ``s = 1.4826 * MAD(r over inlier sizes)`` (floored at 0.02), a size
is anomalous when ``median / fit >= min_ratio`` (default 1.5) *and*
``(r - median(r_inliers)) / s >= z`` (default 3.5).  A size in the fit pulls
it and widens ``s`` (the largest size, with none beyond it, can hide an 8x
cliff so), so each size is also judged left out (:func:`loo_reference_ns`):
against its region's line refitted without it (or the neighbouring region's
line where higher: a size near a knee is held to the curve on either side),
with ``r`` centred and scaled over the other sizes' such residuals and the
scale widened by the line's uncertainty there (its leverage).  Past the end
of its line a size counts only if it costs more per byte than the next
smaller size (a curve that bends to a faster protocol is no cliff).  A size
flagged only so reports that reference.  The table says whether each size is
a power of two.

Padding what-if (:func:`padding_whatif`).  Each call of size n is imagined
padded to n' (next power of two, or the next multiple of a given number of
bytes).  Its time is the measured median at n; the padded time is the measured
median at n' when that size occurs in the trace, else the fit at n'.  Saved time
per size = calls x (t(n) - t(n')), which is negative when padding costs more;
the summary gives the saving when every call is padded and when only sizes that
gain are padded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from profiler.errors import UsageError

from ._frame import is_pow2, keys_of, label_keys, next_pow2, round_up, timed_calls
from .sizes import RankSel, select_rank

__all__ = [
    "Region", "AlphaBetaModel", "fit_curve", "latency_by_size", "fit_models",
    "fit_alpha_beta", "models_table", "predict", "anomalies", "loo_reference_ns",
    "padding_whatif", "padding_summary",
]

REL_VAR_FLOOR = 1e-6  # (1e-3)^2: relative residual variance treated as noise-free
SCALE_FLOOR = 0.02


@dataclass(frozen=True)
class Region:
    """One protocol region of the fit: sizes lo_bytes..hi_bytes (measured ends)."""

    lo_bytes: int
    hi_bytes: int
    alpha_ns: float
    beta_ns_per_byte: float
    n_sizes: int
    rel_rms: float

    @property
    def alpha_us(self) -> float:
        return self.alpha_ns / 1e3

    @property
    def bandwidth_gbps(self) -> float:
        """1/beta in GB/s (1 byte per ns); NaN when beta is 0 (not identifiable)."""
        return 1.0 / self.beta_ns_per_byte if self.beta_ns_per_byte > 0 else float("nan")


@dataclass(frozen=True)
class AlphaBetaModel:
    """Piecewise alpha-beta model of one latency curve."""

    regions: tuple[Region, ...]
    excluded: tuple[int, ...] = field(default=())  # sizes left out as anomalies
    inlier_center: float = 0.0  # median log residual of the inliers
    inlier_scale: float = SCALE_FLOOR  # robust scale of the inliers' log residuals

    def boundaries(self) -> list[float]:
        """Size at which region k+1 takes over from region k: the geometric middle of
        the gap between their measured ends."""
        out = []
        for a, b in zip(self.regions, self.regions[1:]):
            out.append(math.sqrt(max(a.hi_bytes, 1) * max(b.lo_bytes, 1)))
        return out

    def region_index(self, nbytes: np.ndarray | Sequence[float] | float) -> np.ndarray:
        x = np.asarray(nbytes, dtype=float)
        return np.searchsorted(np.asarray(self.boundaries()), x, side="left")

    def predict_ns(self, nbytes: np.ndarray | Sequence[float] | float) -> np.ndarray:
        x = np.asarray(nbytes, dtype=float)
        idx = self.region_index(x)
        alpha = np.array([r.alpha_ns for r in self.regions])[idx]
        beta = np.array([r.beta_ns_per_byte for r in self.regions])[idx]
        return alpha + beta * x


# --------------------------------------------------------------------------- fit


class _Prefix:
    """Prefix sums for the relative-error weighted least squares of t = a + b*x."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        w2 = 1.0 / (y * y)
        def cum(v: np.ndarray) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(v)])
        self.s0 = cum(w2)
        self.sx = cum(x * w2)
        self.sxx = cum(x * x * w2)
        self.sy = cum(1.0 / y)        # sum y * w2
        self.sxy = cum(x / y)         # sum x * y * w2
        self.x = x
        self.y = y

    def fit_many(self, i: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                              np.ndarray]:
        """(alpha, beta, sse) for the point ranges [i, j) (arrays, half-open)."""
        n = (j - i).astype(float)
        s0 = self.s0[j] - self.s0[i]
        sx = self.sx[j] - self.sx[i]
        sxx = self.sxx[j] - self.sxx[i]
        sy = self.sy[j] - self.sy[i]
        sxy = self.sxy[j] - self.sxy[i]
        det = s0 * sxx - sx * sx
        good = (n >= 2) & (det > 1e-12 * np.maximum(s0 * sxx, 1e-300))
        safe = np.where(good, det, 1.0)
        a = np.where(good, (sy * sxx - sx * sxy) / safe, np.nan)
        b = np.where(good, (s0 * sxy - sx * sy) / safe, np.nan)
        # constrained fallbacks: beta = 0 (alpha = weighted mean) or alpha = 0
        a0 = sy / np.where(s0 > 0, s0, 1.0)
        sse0 = n - 2 * a0 * sy + a0 * a0 * s0
        b1 = np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), 0.0)
        sse1 = np.where(sxx > 0, n - 2 * b1 * sxy + b1 * b1 * sxx, np.inf)
        use0 = sse0 <= sse1
        bad = ~((a >= 0) & (b >= 0))
        a = np.where(bad, np.where(use0, a0, 0.0), a)
        b = np.where(bad, np.where(use0, 0.0, b1), b)
        sse = n - 2 * a * sy - 2 * b * sxy + a * a * s0 + 2 * a * b * sx + b * b * sxx
        return a, b, np.maximum(sse, 0.0)

    def fit(self, i: int, j: int) -> tuple[float, float, float]:
        """(alpha, beta, sse) for points i..j-1 (half-open)."""
        a, b, sse = self.fit_many(np.array([i]), np.array([j]))
        return float(a[0]), float(b[0]), float(sse[0])


def _segment(x: np.ndarray, y: np.ndarray, max_regions: int, min_sizes: int
             ) -> list[tuple[int, int]]:
    """Best contiguous split of sorted points into regions (half-open index pairs)."""
    n = x.size
    pre = _Prefix(x, y)
    kmax = max(1, min(max_regions, n // max(min_sizes, 1)))
    inf = float("inf")
    # cost[k][j]: best SSE of the first j points in k regions; arg for back-tracking
    cost = np.full((kmax + 1, n + 1), inf)
    arg = np.zeros((kmax + 1, n + 1), dtype=np.int64)
    cost[0][0] = 0.0
    seg = np.full((n + 1, n + 1), inf)
    for i in range(n - min_sizes + 1):
        js = np.arange(i + min_sizes, n + 1)
        seg[i, js] = pre.fit_many(np.full(js.size, i), js)[2]
    for k in range(1, kmax + 1):
        for j in range(k * min_sizes, n + 1):
            cand = cost[k - 1][: j - min_sizes + 1] + seg[: j - min_sizes + 1, j]
            i = int(np.argmin(cand))
            cost[k][j] = cand[i]
            arg[k][j] = i
    best_k, best_bic = 1, inf
    for k in range(1, kmax + 1):
        if not np.isfinite(cost[k][n]):
            continue
        var = max(cost[k][n] / n, REL_VAR_FLOOR)
        bic = n * math.log(var) + (3 * k - 1) * math.log(max(n, 2))
        if bic < best_bic - 1e-9:
            best_k, best_bic = k, bic
    bounds: list[tuple[int, int]] = []
    j = n
    for k in range(best_k, 0, -1):
        i = int(arg[k][j])
        bounds.append((i, j))
        j = i
    return bounds[::-1]


def _fit_regions(x: np.ndarray, y: np.ndarray, max_regions: int, min_sizes: int
                 ) -> tuple[Region, ...]:
    if x.size == 0:
        raise UsageError(None, "alpha-beta fit: no sizes to fit")
    if x.size == 1:
        return (Region(int(x[0]), int(x[0]), float(y[0]), 0.0, 1, 0.0),)
    if x.size < 2 * min_sizes:
        parts = [(0, x.size)]
    else:
        parts = _segment(x, y, max_regions, min_sizes)
    pre = _Prefix(x, y)
    regions = []
    for i, j in parts:
        a, b, sse = pre.fit(i, j)
        rel = (y[i:j] - a - b * x[i:j]) / y[i:j]
        regions.append(Region(int(x[i]), int(x[j - 1]), a, b, j - i,
                              float(np.sqrt(np.mean(rel * rel)))))
    return tuple(regions)


def fit_curve(
    sizes: Sequence[float] | np.ndarray,
    latency_ns: Sequence[float] | np.ndarray,
    *,
    max_regions: int = 4,
    min_sizes: int = 3,
    z: float = 3.5,
    min_ratio: float = 1.5,
    max_iter: int = 5,
) -> AlphaBetaModel:
    """Fit a piecewise alpha-beta model to one latency per distinct size (ns)."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(latency_ns, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise UsageError(None, "fit_curve: sizes and latencies must be 1-D of equal length")
    if max_regions < 1 or min_sizes < 2:
        raise UsageError(None, "fit_curve: max_regions >= 1 and min_sizes >= 2 required")
    ok = np.isfinite(x) & np.isfinite(y) & (y > 0) & (x >= 0)
    x, y = x[ok], y[ok]
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    if x.size == 0:
        raise UsageError(None, "alpha-beta fit: no positive latencies to fit")
    pow2 = is_pow2(x.astype(np.int64))
    inlier = pow2 if pow2.sum() >= max(4, 2 * min_sizes) else np.ones(x.size, dtype=bool)
    model = AlphaBetaModel(_fit_regions(x[inlier], y[inlier], max_regions, min_sizes))
    for _ in range(max_iter):
        r = np.log(y / np.maximum(model.predict_ns(x), 1e-9))
        center = float(np.median(r[inlier]))
        scale = max(1.4826 * float(np.median(np.abs(r[inlier] - center))), SCALE_FLOOR)
        high = (r >= math.log(min_ratio)) & ((r - center) / scale >= z)
        new_inlier = ~high
        if new_inlier.sum() == 0:
            break
        changed = not np.array_equal(new_inlier, inlier)
        inlier = new_inlier
        model = AlphaBetaModel(_fit_regions(x[inlier], y[inlier], max_regions, min_sizes))
        if not changed:
            break
    r = np.log(y / np.maximum(model.predict_ns(x), 1e-9))
    center = float(np.median(r[inlier]))
    scale = max(1.4826 * float(np.median(np.abs(r[inlier] - center))), SCALE_FLOOR)
    return AlphaBetaModel(model.regions, tuple(int(v) for v in x[~inlier]), center, scale)


# ------------------------------------------------------------------ frame level


def _model_keys(df: pd.DataFrame, by: Sequence[str] | None) -> list[str]:
    keys = list(by) if by is not None else [*label_keys(df), "op"]
    for k in keys:
        if k not in df.columns:
            raise UsageError(None, f"cannot group by {k!r}: no such column")
    return keys


def latency_by_size(
    df: pd.DataFrame,
    *,
    by: Sequence[str] | None = None,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
) -> pd.DataFrame:
    """Per group (default: label and op) and exact size: calls and latency statistics
    in microseconds (median, mean, p5, p95, p99, min), over every rank's calls.

    Columns: *by, bytes, calls, median_us, mean_us, p5_us, p95_us, p99_us, min_us,
    is_pow2."""
    keys = _model_keys(df, by)
    sel = timed_calls(df, kinds=kinds, ops=ops, columns=[*keys, "bytes", "dur_ns"])
    cols = [*keys, "bytes", "calls", "median_us", "mean_us", "p5_us", "p95_us", "p99_us",
            "min_us", "is_pow2"]
    if sel.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    work = pd.DataFrame({k: keys_of(sel[k]) for k in keys})
    work["bytes"] = sel["bytes"].to_numpy(dtype=np.int64)
    work["us"] = sel["dur_ns"].to_numpy(dtype=np.float64) / 1e3
    g = work.groupby([*keys, "bytes"], sort=True, observed=True)["us"]
    out = g.agg(calls="size", median_us="median", mean_us="mean", min_us="min")
    q = g.quantile([0.05, 0.95, 0.99]).unstack()
    out["p5_us"] = q[0.05]
    out["p95_us"] = q[0.95]
    out["p99_us"] = q[0.99]
    out = out.reset_index()
    for k in keys:
        out[k] = out[k].astype(str)
    out["calls"] = out["calls"].astype(np.int64)
    out["is_pow2"] = is_pow2(out["bytes"].to_numpy())
    return out[cols]


ModelKey = tuple[str, ...]


def fit_models(
    df: pd.DataFrame,
    *,
    by: Sequence[str] | None = None,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    stats: pd.DataFrame | None = None,
    **fit_kw: float,
) -> dict[ModelKey, AlphaBetaModel]:
    """One model per group (default: label and op), fitted on per-size medians.
    Keys are tuples of the group values as strings."""
    st = stats if stats is not None else latency_by_size(df, by=by, kinds=kinds, ops=ops)
    keys = _model_keys(st, by) if by is not None else [
        k for k in st.columns if k not in ("bytes", "calls", "median_us", "mean_us", "p5_us",
                                          "p95_us", "p99_us", "min_us", "is_pow2")]
    models: dict[ModelKey, AlphaBetaModel] = {}
    groups = st.groupby(keys, sort=True) if keys else [((), st)]
    for key, sub in groups:
        k = tuple(str(v) for v in (key if isinstance(key, tuple) else (key,)))
        models[k] = fit_curve(sub["bytes"].to_numpy(), sub["median_us"].to_numpy() * 1e3,
                              **fit_kw)  # type: ignore[arg-type]
    return models


def _key_names(df: pd.DataFrame, by: Sequence[str] | None) -> list[str]:
    return list(by) if by is not None else [*label_keys(df), "op"]


def fit_alpha_beta(
    df: pd.DataFrame,
    *,
    by: Sequence[str] | None = None,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    **fit_kw: float,
) -> pd.DataFrame:
    """Fitted regions as a table: one row per group and region with lo_bytes,
    hi_bytes (measured ends), n_sizes, alpha_us, bandwidth_gbps, beta_ns_per_byte,
    rel_rms (relative residual RMS) and excluded (sizes left out as anomalies)."""
    return models_table(fit_models(df, by=by, kinds=kinds, ops=ops, **fit_kw),
                        _key_names(df, by))


def models_table(models: dict[ModelKey, AlphaBetaModel], names: Sequence[str]
                 ) -> pd.DataFrame:
    """The fit_alpha_beta table of already fitted models (group key column names)."""
    rows = []
    for key, model in models.items():
        for i, reg in enumerate(model.regions):
            rows.append({**dict(zip(names, key)), "region": i, "lo_bytes": reg.lo_bytes,
                         "hi_bytes": reg.hi_bytes, "n_sizes": reg.n_sizes,
                         "alpha_us": reg.alpha_us, "bandwidth_gbps": reg.bandwidth_gbps,
                         "beta_ns_per_byte": reg.beta_ns_per_byte, "rel_rms": reg.rel_rms,
                         "excluded": len(model.excluded)})
    cols = [*names, "region", "lo_bytes", "hi_bytes", "n_sizes", "alpha_us",
            "bandwidth_gbps", "beta_ns_per_byte", "rel_rms", "excluded"]
    return pd.DataFrame(rows, columns=cols)


def predict(model: AlphaBetaModel, nbytes: Sequence[float] | np.ndarray) -> np.ndarray:
    """Model latency in microseconds at the given sizes."""
    return model.predict_ns(nbytes) / 1e3


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """(alpha, beta) of the relative-error fit through these points; None under 2."""
    if x.size < 2:
        return None
    a, b, _ = _Prefix(x, y).fit(0, x.size)
    return a, b


def _leverage(x: np.ndarray, y: np.ndarray, x0: float, p0: float) -> float:
    """Variance of the relative-error fit through (x, y) at x0, in units of
    the points' relative variance (inf under 2 points): small inside the
    points, growing as x0 leaves them (a line through two close sizes says
    little about a size five times larger)."""
    if x.size < 2 or not p0 > 0:
        return math.inf
    xs, ys = float(x.max()) or 1.0, float(y.max())
    u = np.stack([ys / y, (x / xs) * ys / y], axis=1)  # rows of the weighted design
    v = np.array([1.0, x0 / xs])
    return float(v @ np.linalg.pinv(u.T @ u) @ v) * ys * ys / (p0 * p0)


def _loo(model: AlphaBetaModel, x: np.ndarray, y: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reference, leverage, the largest size its line was fitted on) of each
    size with it left out (loo_reference_ns)."""
    ok = np.isfinite(x) & np.isfinite(y) & (y > 0) & ~np.isin(x, np.asarray(model.excluded))
    regs = model.regions
    members = [np.flatnonzero(ok & (x >= r.lo_bytes) & (x <= r.hi_bytes)) for r in regs]
    ref = np.full(x.size, np.nan)
    lev = np.full(x.size, np.inf)
    top = np.full(x.size, np.nan)
    for i in range(x.size):
        xi = float(x[i])
        home = [k for k, r in enumerate(regs) if r.lo_bytes <= xi <= r.hi_bytes]
        if home:  # its region; the next one up; the one below if it was the lowest
            k = home[0]
            lowest = members[k].size > 0 and xi == float(x[members[k]].min())
            cand = [k, k + 1] + ([k - 1] if lowest else [])
        else:  # a gap, or past an end: the nearest region on each side
            lo = [k for k, r in enumerate(regs) if r.hi_bytes < xi]
            cand = ([lo[-1]] if lo else []) + ([lo[-1] + 1] if lo else [0])
        best: tuple[float, np.ndarray] = (-math.inf, np.empty(0, dtype=np.int64))
        for k in cand:
            if not 0 <= k < len(regs):
                continue
            pts = members[k][members[k] != i]
            if pts.size == 0:
                continue
            fit = _line(x[pts], y[pts]) if pts.size < members[k].size else None
            a, b = fit if fit is not None else (regs[k].alpha_ns, regs[k].beta_ns_per_byte)
            if a + b * xi > best[0]:
                best = (a + b * xi, pts)
        if np.isfinite(best[0]):
            ref[i] = best[0]
            lev[i] = _leverage(x[best[1]], y[best[1]], xi, best[0])
            top[i] = float(x[best[1]].max())
    return ref, lev, top


def loo_reference_ns(model: AlphaBetaModel, sizes: Sequence[float] | np.ndarray,
                     latency_ns: Sequence[float] | np.ndarray) -> np.ndarray:
    """Per size: what the model's curve gives it with that size left out (see
    the module docstring).  `sizes`/`latency_ns`: the points the model was
    fitted on (one per size).  A region left with under 2 other sizes keeps
    its fitted line; NaN where no region is left."""
    return _loo(model, np.asarray(sizes, dtype=float), np.asarray(latency_ns, dtype=float))[0]


def _loo_flags(model: AlphaBetaModel, x: np.ndarray, y: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reference ns, ratio, z) of each size left out of its own reference and
    noise scale; z is in units of the scale widened by the reference's own
    uncertainty there (its leverage).  Past the end of its line, a size
    counts only if its time per byte is above the next smaller size's: on one
    algorithm time per byte falls with size, and a curve that bends past the
    last sizes (a faster protocol) is not a cliff (z NaN otherwise)."""
    ref, lev, top = _loo(model, x, y)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = y / ref
        r = np.log(ratio)
    inl = np.isfinite(r) & ~np.isin(x, np.asarray(model.excluded))
    zs = np.full(x.size, np.nan)
    for i in range(x.size):
        others = r[inl & (np.arange(x.size) != i)]
        if others.size < 3 or not np.isfinite(r[i]):
            continue
        smaller = np.flatnonzero(inl & (x < x[i]) & (x > 0))
        if x[i] > top[i] and smaller.size:
            m = smaller[np.argmax(x[smaller])]
            if y[i] / x[i] <= y[m] / x[m]:
                continue
        center = float(np.median(others))
        scale = max(1.4826 * float(np.median(np.abs(others - center))), SCALE_FLOOR)
        zs[i] = (r[i] - center) / (scale * math.sqrt(1.0 + lev[i]))
    return ref, ratio, zs


def anomalies(
    df: pd.DataFrame,
    *,
    by: Sequence[str] | None = None,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    z: float = 3.5,
    min_ratio: float = 1.5,
    models: dict[ModelKey, AlphaBetaModel] | None = None,
    only_flagged: bool = False,
    stats: pd.DataFrame | None = None,
    leave_one_out: bool = True,
) -> pd.DataFrame:
    """Every measured size with its median, the fit, ratio, robust z-score and an
    ``anomalous`` flag (see the module docstring); ``is_pow2`` tells the size class.

    Columns: *by, bytes, is_pow2, calls, median_us, model_us, ratio, z, anomalous.
    ``stats``: a latency_by_size table already computed with the same arguments;
    ``leave_one_out``: also judge each size against the curve without it."""
    if stats is None:
        stats = latency_by_size(df, by=by, kinds=kinds, ops=ops)
    names = _key_names(df, by)
    if models is None:
        models = fit_models(df, by=by, stats=stats, z=z, min_ratio=min_ratio)
    parts = []
    groups = stats.groupby(names, sort=True) if names else [((), stats)]
    for key, sub in groups:
        k = tuple(str(v) for v in (key if isinstance(key, tuple) else (key,)))
        if k not in models:
            raise UsageError(None, f"no model for group {k}")
        m = models[k]
        part = sub[[*names, "bytes", "is_pow2", "calls", "median_us"]].copy()
        part["model_us"] = predict(m, part["bytes"].to_numpy())
        part["ratio"] = part["median_us"] / part["model_us"]
        r = np.log(part["ratio"].to_numpy(dtype=float))
        part["z"] = (r - m.inlier_center) / m.inlier_scale
        part["anomalous"] = (part["ratio"] >= min_ratio) & (part["z"] >= z)
        if leave_one_out and len(part) >= 4:
            ref, ratio, zs = _loo_flags(m, part["bytes"].to_numpy(dtype=float),
                                        part["median_us"].to_numpy(dtype=float) * 1e3)
            loo = (ratio >= min_ratio) & (zs >= z) & ~part["anomalous"].to_numpy(dtype=bool)
            if loo.any():
                part.loc[loo, "model_us"] = ref[loo] / 1e3
                part.loc[loo, "ratio"] = ratio[loo]
                part.loc[loo, "z"] = zs[loo]
                part.loc[loo, "anomalous"] = True
        parts.append(part)
    cols = [*names, "bytes", "is_pow2", "calls", "median_us", "model_us", "ratio", "z",
            "anomalous"]
    out = (pd.concat(parts, ignore_index=True) if parts
           else pd.DataFrame({c: pd.Series(dtype=object) for c in cols}))
    if only_flagged:
        out = out.loc[out["anomalous"].astype(bool)]
    return out[cols].reset_index(drop=True)


def padding_whatif(
    df: pd.DataFrame,
    *,
    to: Literal["pow2"] | int = "pow2",
    by: Sequence[str] | None = None,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    rank: RankSel = "lowest",
    models: dict[ModelKey, AlphaBetaModel] | None = None,
    stats: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Estimated time saved if each message were padded to the next power of two
    (``to="pow2"``) or to the next multiple of ``to`` bytes.

    Calls are counted on one rank (``rank``, as in sizes.size_distribution);
    latencies are per-size medians over all ranks.  Columns: *by, bytes,
    padded_bytes, calls, time_us (median at bytes), padded_us, padded_source
    ("measured" | "model" | "same"), saved_us_per_call, saved_us (x calls)."""
    if not (to == "pow2" or (isinstance(to, (int, np.integer)) and not isinstance(to, bool))):
        raise UsageError(None, f"padding target must be 'pow2' or a byte multiple, got {to!r}")
    if stats is None:
        stats = latency_by_size(df, by=by, kinds=kinds, ops=ops)
    names = _key_names(df, by)
    if models is None:
        models = fit_models(df, by=by, stats=stats)
    counted = select_rank(timed_calls(df, kinds=kinds, ops=ops,
                                      columns=[*names, "rank", "bytes"]), rank)
    cnt = (pd.DataFrame({**{k: keys_of(counted[k]) for k in names},
                         "bytes": counted["bytes"].to_numpy(dtype=np.int64)})
           .groupby([*names, "bytes"], observed=True).size().rename("calls").reset_index())
    for name in names:
        cnt[name] = cnt[name].astype(str)
    cnt = cnt.set_index([*names, "bytes"])["calls"]
    parts = []
    groups = stats.groupby(names, sort=True) if names else [((), stats)]
    for key, sub in groups:
        gk = tuple(str(v) for v in (key if isinstance(key, tuple) else (key,)))
        m = models[gk]
        measured = dict(zip(sub["bytes"].to_numpy().tolist(), sub["median_us"].to_numpy()))
        b = sub["bytes"].to_numpy(dtype=np.int64)
        padded = next_pow2(b) if to == "pow2" else round_up(b, int(to))
        fitted = predict(m, padded)
        padded_us = np.array([measured.get(int(p), f) for p, f in zip(padded, fitted)])
        source = np.where(padded == b, "same",
                          np.where([int(p) in measured for p in padded], "measured", "model"))
        part = sub[[*names, "bytes"]].copy()
        part["padded_bytes"] = padded
        idx = pd.MultiIndex.from_frame(part[[*names, "bytes"]]) if names else part["bytes"]
        part["calls"] = cnt.reindex(idx).fillna(0).to_numpy(dtype=np.int64)
        part["time_us"] = sub["median_us"].to_numpy()
        part["padded_us"] = padded_us
        part["padded_source"] = source
        part["saved_us_per_call"] = part["time_us"] - part["padded_us"]
        part["saved_us"] = part["saved_us_per_call"] * part["calls"]
        parts.append(part)
    cols = [*names, "bytes", "padded_bytes", "calls", "time_us", "padded_us", "padded_source",
            "saved_us_per_call", "saved_us"]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    return pd.concat(parts, ignore_index=True)[cols]


def padding_summary(whatif: pd.DataFrame) -> pd.DataFrame:
    """Totals of a padding_whatif table per group: calls, time_us, saved_us_all (every
    call padded), saved_us_helpful (only sizes that gain), saved_share (helpful /
    time)."""
    names = [c for c in whatif.columns if c not in (
        "bytes", "padded_bytes", "calls", "time_us", "padded_us", "padded_source",
        "saved_us_per_call", "saved_us")]
    w = whatif.assign(total_us=whatif["time_us"] * whatif["calls"],
                      helpful=whatif["saved_us"].clip(lower=0))
    g = w.groupby(names, sort=True) if names else w.groupby(lambda _: 0)
    out = g.agg(calls=("calls", "sum"), time_us=("total_us", "sum"),
                saved_us_all=("saved_us", "sum"), saved_us_helpful=("helpful", "sum"))
    out["saved_share"] = np.where(out["time_us"] > 0, out["saved_us_helpful"] / out["time_us"],
                                  0.0)
    return out.reset_index(drop=not names)
