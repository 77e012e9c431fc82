"""The profiler's settings read from the environment on the Python side.

A value that cannot be used is said once per process, on one line
(`horovod-profiler: warning: ignoring NAME='value' (what is expected): what is
done instead`), and the default is used: a setting never stops a job.  The C
library does the same for the variables it reads (hooks/core_open.c env_check).
Kept free of heavy imports: read at interpreter start-up and at exit."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from profiler.errors import ProfilerError, printable

T = TypeVar("T")
_said: set[str] = set()


def setting(name: str, default: T, parse: Callable[[str], T], expected: str, *,
            instead: str | None = None, speak: bool = True) -> T:
    """`parse(value)` of the variable, or `default` when it is unset or empty, or
    when parse raises ValueError / ProfilerError (then said once unless
    `speak` is False: ranks other than 0 stay quiet).  `name` must be in
    SETTINGS (KeyError otherwise: a variable is defined there first)."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not in profiler._env.SETTINGS")
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


# ---------------------------------------------------------------- the table


class Setting(NamedTuple):
    """One variable the profiler reads: its name, what it takes, its default,
    what it does, and which side reads it ("C": the interposition library,
    hooks/; "Python": the package; "both").  For a number or a choice, also
    as the code uses them: `value` (the default; None where it is computed
    or there is none), the inclusive range `lo`..`hi` (None: open), and the
    `choices` a switch or a mode takes.  Python reads them through `read`;
    tests/test_settings.py checks the C side's ranges, choices and defaults
    against them."""

    name: str
    takes: str
    default: str
    meaning: str
    side: str
    value: float | bool | str | None = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()


