"""Horovod's tuning variables as Horovod itself reads them.

Horovod 0.28 (horovod/common/operations.cc, BackgroundThreadLoop) reads
HOROVOD_FUSION_THRESHOLD and HOROVOD_CACHE_CAPACITY with C's ``strtol(s,
nullptr, 10)`` and HOROVOD_CYCLE_TIME with ``strtof(s, nullptr)``: leading
white space and a sign are accepted, the number ends at the first character
that cannot continue it, and a text with no number reads as 0.  So
``HOROVOD_FUSION_THRESHOLD=64MB`` is a threshold of 64 bytes (fusion all but
off), ``HOROVOD_CYCLE_TIME=5ms`` is 5 ms, and an empty or misspelt value is
0, with no warning from Horovod.  A variable that is not set keeps Horovod's
default.  :func:`settings` returns the values Horovod ran with and says which
texts it read only in part (:attr:`HorovodSettings.misread`), so that the
what-if replays the job that ran and a finding can say what was meant.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HorovodSettings", "settings", "c_strtol", "c_strtof", "DEFAULT_FUSION_THRESHOLD",
           "DEFAULT_CYCLE_MS", "DEFAULT_CACHE_CAPACITY"]

DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024
DEFAULT_CYCLE_MS = 1.0
DEFAULT_CACHE_CAPACITY = 1024

_INT = re.compile(r"\s*([+-]?\d+)")
_FLOAT = re.compile(r"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))",
                    re.IGNORECASE)
_LONG_MAX = (1 << 63) - 1


def c_strtol(text: str) -> tuple[int, bool]:
    """strtol(text, nullptr, 10) on a 64-bit long (clamped at its range, as
    strtol saturates), and whether the whole text (white space aside) was
    that number."""
    m = _INT.match(text)
    if m is None:
        return 0, False
    value = max(-_LONG_MAX - 1, min(_LONG_MAX, int(m.group(1))))
    return value, text[m.end():].strip() == ""


def c_strtof(text: str) -> tuple[float, bool]:
    """strtof(text, nullptr) (decimal forms, inf and nan; not C's hexadecimal
    floats), and whether the whole text (white space aside) was that number."""
    m = _FLOAT.match(text)
    if m is None:
        return 0.0, False
    return float(m.group(1)), text[m.end():].strip() == ""


@dataclass(frozen=True)
class HorovodSettings:
    fusion_threshold: int = DEFAULT_FUSION_THRESHOLD  # bytes; 0 = fusion off
    cycle_time_ms: float = DEFAULT_CYCLE_MS
    cache_capacity: int = DEFAULT_CACHE_CAPACITY
    #: one sentence per variable whose text Horovod read otherwise than it
    #: reads to a person ("HOROVOD_FUSION_THRESHOLD='64MB' is 64 bytes to
    #: Horovod (strtol reads the leading digits)")
    misread: list[str] = field(default_factory=list)


def _misread(name: str, raw: str, meaning: str, why: str) -> str:
    return f"{name}={raw!r} is {meaning} to Horovod ({why})"


def _strtol_setting(env: Mapping[str, Any], name: str, default: int, misread: list[str],
                    store: Callable[[int], int], unit: str, off: str, negative: str) -> int:
    """One of Horovod's strtol-read variables: `store` maps strtol's value to
    what Horovod keeps; a text Horovod read otherwise than a person would is
    said in `misread` (`unit` names a kept value, `off` the kept 0,
    `negative` why a negative value means something else)."""
    raw = env.get(name)
    if raw is None:
        return default
    text = str(raw)
    value, whole = c_strtol(text)
    kept = store(value)
    if not whole or value < 0:
        why = ("there is no number at its start" if _INT.match(text) is None
               else "strtol reads its leading digits" if not whole else negative)
        misread.append(_misread(name, text, f"{kept} {unit}" if kept else off, why))
    return kept


def settings(env: Mapping[str, Any] | None) -> HorovodSettings:
    """What Horovod ran with, from a rank's recorded environment (absent
    variables: Horovod's defaults)."""
    env = env or {}
    misread: list[str] = []
    threshold = _strtol_setting(env, "HOROVOD_FUSION_THRESHOLD", DEFAULT_FUSION_THRESHOLD,
                                misread, lambda v: max(0, v), "bytes", "0 (fusion off)",
                                "a negative threshold fuses nothing")
    cycle = DEFAULT_CYCLE_MS
    raw = env.get("HOROVOD_CYCLE_TIME")
    if raw is not None:
        text = str(raw)
        fvalue, whole = c_strtof(text)
        cycle = fvalue if math.isfinite(fvalue) and fvalue > 0 else 0.0
        if not math.isfinite(fvalue):  # sleep_for an infinite or NaN duration
            misread.append(f"HOROVOD_CYCLE_TIME={text!r} is no finite cycle time to Horovod "
                           "(its sleep is then undefined; replayed here as 0 ms)")
        elif not whole or cycle != fvalue:
            why = ("there is no number at its start" if _FLOAT.match(text) is None
                   else "strtof reads its leading number" if not whole
                   else "a negative cycle sleeps 0 ms")
            misread.append(_misread("HOROVOD_CYCLE_TIME", text, f"{cycle:g} ms", why))
    capacity = _strtol_setting(env, "HOROVOD_CACHE_CAPACITY", DEFAULT_CACHE_CAPACITY, misread,
                               lambda v: v & 0xFFFFFFFF,  # stored in a uint32_t
                               "entries", "0 (cache off)",
                               "a negative value wraps around in its 32-bit unsigned capacity")
    return HorovodSettings(threshold, cycle, capacity, misread)
