"""Option values shared by several commands: rank lists (profiler.layout.parse_ranges),
step spans, name lists, time windows.  Each a one-line UsageError when malformed."""

from __future__ import annotations

from profiler.errors import UsageError
from profiler.layout import parse_ranges

__all__ = ["parse_ranges", "parse_span", "parse_names", "parse_time_ms"]


def parse_span(text: str, what: str = "--steps") -> tuple[int, int]:
    """'10-20' -> (10, 20); '7' -> (7, 7)."""
    lo_s, sep, hi_s = text.strip().partition("-")
    try:
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
    except ValueError:
        raise UsageError(None, f"{what}: {text!r} is not N or A-B") from None
    if lo < 0 or hi < lo:
        raise UsageError(None, f"{what}: bad range {text!r}")
    return lo, hi


def parse_names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise UsageError(None, "empty name list")
    return names


def parse_time_ms(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    try:
        lo, hi = float(a), float(b)
    except ValueError:
        raise UsageError(None, f"--time-ms: {text!r} is not A:B (milliseconds)") from None
    if not sep or hi <= lo:
        raise UsageError(None, f"--time-ms: {text!r} is not an interval A:B with A < B")
    return int(round(lo * 1e6)), int(round(hi * 1e6))
