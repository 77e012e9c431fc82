"""The profile directory's layout: one definition of every path in it, of rank
file names, of rank-range text ("0-3,5") and of what a trace argument names.

Every stage (the hooks' Python side, conversion, merge, the readers, analysis,
the CLI) imports this module; it imports nothing of theirs (only
profiler.errors).  The layout itself is documented in docs/ARCHITECTURE.md
section 2:

    <dir>/raw/rank-00000.hvprof       records (the hooks, while the job runs)
    <dir>/raw/rank-00000.agg          summary-mode aggregates
    <dir>/raw/rank-00000.nccl.json    NCCL/CUDA state of the process
    <dir>/raw/rank-00000.mpit.json    the MPI library's transports (MPI_T), TCP peers
    <dir>/raw/rank-00000.cpu.json     CPUs, load, every thread's CPU/run-queue time
    <dir>/raw/rank-00000.facts.json   what only the process knew, written before its
                                      files left its host for rank 0's (gather)
    <dir>/raw/rank-00000.gathered.json  at rank 0: where a gathered rank's files came from
    <dir>/raw/gather.json             at rank 0: the gather (ranks, bytes, seconds)
    <dir>/ranks/rank-00000.parquet    rows (each rank at its exit, or merge)
    <dir>/ranks/rank-00000.json       that rank's metadata
    <dir>/ranks/rank-00000.agg.parquet  summary-mode aggregates as rows
    <dir>/timeline.json               Horovod's timeline (when on)
    <dir>/lineage.parquet             fusion lineage (merge)
    <dir>/trace.json                  the job (merge)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from profiler.errors import EmptyProfileError, NotATraceError, NotFoundError, UsageError

__all__ = [
    "RAW_DIR", "RANKS_DIR", "TRACE_FILE", "TIMELINE_FILE", "LINEAGE_FILE",
    "rank_stem", "raw_path", "parquet_path", "meta_path", "agg_parquet_path",
    "agg_path_for", "sidecar_path", "tensor_names_path", "rank_files", "file_rank",
    "facts_path", "gathered_path", "GATHER_FILE",
    "check_profile_dir",
    "resolve_trace", "format_ranges", "parse_ranges",
]

RAW_DIR = "raw"
RANKS_DIR = "ranks"
TRACE_FILE = "trace.json"
TIMELINE_FILE = "timeline.json"
LINEAGE_FILE = "lineage.parquet"

_RANK_RE = re.compile(r"^rank-(\d+)\.(hvprof|parquet|json)$")


# ---------------------------------------------------------------------------
# file names
# ---------------------------------------------------------------------------
def rank_stem(rank: int) -> str:
    return f"rank-{rank:05d}"


def raw_path(profile_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(profile_dir) / RAW_DIR / f"{rank_stem(rank)}.hvprof"


def parquet_path(profile_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(profile_dir) / RANKS_DIR / f"{rank_stem(rank)}.parquet"


def meta_path(profile_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(profile_dir) / RANKS_DIR / f"{rank_stem(rank)}.json"


def agg_parquet_path(profile_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(profile_dir) / RANKS_DIR / f"{rank_stem(rank)}.agg.parquet"


def _beside_raw(raw: str | os.PathLike[str], suffix: str) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R<suffix>."""
    p = Path(raw)
    if p.name.endswith(".hvprof"):
        return p.with_name(p.name[: -len(".hvprof")] + suffix)
    return p.with_suffix(suffix) if suffix == ".agg" else p.with_name(p.name + suffix)


def agg_path_for(raw: str | os.PathLike[str]) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R.agg."""
    return _beside_raw(raw, ".agg")


def tensor_names_path(raw: str | os.PathLike[str]) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R.tensors: the names of the tensors the
    rank handed to Horovod (profiler.collect.tensors), one JSON string per line."""
    return _beside_raw(raw, ".tensors")


def sidecar_path(raw: str | os.PathLike[str]) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R.nccl.json."""
    return _beside_raw(raw, ".nccl.json")


def mpit_path(raw: str | os.PathLike[str]) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R.mpit.json: what the MPI library said about
    its transports (MPI_T) and the TCP connections the rank held (hooks/mpit.c)."""
    return _beside_raw(raw, ".mpit.json")


