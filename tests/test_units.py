"""profiler.units: one rounding rule per quantity, at the boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.units import fmt_bw, fmt_bytes, fmt_ns, fmt_number, fmt_us


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (8, "8 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (4096, "4 KiB"), (1024 * 1024 - 1, "1.0 MiB"),  # rounds up: the next unit
    (1023.6, "1.0 KiB"), (3 << 19, "1.5 MiB"), (1 << 20, "1 MiB"), (5 << 30, "5 GiB"),
    (1 << 40, "1 TiB"), (1 << 50, "1 PiB"), (3 << 60, "3072 PiB"), (np.int64(2048), "2 KiB"),
    (-2048, "-2 KiB"), (-100, "-100 B"), (float("nan"), "-"), (None, "-"),
])
def test_fmt_bytes(n: object, text: str) -> None:
    assert fmt_bytes(n) == text


@pytest.mark.parametrize("us, text", [
    (0, "0.00 us"), (0.05, "0.05 us"), (0.004, "0.00 us"), (12.3456, "12.35 us"),
    (99.99, "99.99 us"), (99.996, "100.0 us"), (100, "100.0 us"), (999.9, "999.9 us"),
    (999.96, "1.00 ms"), (1000, "1.00 ms"), (1234.6, "1.23 ms"),
    (999_994, "999.99 ms"), (999_996, "1.00 s"), (2.5e6, "2.50 s"), (3.6e9, "3600.00 s"),
    (-3.5, "-3.50 us"), (-0.001, "0.00 us"), (float("nan"), "-"), (None, "-"),
    (np.float64(250.0), "250.0 us"),
])
def test_fmt_us(us: object, text: str) -> None:
    assert fmt_us(us) == text


def test_fmt_ns() -> None:
    assert fmt_ns(3500) == "3.50 us"
    assert fmt_ns(1_500_000) == "1.50 ms"
    assert fmt_ns(float("nan")) == "-"


@pytest.mark.parametrize("v, text", [
    (0, "0.000"), (1.23456, "1.235"), (9.9994, "9.999"), (9.9996, "10.0"), (10, "10.0"),
    (123.456, "123.5"), (float("nan"), "-"), (-1.5, "-1.500"),
])
def test_fmt_bw(v: object, text: str) -> None:
    assert fmt_bw(v) == text


@pytest.mark.parametrize("v, text", [
    (0, "0"), (0.0123456, "0.0123"), (1.5, "1.5"), (2.0, "2"), (42, "42"), (99.94, "99.9"),
    (99.96, "100.0"), (123.46, "123.5"),
    (9999.94, "9999.9"), (9999.96, "10,000"), (12345.6, "12,346"), (1.234e-5, "0.000012"),
    (1e-12, "< 0.000001"), (-1e-12, "> -0.000001"), (-0.5, "-0.5"), (-12345, "-12,345"),
    (float("nan"), "-"), (None, "-"), (np.float32(0.25), "0.25"),
])
def test_fmt_number(v: object, text: str) -> None:
    assert fmt_number(v) == text


@pytest.mark.parametrize("v", [1e-300, 1e-7, 3.3e-5, 0.5, 7.0, 1e5, 1.5e12, 1e300])
def test_never_e_notation(v: float) -> None:
    for f in (fmt_bytes, fmt_us, fmt_bw, fmt_number):
        assert "e" not in f(v), (f.__name__, v)


def test_ms_and_shares() -> None:
    from profiler.units import fmt_ms, fmt_share

    assert fmt_ms(3.3) == "3.30 ms"
    assert fmt_ms(0.0005) == "0.50 us"
    assert fmt_ms(float("nan")) == "-"
    assert fmt_share(0.59) == "59%"
    assert fmt_share(0.025) == "2.5%"
    assert fmt_share(0.0999) == "10%"
    assert fmt_share(0.0001) == "< 0.1%"
    assert fmt_share(0) == "0%"
