"""The profiler's settings read from the environment on the Python side.

A value that cannot be used is said once per process, on one line
(`horovod-profiler: warning: ignoring NAME='value' (what is expected): what is
done instead`), and the default is used: a setting never stops a job.  The C
library does the same for the variables it reads (hooks/core.c env_check).
Kept free of heavy imports: read at interpreter start-up and at exit."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

from profiler.errors import ProfilerError, printable

T = TypeVar("T")
_said: set[str] = set()


def setting(name: str, default: T, parse: Callable[[str], T], expected: str, *,
            instead: str | None = None, speak: bool = True) -> T:
    """`parse(value)` of the variable, or `default` when it is unset or empty, or
    when parse raises ValueError / ProfilerError (then said once unless
    `speak` is False: ranks other than 0 stay quiet)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except (ValueError, ProfilerError):
        if speak and name not in _said:
            _said.add(name)
            print(f"horovod-profiler: warning: ignoring {name}={printable(repr(raw))} "
                  f"({expected}): {instead or f'using {default}'}", file=sys.stderr)
        return default


def at_least(lo: float, kind: Callable[[str], T]) -> Callable[[str], T]:
    """A parser: `kind(value)`, refused (ValueError) below `lo`."""
    def parse(raw: str) -> T:
        v = kind(raw)
        if not v >= lo:  # type: ignore[operator]  # (NaN too)
            raise ValueError(raw)
        return v
    return parse
