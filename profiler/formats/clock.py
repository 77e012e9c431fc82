"""Clock maths: raw ticks -> this rank's CLOCK_MONOTONIC ns -> the job axis
(rank 0's clock, 0 = rank 0's MPI_Init return), the offset moved linearly
between its measurements at MPI_Init and MPI_Finalize."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


# ---------------------------------------------------------------------------
# time conversion
# ---------------------------------------------------------------------------
def ns_per_tick(header: Mapping[str, Any]) -> float:
    """Nanoseconds per raw tick: 1 for CLOCK_MONOTONIC, else from the calibration
    pairs (cal1 later than cal0), else 1 / ticks_per_ns."""
    if int(header.get("clock_kind", 0)) == 2:
        return 1.0
    c0t, c0n = int(header["cal0_ticks"]), int(header["cal0_mono_ns"])
    c1t, c1n = int(header["cal1_ticks"]), int(header["cal1_mono_ns"])
    if c1t > c0t and c1n > c0n:
        return (c1n - c0n) / (c1t - c0t)
    tpn = float(header.get("ticks_per_ns") or 0.0)
    return 1.0 / tpn if tpn > 0 else 1.0


def ticks_to_mono_ns(ticks: np.ndarray, header: Mapping[str, Any]) -> np.ndarray:
    """Raw ticks -> this rank's CLOCK_MONOTONIC nanoseconds (int64).

    With two calibration pairs (cal1 later than cal0) the slope comes from
    them; otherwise from ticks_per_ns.  CLOCK_MONOTONIC ticks are already ns.
    """
    t = np.asarray(ticks).astype(np.int64, copy=False)
    if int(header.get("clock_kind", 0)) == 2:
        return t.copy()
    c0t, c0n = int(header["cal0_ticks"]), int(header["cal0_mono_ns"])
    return c0n + np.rint((t - c0t) * ns_per_tick(header)).astype(np.int64)


# Clocks of different hosts drift apart by at most a few hundred ppm (NTP
# keeps them within 500 ppm); a larger drift between the two measurements is
# a corrupt header or a stepped clock: the start-up offset is used alone.
MAX_DRIFT_PPM = 1000.0


def clock_drift_ppm(header: Mapping[str, Any]) -> float | None:
    """How fast this rank's clock ran against rank 0's between the offset
    measurements at MPI_Init and MPI_Finalize (parts per million; None when it
    was measured once: one host, or an older file).

    Drift is reported only when it is significant: the two offsets must differ
    by more than the sum of their error bounds (offset_err_ns,
    offset_end_err_ns), so that no offset consistent with both measurements
    stands still over the run.  Otherwise the clocks are not known to drift
    over this run's length and the drift is 0.0 (see offset_ns_at)."""
    t0, t1 = int(header.get("offset_at_ns") or 0), int(header.get("offset_end_at_ns") or 0)
    if t0 <= 0 or t1 <= t0:
        return None
    d = int(header.get("offset_end_ns") or 0) - int(header["offset_ns"])
    bound = (abs(int(header.get("offset_err_ns") or 0))
             + abs(int(header.get("offset_end_err_ns") or 0)))
    if abs(d) <= bound:
        return 0.0
    ppm = d / (t1 - t0) * 1e6
    return ppm if abs(ppm) <= MAX_DRIFT_PPM else None


def agreed_offset_ns(header: Mapping[str, Any]) -> tuple[int, int]:
    """(offset, error bound) of this rank's clock to rank 0's when it does not
    drift: the middle of the offsets consistent with both measurements (the
    intersection of [offset +- err] at MPI_Init and at MPI_Finalize), or the
    start-up measurement alone when there is one measurement, the two do not
    agree, or the drift was refused (clock_drift_ppm)."""
    o0, e0 = int(header["offset_ns"]), abs(int(header.get("offset_err_ns") or 0))
    if clock_drift_ppm(header) != 0.0 or not int(header.get("offset_end_at_ns") or 0):
        return o0, e0
    o1, e1 = int(header.get("offset_end_ns") or 0), abs(int(header.get("offset_end_err_ns") or 0))
    lo, hi = max(o0 - e0, o1 - e1), min(o0 + e0, o1 + e1)
    if lo > hi:
        return o0, e0
    return (lo + hi) // 2, (hi - lo + 1) // 2


def offset_ns_at(mono_ns: np.ndarray, header: Mapping[str, Any]) -> np.ndarray | int:
    """This rank's offset to rank 0's clock at its own CLOCK_MONOTONIC times:
    with significant drift (clock_drift_ppm), the start-up offset moved
    linearly to the one measured at MPI_Finalize; without, one offset for the
    run, the best that both measurements allow (agreed_offset_ns)."""
    ppm = clock_drift_ppm(header)
    if ppm is None or ppm == 0.0:
        return agreed_offset_ns(header)[0]
    o0 = int(header["offset_ns"])
    t0 = int(header["offset_at_ns"])
    return o0 + np.rint((np.asarray(mono_ns) - t0) * (ppm * 1e-6)).astype(np.int64)


def ticks_to_job_ns(ticks: np.ndarray, header: Mapping[str, Any]) -> np.ndarray:
    """Raw ticks -> job axis: rank 0's monotonic clock minus job_t0_ns (this rank's
    clock offset applied, interpolated between its two measurements)."""
    mono = ticks_to_mono_ns(ticks, header)
    return mono - offset_ns_at(mono, header) - int(header["job_t0_ns"])
