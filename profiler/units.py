"""Numbers and sizes as a person reads them: one rounding rule per quantity.

Every table, label and sentence the profiler prints (terminal, the text cells
of CSV and JSON output such as size-bucket labels, the HTML report) formats
its sizes, durations, bandwidths and plain numbers here, so the same value
reads the same everywhere.  Nothing here uses e-notation.

* sizes (:func:`fmt_bytes`): binary units; a whole number of units without a
  decimal (``4 KiB``), otherwise one decimal (``1.5 MiB``); below 1 KiB whole
  bytes (``1023 B``);
* durations in microseconds (:func:`fmt_us`): two decimals below 100 us, one
  decimal up to 1 ms, then ``ms`` and ``s`` with two decimals;
* bandwidths in GB/s (:func:`fmt_bw`): three decimals below 10, one above;
* other numbers (:func:`fmt_number`): three significant digits below 100
  (trailing zeros dropped), one decimal up to 10,000, then whole numbers with
  thousands separators; magnitudes below one millionth read ``< 0.000001``.

A value whose rounding reaches the next range is written in that range
(999.96 us is ``1.00 ms``, not ``1000.0 us``).  NaN and None read ``-``.
Base layer: imports nothing from the project.
"""

from __future__ import annotations

import math
from typing import Any

KIB = 1024
_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")
# (upper bound, scale, decimals, unit) for durations given in microseconds
_TIME_RULES = ((100.0, 1.0, 2, "us"), (1e3, 1.0, 1, "us"), (1e6, 1e3, 2, "ms"),
               (math.inf, 1e6, 2, "s"))
_BW_RULES = ((10.0, 3), (math.inf, 1))
_TINY = 1e-6
NA = "-"


def _missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False


def _sign(v: float) -> str:
    return "-" if v < 0 else ""


def fmt_bytes(n: Any) -> str:
    """A size in bytes: ``0 B``, ``1023 B``, ``1 KiB``, ``1.5 MiB``, ``-2 KiB``."""
    if _missing(n):
        return NA
    v = float(n)
    if math.isinf(v):
        return f"{_sign(v)}inf B"
    a = abs(v)
    if round(a) < KIB:
        return f"{_sign(v)}{a:.0f} B"
    scaled = a
    for i, unit in enumerate(_BYTE_UNITS):
        scaled /= KIB
        last = i == len(_BYTE_UNITS) - 1
        if scaled == int(scaled):
            text = f"{scaled:.0f}"
        else:
            text = f"{scaled:.1f}"
        if float(text) < KIB or last:
            return f"{_sign(v)}{text} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def fmt_us(us: Any) -> str:
    """A duration given in microseconds: ``0.05 us``, ``999.9 us``, ``1.00 ms``,
    ``2.50 s``."""
    if _missing(us):
        return NA
    v = float(us)
    if math.isinf(v):
        return f"{_sign(v)}inf s"
    a = abs(v)
    for limit, scale, decimals, unit in _TIME_RULES:
        text = f"{a / scale:.{decimals}f}"
        if float(text) * scale < limit:
            return f"{_sign(v) if float(text) else ''}{text} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def fmt_ns(ns: Any) -> str:
    """A duration given in nanoseconds, written as :func:`fmt_us` writes it."""
    return NA if _missing(ns) else fmt_us(float(ns) / 1e3)


def fmt_bw(gbps: Any) -> str:
    """A bandwidth in GB/s (the unit is in the column header): ``9.876``, ``12.3``."""
    if _missing(gbps):
        return NA
    v = float(gbps)
    if math.isinf(v):
        return f"{_sign(v)}inf"
    a = abs(v)
    for limit, decimals in _BW_RULES:
        text = f"{a:.{decimals}f}"
        if float(text) < limit:
            break
    return f"{_sign(v) if float(text) else ''}{text}"


def fmt_number(x: Any) -> str:
    """A plain number: ``0.0123``, ``1.5``, ``42``, ``123.4``, ``12,345``."""
    if _missing(x):
        return NA
    v = float(x)
    if math.isinf(v):
        return f"{_sign(v)}inf"
    a = abs(v)
    if a == 0:
        return "0"
    if a < _TINY:
        return "< 0.000001" if v > 0 else "> -0.000001"
    if a < 100:
        decimals = min(6, max(0, 2 - math.floor(math.log10(a))))
        text = f"{a:.{decimals}f}"
        if float(text) < 100:
            if "." in text:
                text = text.rstrip("0").rstrip(".")
            return f"{_sign(v)}{text}"
    text = f"{a:.1f}"
    if float(text) < 1e4:
        return f"{_sign(v)}{text}"
    return f"{_sign(v)}{a:,.0f}"


def fmt_count(n: Any) -> str:
    """A count of things: ``7``, ``5,338``."""
    return NA if _missing(n) else f"{int(n):,}"


def fmt_ms(ms: Any) -> str:
    """A duration given in milliseconds, written as :func:`fmt_us` writes it."""
    return NA if _missing(ms) else fmt_us(float(ms) * 1e3)


def fmt_share(x: Any) -> str:
    """A fraction as a percentage: ``59%`` from 10% up, one decimal below
    (``2.5%``), ``< 0.1%`` for a tiny non-zero share."""
    if _missing(x):
        return NA
    p = float(x) * 100
    if p == 0:
        return "0%"
    if abs(p) < 0.05:
        return "< 0.1%" if p > 0 else "> -0.1%"
    return f"{p:.0f}%" if abs(p) >= 9.95 else f"{p:.1f}%"