#: Every variable the profiler reads, defined once: tests/test_settings.py
#: checks it against the names that hooks/ and the package read, and the
#: documentation's environment page is generated from it (docs/hooks.py).
SETTINGS: tuple[Setting, ...] = (
    Setting("HOROVOD_PROFILE", "1, summary, 0/off", "off",
            "1 turns profiling on; summary keeps per-(op, communicator, size) aggregates "
            "with latency histograms instead of every call", "both"),
    Setting("HOROVOD_PROFILE_DIR", "a path", "./horovod-profile-<date>-<time>-<job id>",
            "the profile directory", "both"),
    Setting("HOROVOD_PROFILE_BATCH_SIZE", "an integer >= 0", "unknown",
            "images per rank per step, for steps a framework hook finds: PyTorch's "
            "DistributedOptimizer, TensorFlow's tf.function and gradient tape (over the "
            "batch they infer; one line says when a step's images are unknown)", "Python"),
    Setting("HOROVOD_PROFILE_SAMPLE_STEPS", "N >= 1", "1",
            "record one training step in N (the others' calls are counted, not recorded); "
            "it, HOROVOD_PROFILE_WINDOW and profiler.sampling() combine: a call is "
            "recorded when none of them pauses it", "Python", value=1, lo=1),
    Setting("HOROVOD_PROFILE_WINDOW", "A:B or A: (seconds)", "the whole run",
            "record only from A to B seconds after start", "C"),
    Setting("HOROVOD_PROFILE_CHUNK_KB", "KiB", "256",
            "size of each thread's record buffer, which is one chunk of the raw file", "C",
            value=256, lo=4, hi=1 << 20),
    Setting("HOROVOD_PROFILE_FLUSH_MS", "ms", "100",
            "how often the helper thread writes the buffers out: the most a SIGKILL can "
            "lose (fatal signals flush first)", "C", value=100, lo=1, hi=60000),
    Setting("HOROVOD_PROFILE_CPU", "K, steps (0 to 1000000)", "16",
            "read each thread's CPU and run-queue time at every step of the first 64, then "
            "at one step in K (4-5 system calls a step read); 1 reads every step, 0 none, "
            "and leaves out the CPU contention findings", "C", value=16, lo=0, hi=1_000_000),
    Setting("HOROVOD_PROFILE_HELPER", "0 or 1", "1",
            "0: no helper thread; each thread writes its own full buffers", "C", value="1",
            choices=("0", "1")),
    Setting("HOROVOD_PROFILE_SIGNALS", "0 or 1", "1",
            "0: fatal signals (SIGSEGV, SIGTERM, ...) do not flush the buffers first", "C",
            value="1", choices=("0", "1")),
    Setting("HOROVOD_PROFILE_CLOCK", "tsc, monotonic or auto", "auto (the TSC where it is "
            "invariant)", "the records' clock", "C", value="auto",
            choices=("tsc", "monotonic", "auto")),
    Setting("HOROVOD_PROFILE_CLOCK_SYNC", "host or rank", "host",
            "rank: every rank measures its own clock offset, as if each had its own host",
            "C", value="host", choices=("host", "rank")),
    Setting("HOROVOD_PROFILE_TIMELINE", "0/off or 1/on", "0",
            "1: also write Horovod's own timeline into the profile directory (costs "
            "throughput; the lineage gains negotiation and wait-for-data phases)", "both",
            value="0", choices=("0", "off", "1", "on")),
    Setting("HOROVOD_PROFILE_HANG_S", "seconds >= 0", "120",
            "seconds a collective may stay in flight before the watchdog writes a hang "
            "snapshot; 0 turns the watchdog off", "Python", value=120.0, lo=0.0),
    Setting("HOROVOD_PROFILE_MERGE", "0 or 1", "1",
            "0: rank 0 builds no trace.json at exit, and one line says to run "
            "`profiler merge DIR`", "both", value=True, choices=("0", "1")),
    Setting("HOROVOD_PROFILE_MERGE_TIMEOUT", "seconds >= 0", "60",
            "how long rank 0 waits at exit for the other ranks' files; a program without "
            "Python waits for its merge this long plus 30 s, then leaves it running", "both",
            value=60.0, lo=0.0),
    Setting("HOROVOD_PROFILE_STORE", "a directory or a postgresql:// URL", "none",
            "where each job's record also goes (docs/guide/site.md); the record is always "
            "written beside the profile (job-record.json)", "Python"),
    Setting("HOROVOD_PROFILE_RECORD_TIMEOUT", "seconds >= 0", "20",
            "how long the exit merge waits for the job record (made where "
            "HOROVOD_PROFILE_STORE names a store); 0 makes none", "Python", value=20.0,
            lo=0.0),
    Setting("HOROVOD_PROFILE_TRACE_EVENTS", "an integer >= 0", "500000",
            "at most this many call events in trace.json (the parquet files hold every "
            "call); above it, a window of ranks and steps", "Python", value=500_000, lo=0),
    Setting("HOROVOD_PROFILE_TRACE_RANKS", "an integer >= 1", "8",
            "ranks in trace.json's window (the first ones plus likely stragglers)", "Python",
            value=8, lo=1),
    Setting("HOROVOD_PROFILE_TRACE_STEPS", "an integer >= 1", "10",
            "middle steps in trace.json's window", "Python", value=10, lo=1),
    Setting("HOROVOD_PROFILE_TF_KERNELS", "0 or 1", "1",
            "0: TensorFlow's tensors are not recorded in Horovod's kernels (the kernel "
            "hooks are not loaded: no lineage, fusion what-if or hang diagnosis by tensor "
            "for TensorFlow jobs)", "Python", value=True, choices=("0", "1")),
    Setting("HOROVOD_PROFILE_FASTREC", "0 or 1", "1",
            "0: the tensor hooks in Python and the step hook through ctypes instead of "
            "the C extension (the same records, at about three times the cost)", "Python",
            value=True, choices=("0", "1")),
    Setting("HOROVOD_PROFILE_ANALYSIS_MEMORY", "DuckDB's memory_limit (4GB)", "DuckDB's own",
            "caps the memory of the analysis engine over large datasets", "Python"),
    Setting("HOROVOD_PROFILE_NCCL_DEVICE", "0 or 1", "1",
            "0: NCCL calls keep host times only (no CUDA events)", "C", value=1, lo=0, hi=1),
    Setting("HOROVOD_PROFILE_NCCL_EVENTS", "2 to 65536", "1024",
            "CUDA event pairs per device for NCCL calls' device times", "C", value=1024, lo=2,
            hi=65536),
    Setting("HOROVOD_PROFILE_NCCL_POLL_MS", "ms", "5",
            "how often the device-time thread polls the events", "C", value=5, lo=0,
            hi=10000),
    Setting("HOROVOD_PROFILE_NCCL_ANCHOR_MS", "ms", "1000",
            "how old the device-to-host clock anchor may get before it is re-taken", "C",
            value=1000, lo=1, hi=3_600_000),
    Setting("HOROVOD_PROFILE_NCCL_FLUSH_MS", "ms", "1000",
            "how long the exit waits for device times still in flight", "C", value=1000, lo=0,
            hi=600_000),
    Setting("HOROVOD_PROFILE_NCCL_WRAPPERS", "0 or 1", "1",
            "0: no ncclAllReduce (and siblings) wrappers; NCCL's profiler plugin only",
            "C"),
    Setting("HOROVOD_PROFILE_NCCL_PROXY", "0 or 1", "1",
            "0: the NCCL profiler plugin records no proxy (network) events", "C"),
    Setting("HOROVOD_PROFILE_CUDART", "a path, or none", "a libcudart already loaded",
            "the CUDA runtime used for NCCL device times", "C"),
    Setting("HVPROF_LIB", "a path", "profiler/_lib/libhvprof.so",
            "the interposition library Python loads instead of the packaged one", "Python"),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def read(name: str, *, speak: bool = True, instead: str | None = None) -> Any:
    """A setting with a typed default in the table, parsed and checked by the
    table: a number in lo..hi (an int where the default is one), a switch
    ("0"/"1": a bool where the default is one) or one of its choices; a
    value it cannot use is said once and the default is used (`setting`)."""
    s = BY_NAME[name]
    if s.value is None:
        raise KeyError(f"{name} has no typed default in profiler._env.SETTINGS")
    if s.choices:
        def parse(raw: str) -> Any:
            if raw not in s.choices:
                raise ValueError(raw)
            return raw == "1" if isinstance(s.value, bool) else raw
        expected = " or ".join(s.choices)
    else:
        kind: Callable[[str], Any] = int if isinstance(s.value, int) else float

        def parse(raw: str) -> Any:
            v = kind(raw)
            if v != v or v == float("inf") or (s.lo is not None and v < s.lo) or (
                    s.hi is not None and v > s.hi):
                raise ValueError(raw)
            return v
        expected = s.takes
    return setting(name, s.value, parse, expected, speak=speak, instead=instead)


def markdown_table() -> str:
    """The environment page's table (docs/hooks.py)."""
    def cell(text: str) -> str:  # `<date>` is text, not an HTML tag
        return text.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")

    rows = ["| variable | takes | default | what it does | read by |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.name}` | {cell(s.takes)} | {cell(s.default)} | {cell(s.meaning)} "
                    f"| {s.side} |")
    return "\n".join(rows)
