"""Typed errors for bad input.

Every error the profiler raises for input it cannot use is a `ProfilerError`
carrying the offending path and a one-line message.  The CLI turns it into
`profiler: error: <path>: <message>` and exit status 2 (docs/ARCHITECTURE.md
section 5); library users can catch the subclasses.
"""

from __future__ import annotations

import os
import sys

# Path-like argument type (re-exported for other modules).  No `typing` import
# on 3.10+: this module is imported at interpreter start when profiling.
if sys.version_info >= (3, 10):
    PathLike = str | os.PathLike[str]
else:  # pragma: no cover
    from typing import Union

    PathLike = Union[str, "os.PathLike[str]"]


# C0 and C1 control characters and DEL -> a visible \xNN: names and paths come
# from the application (MPI_Comm_set_name, thread names, the host name) or from
# files written elsewhere, and reach terminals and HTML; an escape sequence in
# one must never act there.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


def printable(text: str) -> str:
    """`text` with its control characters spelled \\xNN (idempotent)."""
    return text.translate(_CONTROL)


class ProfilerError(Exception):
    """Bad input for the profiler: a path and a one-line message."""

    def __init__(self, path: PathLike | None, message: str) -> None:
        self.path = os.fspath(path) if path is not None else None
        # One line, always: newlines in a message would break the CLI convention,
        # and control characters (from a path or a name in a file) would act on
        # the terminal.
        self.message = printable(" ".join(str(message).split()))
        super().__init__(self.line())

    def line(self) -> str:
        """`<path>: <message>`, or just the message when there is no path."""
        return f"{printable(self.path)}: {self.message}" if self.path else self.message


class NotFoundError(ProfilerError):
    """The path does not exist (or is not the kind of file expected)."""


class NotATraceError(ProfilerError):
    """The file exists but is not a horovod-profiler trace / raw file / dataset."""


class TruncatedError(ProfilerError):
    """The file ends before its own header says it should."""


class CorruptError(ProfilerError):
    """The file has the right magic but inconsistent contents."""


class VersionError(ProfilerError):
    """The file was written by a different (usually newer) format version."""


class LayoutError(ProfilerError):
    """The record/header layout of the file differs from this reader's."""


class EmptyProfileError(ProfilerError):
    """A profile directory holds no raw file, parquet file or trace."""


class LibraryError(ProfilerError):
    """The interposition library cannot be found or loaded."""


class UsageError(ProfilerError):
    """An argument value the command cannot use (unknown column, bad rank...)."""
