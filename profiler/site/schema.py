"""The job record's schema: its name and version, the check every reader
applies, and how a record is written and read (record.py makes records,
store.py keeps them; both use these, one definition each)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECORD_SCHEMA = "horovod-profiler/job-record"
SCHEMA_VERSION = 1
#: the record's name beside the job's profile (trace.json's directory)
RECORD_NAME = "job-record.json"


class RecordError(ValueError):
    """A record that cannot be read: one line, naming what is wrong."""


def sig4(x: Any) -> Any:
    """4 significant digits (the record's size; no figure is known better)."""
    if isinstance(x, bool) or x is None:
        return x
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.4g}")
    return x


#: key -> type a record of this version must hold (the rest is optional)
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "job": dict, "start": str, "end": str, "hosts": list, "ranks": int, "versions": dict,
    "settings": dict, "steps": int, "breakdown": list, "findings": list, "ops": list,
    "interconnect": dict,
}


def check(rec: Any, where: str = "") -> dict[str, Any]:
    """`rec` as a record of this version, or RecordError in one line: another
    kind of document, a newer version (refused: upgrade the reader), a field
    missing or of the wrong type (a partial or corrupted record)."""
    at = f"{where}: " if where else ""
    if not isinstance(rec, dict) or rec.get("schema") != RECORD_SCHEMA:
        raise RecordError(f"{at}not a horovod-profiler job record")
    v = rec.get("schema_version")
    if not isinstance(v, int) or v < 1:
        raise RecordError(f"{at}job record without a valid schema_version")
    if v > SCHEMA_VERSION:
        raise RecordError(f"{at}job record of schema version {v}, newer than this reader's "
                          f"({SCHEMA_VERSION}): read it with a newer horovod-profiler")
    for key, typ in REQUIRED.items():
        if not isinstance(rec.get(key), typ):
            raise RecordError(f"{at}job record without a valid {key!r} (partial or corrupted)")
    job = rec["job"]
    if not all(isinstance(job.get(k), str) for k in ("id", "name", "user")) or not job["id"]:
        raise RecordError(f"{at}job record without a valid job id, name and user")
    return rec


def dumps(rec: Mapping[str, Any]) -> bytes:
    import json

    return json.dumps(rec, ensure_ascii=False, sort_keys=False,
                      separators=(",", ":")).encode() + b"\n"


def loads(data: bytes | str, where: str = "") -> dict[str, Any]:
    import orjson  # a store's query parses every record it selects: the fast parser

    try:
        rec = orjson.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordError(f"{where}: not JSON ({str(exc).splitlines()[0][:80]}): partial or "
                          "corrupted") from None
    return check(rec, where)


def write_atomic(path: Path, data: bytes, mode: int = 0o640) -> None:
    """Write `path` whole or not at all: a temporary file in the same folder,
    flushed to disk, then renamed over (readers see the old or the new file,
    never a torn one, even with writers of the same name at once)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def lost_node_hours(rec: dict[str, Any]) -> float | None:
    """Node-hours a job lost to communication and to waiting for other ranks:
    the ranking's order (None: neither is known).  The stores rank by the
    same sum in SQL (store.LOST_SQL and PgStore.select), and query.ranking in Python."""
    known = [float(x) for x in (rec.get("node_hours_comm"), rec.get("node_hours_wait"))
             if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return sum(known) if known else None