def cpu_path(raw: str | os.PathLike[str]) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R.cpu.json: the rank's CPUs, load and every
    thread's CPU and run-queue time at start and at the end (hooks/cpu.c)."""
    return _beside_raw(raw, ".cpu.json")


def facts_path(raw: str | os.PathLike[str]) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R.facts.json: the facts only the rank's
    process knew (profiler.collect.facts), written before its files were sent
    to rank 0's host (the gather)."""
    return _beside_raw(raw, ".facts.json")


def gathered_path(raw: str | os.PathLike[str]) -> Path:
    """raw/rank-R.hvprof -> raw/rank-R.gathered.json: at rank 0, where a rank's
    gathered files came from (its host, their count and bytes, the transport)."""
    return _beside_raw(raw, ".gathered.json")


GATHER_FILE = "gather.json"  # <dir>/raw/gather.json: the gather at rank 0, as a whole


def file_rank(path: Path) -> int | None:
    """The rank of a ranks/rank-RRRRR.parquet file, from its name."""
    name = path.name
    if name.startswith("rank-") and name.endswith(".parquet") and name.count(".") == 1:
        try:
            return int(name[5:-8])
        except ValueError:
            return None
    return None


def rank_files(profile_dir: Path, sub: str, ext: str,
               problems: list[str] | None = None) -> dict[int, Path]:
    """rank -> <dir>/<sub>/rank-R.<ext>, regular files only: a FIFO, a directory
    or a device under a rank file's name is skipped (and noted in `problems`),
    never opened (a FIFO would block the reader for ever)."""
    d = Path(profile_dir) / sub
    out: dict[int, Path] = {}
    if not d.is_dir():
        return out
    for p in d.iterdir():
        m = _RANK_RE.match(p.name)
        if m and m.group(2) == ext:
            if not p.is_file():
                if problems is not None:
                    problems.append(f"{sub}/{p.name} is not a regular file: ignored")
                continue
            out[int(m.group(1))] = p
    return out


# ---------------------------------------------------------------------------
# what an argument names
# ---------------------------------------------------------------------------
def check_profile_dir(path: str | os.PathLike[str]) -> Path:
    """A profile directory (holding raw/ or ranks/), or a one-line error."""
    p = Path(path)
    if not p.exists():
        raise NotFoundError(p, "no such directory")
    if not p.is_dir():
        raise NotATraceError(p, "not a profile directory (expected the directory holding "
                                "raw/ and ranks/)")
    if not (p / RAW_DIR).is_dir() and not (p / RANKS_DIR).is_dir():
        raise EmptyProfileError(p, "not a profile directory: no raw/ or ranks/ inside")
    return p


def resolve_trace(path: str | os.PathLike[str]) -> Path:
    """A profile directory -> its trace.json; a file -> itself (must exist)."""
    p = Path(path)
    if not p.exists():
        raise NotFoundError(p, "no such file or directory")
    if p.is_dir():
        t = p / TRACE_FILE
        if t.is_file():
            return t
        raise NotATraceError(p, "directory without trace.json (run `profiler merge` on it)")
    return p


# ---------------------------------------------------------------------------
# rank ranges: "0-3,5" <-> [0, 1, 2, 3, 5]
# ---------------------------------------------------------------------------
def format_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 3, 5] -> "0-3,5" (sorted, distinct): one spelling everywhere."""
    rs = sorted(set(int(r) for r in ranks))
    out: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


def parse_ranges(text: str, what: str = "--ranks") -> list[int]:
    """'0-7,12,100-103' -> [0..7, 12, 100..103] (sorted, distinct)."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise UsageError(None, f"{what}: {part!r} is not a number or a range A-B") from None
        if lo < 0 or hi < lo:
            raise UsageError(None, f"{what}: bad range {part!r}")
        if hi - lo > 10_000_000:
            raise UsageError(None, f"{what}: range {part!r} is too large")
        out.update(range(lo, hi + 1))
    if not out:
        raise UsageError(None, f"{what}: empty list")
    return sorted(out)
