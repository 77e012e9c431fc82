"""The profiler's settings: one table (SETTINGS) for both languages.

Each variable is defined once here: its name, what it takes, its default and
range, what it does, and which side reads it.  The C library reads the same
table through hooks/hvprof_settings.h, which scripts/gen_settings.py writes
from it (committed; tests/test_settings.py fails when the two differ, and
compares the values both sides parse); the documentation's environment page
and the start-up hook's off words (horovod_profiler.pth) come from it too.

A value that cannot be used is said once per process, on one line
(`horovod-profiler: warning: ignoring NAME='value' (what is expected): what is
done instead`), and the default is used: a setting never stops a job.  A
setting the C library reads is said by the library (hooks/settings.c, at
rank 0's open, in the same words); Python says the ones only it reads.
Every switch takes the same words: 1/true/on/yes and 0/false/off/no (any
case).  HOROVOD_PROFILE alone has a third state, summary, and an unknown
value turns profiling off (profile_mode).
Kept free of heavy imports: read at interpreter start-up and at exit."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from profiler.errors import ProfilerError, printable

T = TypeVar("T")
_said: set[str] = set()

#: the words every switch takes (compared in lower case)
ON_WORDS: tuple[str, ...] = ("1", "true", "on", "yes")
OFF_WORDS: tuple[str, ...] = ("0", "false", "off", "no")
#: HOROVOD_PROFILE: these record every call; SUMMARY_WORD keeps aggregates;
#: OFF_WORDS and the empty string turn it off; anything else is said and off
FULL_WORDS: tuple[str, ...] = ON_WORDS + ("full",)
SUMMARY_WORD = "summary"


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
    hooks/; "Python": the package; "both").  As the code uses it: `value`, the
    typed default (a bool makes a switch, an int or float a number in the
    inclusive range `lo`..`hi` (None: open), a str one of `choices`; None:
    text, or a default that is computed).  `kind` names which."""

    name: str
    takes: str
    default: str
    meaning: str
    side: str
    value: float | bool | str | None = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """mode (HOROVOD_PROFILE), switch, int, num, choice or text."""
        if self.name == "HOROVOD_PROFILE":
            return "mode"
        if isinstance(self.value, bool):
            return "switch"
        if isinstance(self.value, int):
            return "int"
        if isinstance(self.value, float):
            return "num"
        return "choice" if self.choices else "text"


