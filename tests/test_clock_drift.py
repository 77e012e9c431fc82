"""The reader's drift rule (profiler.formats.clock.clock_drift_ppm / agreed_offset_ns /
offset_ns_at): drift is applied only when the two offset measurements differ by
more than their error bounds allow; otherwise one offset, consistent with both."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.formats import clock as D

S = 1_000_000_000


def header(o0: int, e0: int, at0: int, o1: int | None = None, e1: int = 0,
           at1: int = 0) -> dict[str, int]:
    h = {"offset_ns": o0, "offset_err_ns": e0, "offset_at_ns": at0, "job_t0_ns": 0,
         "clock_kind": 2}
    if o1 is not None:
        h.update(offset_end_ns=o1, offset_end_err_ns=e1, offset_end_at_ns=at1)
    return h


def test_the_issue_case_is_not_drift() -> None:
    # issue 15: 4999.99951 s (bound 2.05 ms) at MPI_Init, 5000.0000015 s at
    # MPI_Finalize 0.74 s later: 662 ppm if taken at face value, but the two
    # agree within their bounds, and the clocks do not drift
    h = header(4_999_999_510_000, 2_050_000, 10 * S, 5_000_000_001_500, 3_000,
               10 * S + 740_000_000)
    assert D.clock_drift_ppm(h) == 0.0
    off, err = D.agreed_offset_ns(h)
    assert abs(off - 5000 * S) <= err <= 3_000  # the better measurement rules
    t = np.array([10 * S, 10 * S + 500_000_000, 11 * S])
    assert D.offset_ns_at(t, h) == off
    assert D.ticks_to_job_ns(t, h).tolist() == (t - off).tolist()


def test_significant_drift_is_applied() -> None:
    # 50 ppm over 10 s = 500 us, bounds 10 us each: drift
    h = header(1000, 10_000, 1 * S, 501_000, 10_000, 11 * S)
    assert D.clock_drift_ppm(h) == pytest.approx(50.0)
    t = np.array([1 * S, 6 * S, 11 * S])
    assert D.offset_ns_at(t, h).tolist() == [1000, 251_000, 501_000]


def test_drift_within_the_bounds_is_not_reported() -> None:
    # the same 50 ppm over a 1 s run (50 us) with 30 us bounds: not significant
    h = header(1000, 30_000, 1 * S, 51_000, 30_000, 2 * S)
    assert D.clock_drift_ppm(h) == 0.0
    off, err = D.agreed_offset_ns(h)
    assert (off, err) == (26_000, 5_000)  # [21000, 31000]: consistent with both
    # ... but just beyond them, it is
    h["offset_end_ns"] = 1000 + 60_001
    assert D.clock_drift_ppm(h) == pytest.approx(60.001)


def test_reference_one_measurement_and_stepped_clocks() -> None:
    assert D.clock_drift_ppm(header(0, 0, S, 0, 0, 2 * S)) == 0.0  # rank 0
    assert D.agreed_offset_ns(header(0, 0, S, 0, 0, 2 * S)) == (0, 0)
    one = header(777 * S, 20_000, S)
    assert D.clock_drift_ppm(one) is None
    assert D.agreed_offset_ns(one) == (777 * S, 20_000)
    stepped = header(1000, 100, S, 1000 + 20_000_000, 100, 11 * S)  # 2000 ppm
    assert D.clock_drift_ppm(stepped) is None
    assert D.offset_ns_at(np.array([S]), stepped) == 1000