#: Every variable the profiler reads, defined once: tests/test_settings.py
#: checks it against the names that hooks/ and the package read, and the
#: documentation's environment page is generated from it (docs/hooks.py).
SETTINGS: tuple[Setting, ...] = (
    Setting("HOROVOD_PROFILE", "1/true/on/yes/full, summary, 0/false/off/no", "off",
            "on records every call; summary keeps per-(op, communicator, size) aggregates "
            "with latency histograms instead; off (or unset) profiles nothing, and any other "
            "value is said in one line and profiles nothing; the same for a program that "
            "preloads the library (LD_PRELOAD)", "both",
            choices=FULL_WORDS + (SUMMARY_WORD,) + OFF_WORDS),
    Setting("HOROVOD_PROFILE_DIR", "a path", "./horovod-profile-<job>: 12 hex digits naming "
            "the job, the same on every rank, for every launcher",
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
    Setting("HOROVOD_PROFILE_CPU", "K", "16",
            "read each thread's CPU and run-queue time at every step of the first 64, then "
            "at one step in K (4-5 system calls a step read); 1 reads every step, 0 none, "
            "and leaves out the CPU contention findings", "C", value=16, lo=0, hi=1_000_000),
    Setting("HOROVOD_PROFILE_NET_MS", "ms", "10",
            "how often a thread of the library reads the kernel's figures (tcp_info) of the "
            "rank's TCP connections to other hosts, for the slow-link finding (one system "
            "call per connection a read; the period grows where the reads would take more "
            "than 0.5% of a core); 0: not read", "C", value=10, lo=0, hi=60000),
    Setting("HOROVOD_PROFILE_HELPER", "a switch", "on",
            "off: no helper thread; each thread writes its own full buffers", "C", value=True),
    Setting("HOROVOD_PROFILE_SIGNALS", "a switch", "on",
            "off: fatal signals (SIGSEGV, SIGTERM, ...) do not flush the buffers first", "C",
            value=True),
    Setting("HOROVOD_PROFILE_CLOCK", "tsc, monotonic or auto", "auto (the TSC where it is "
            "invariant)", "the records' clock", "C", value="auto",
            choices=("tsc", "monotonic", "auto")),
    Setting("HOROVOD_PROFILE_CLOCK_SYNC", "host or rank", "host",
            "rank: every rank measures its own clock offset, as if each had its own host",
            "C", value="host", choices=("host", "rank")),
    Setting("HOROVOD_PROFILE_TIMELINE", "a switch", "off",
            "on: also write Horovod's own timeline into the profile directory (costs "
            "throughput; the lineage gains negotiation and wait-for-data phases)", "both",
            value=False),
    Setting("HOROVOD_PROFILE_HANG_S", "seconds >= 0", "120",
            "seconds a collective may stay in flight before the watchdog writes a hang "
            "snapshot; 0 turns the watchdog off", "Python", value=120.0, lo=0.0),
    Setting("HOROVOD_PROFILE_MERGE", "a switch", "on",
            "off: rank 0 builds no trace.json at exit, and one line says to run "
            "`profiler merge DIR`", "both", value=True),
    Setting("HOROVOD_PROFILE_GATHER", "a switch", "on",
            "off: ranks whose files rank 0 cannot see (no shared disk) keep them on their own "
            "hosts, instead of sending them to rank 0 over the job's MPI at MPI_Finalize, or "
            "over TCP to rank 0's exit merge in a Gloo job (rank 0's value decides for MPI)",
            "both", value=True),
    Setting("HOROVOD_PROFILE_MERGE_TIMEOUT", "seconds >= 0", "60",
            "how long rank 0 waits at exit for the other ranks' files; a program without "
            "Python waits for its merge this long plus 30 s, then leaves it running", "both",
            value=60.0, lo=0.0),
    Setting("HOROVOD_PROFILE_STORE", "a directory or a postgresql:// URL", "none",
            "where each job's record goes (docs/guide/site.md): with a store named, rank 0's "
            "exit writes job-record.json beside the profile and puts it into the store; "
            "without one, no record is made at exit (`profiler jobs ingest DIR` makes it "
            "later)", "Python"),
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
    Setting("HOROVOD_PROFILE_TF_KERNELS", "a switch", "on",
            "off: TensorFlow's tensors are not recorded in Horovod's kernels (the kernel "
            "hooks are not loaded: no lineage, fusion what-if or hang diagnosis by tensor "
            "for TensorFlow jobs)", "Python", value=True),
    Setting("HOROVOD_PROFILE_FASTREC", "a switch", "on",
            "off: the tensor hooks in Python and the step hook through ctypes instead of "
            "the C extension (the same records, at about three times the cost)", "Python",
            value=True),
    Setting("HOROVOD_PROFILE_ANALYSIS_MEMORY", "DuckDB's memory_limit (4GB)", "DuckDB's own",
            "caps the memory of the analysis engine over large datasets", "Python"),
    Setting("HOROVOD_PROFILE_NCCL_DEVICE", "a switch", "on",
            "off: NCCL calls keep host times only (no CUDA events)", "C", value=True),
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
    Setting("HOROVOD_PROFILE_NCCL_WRAPPERS", "a switch", "on",
            "off: no ncclAllReduce (and siblings) wrappers; NCCL's profiler plugin only",
            "C", value=True),
    Setting("HOROVOD_PROFILE_NCCL_PROXY", "a switch", "on",
            "off: the NCCL profiler plugin records no proxy (network) events", "C",
            value=True),
    Setting("HOROVOD_PROFILE_CUDART", "a path, or none", "a libcudart already loaded",
            "the CUDA runtime used for NCCL device times", "C"),
    Setting("HVPROF_LIB", "a path", "profiler/_lib/libhvprof.so",
            "the interposition library Python loads instead of the packaged one", "Python"),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def _switch(raw: str) -> bool:
    word = raw.lower()
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    raise ValueError(raw)


def expected(s: Setting) -> str:
    """What a setting takes, as the one-line warning says it (C says the same:
    hooks/hvprof_settings.h carries this text)."""
    if s.kind == "switch":
        return "on: " + "/".join(ON_WORDS) + ", off: " + "/".join(OFF_WORDS)
    if s.kind == "choice":
        return " or ".join(s.choices)
    if s.kind in ("int", "num") and s.lo is not None and s.hi is not None \
            and " to " not in s.takes:
        return f"{s.takes}, {_number(s.lo)} to {_number(s.hi)}"
    return s.takes


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def shown(s: Setting) -> str:
    """The default as the warning says it is used."""
    if s.kind == "switch":
        return "on" if s.value else "off"
    return _number(s.value) if isinstance(s.value, (int, float)) else str(s.value)


def read(name: str, *, speak: bool | None = None, instead: str | None = None) -> Any:
    """A setting with a typed default, parsed and checked by the table: a
    switch (a bool), a number in lo..hi (an int where the default is one) or
    one of its choices; a value it cannot use is said once and the default is
    used (`setting`).  `speak` defaults to the table: Python says only the
    settings the C library does not read (the library says the others)."""
    s = BY_NAME[name]
    if s.value is None:
        raise KeyError(f"{name} has no typed default in profiler._env.SETTINGS")
    if speak is None:
        speak = s.side == "Python"
    parse: Callable[[str], Any]
    if s.kind == "switch":
        parse = _switch
    elif s.kind == "choice":
        def parse(raw: str) -> Any:
            if raw.lower() not in s.choices:
                raise ValueError(raw)
            return raw.lower()
    else:
        kind: Callable[[str], Any] = int if s.kind == "int" else float

        def parse(raw: str) -> Any:
            v = kind(raw)
            if v != v or v in (float("inf"), float("-inf")) or (
                    s.lo is not None and v < s.lo) or (s.hi is not None and v > s.hi):
                raise ValueError(raw)
            return v
    return setting(name, s.value, parse, expected(s), speak=speak,
                   instead=instead or f"using {shown(s)}")


def text(name: str) -> str | None:
    """A text setting (a path, a URL, a memory size): its value, stripped, or
    None when unset or empty."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not in profiler._env.SETTINGS")
    return os.environ.get(name, "").strip() or None


def profile_mode(value: str | None = None) -> str | None:
    """HOROVOD_PROFILE (or `value`) as "full", "summary" or "off"; None for a
    value that is none of its words (the caller says so once and profiles
    nothing).  Unset is "off", as the C library decides it too
    (hooks/settings.c, hvprof_profile_mode)."""
    raw = os.environ.get("HOROVOD_PROFILE", "") if value is None else value
    word = raw.strip().lower()
    if word in FULL_WORDS:
        return "full"
    if word == SUMMARY_WORD:
        return "summary"
    if word in OFF_WORDS or not word:
        return "off"
    return None


#: the launchers' variables that give a process its rank, in the order the C
#: library reads them (hooks/settings.c, hvprof_launcher_rank)
RANK_VARS: tuple[str, ...] = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "HOROVOD_RANK",
                              "RANK", "SLURM_PROCID")


def launcher_rank() -> int | None:
    """This process's rank as its launcher says it; None where none does."""
    for var in RANK_VARS:
        v = os.environ.get(var, "").strip()
        if v:
            try:
                return int(v)
            except ValueError:
                return None
    return None


def unknown_mode_line(raw: str | None = None) -> str:
    """The one line for a HOROVOD_PROFILE (or `raw`) that is none of its words
    (C: the same text, hooks/settings.c)."""
    raw = os.environ.get("HOROVOD_PROFILE", "") if raw is None else raw
    return (f"horovod-profiler: warning: HOROVOD_PROFILE={printable(repr(raw.strip()))} is "
            f"none of {'/'.join(FULL_WORDS)}, {SUMMARY_WORD}, {'/'.join(OFF_WORDS)}: "
            f"this job is not profiled")


def markdown_table() -> str:
    """The environment page's table (docs/hooks.py)."""
    def cell(text: str) -> str:  # `<date>` is text, not an HTML tag
        return text.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")

    rows = ["| variable | takes | default | what it does | read by |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        takes = expected(s) if s.kind == "switch" else s.takes
        rows.append(f"| `{s.name}` | {cell(takes)} | {cell(s.default)} | {cell(s.meaning)} "
                    f"| {s.side} |")
    return "\n".join(rows)
