"""The readers fuzzed by benchmarks/fuzz_readers.py and the cases fed to them.

TARGETS says, per reader, where the mutated bytes go in a case directory and
what runs on them (the API call, the parser alone for truncations, the CLI
argv); cases_for generates a reader's cases from its seed file: truncations,
bit flips, extreme struct fields, wrong versions, JSON type swaps and horrors,
wrong parquet schemas, and the path kinds of SPECIAL_PATHS (which
fuzz_readers._materialize puts in the file's place).
"""

from __future__ import annotations

import io
import json
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from profiler.errors import ProfilerError
from profiler.formats import record as F

SPECIAL_PATHS = ("directory", "fifo", "unreadable", "dangling-symlink", "empty")


# ---------------------------------------------------------------------------
# mutations
# ---------------------------------------------------------------------------
EXTREMES_U = [0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1]
EXTREMES_I = [0, -1, 1, -(2**31), 2**31 - 1, -(2**63), 2**63 - 1]
EXTREMES_F = [0.0, -1.0, 1e-300, 1e300, float("inf"), float("-inf"), float("nan")]


def _set_field(data: bytes, dtype: np.dtype, offset: int, name: str, value: Any) -> bytes | None:
    out = bytearray(data)
    if offset + dtype.itemsize > len(out):
        return None
    rec = np.frombuffer(bytes(out[offset:offset + dtype.itemsize]), dtype=dtype).copy()
    kind = rec.dtype.fields[name][0]  # type: ignore[index]
    try:
        if kind.kind in "SV":
            value = value if isinstance(value, bytes) else b"\xff" * kind.itemsize
        rec[name] = np.array(value).astype(kind) if kind.kind not in "SV" else value
    except (OverflowError, ValueError, TypeError):
        return None
    out[offset:offset + dtype.itemsize] = rec.tobytes()
    return bytes(out)


def struct_cases(data: bytes, dtype: np.dtype, offset: int, what: str
                 ) -> Iterator[tuple[str, bytes]]:
    for name in dtype.names or ():
        kind = dtype.fields[name][0]  # type: ignore[index]
        if kind.kind == "u":
            values: list[Any] = EXTREMES_U
        elif kind.kind == "i":
            values = EXTREMES_I
        elif kind.kind == "f":
            values = EXTREMES_F
        else:
            values = [b"\xff" * kind.itemsize, b"\x1b[2J\x1b]0;pwned\x07" * 4]
        for v in values:
            m = _set_field(data, dtype, offset, name, v)
            if m is not None:
                yield f"{what}.{name}={v!r}"[:80], m


def truncations(data: bytes, budget: int) -> Iterator[tuple[str, bytes]]:
    """Every byte boundary when the file is small enough, else every boundary of
    the first 4 KiB plus an even stride."""
    n = len(data)
    if n <= budget:
        points: Any = range(n)
    else:
        head = list(range(min(n, budget // 2)))  # every boundary in the headers
        rest = max(1, budget - len(head))
        points = sorted(set(head) | set(range(0, n, max(1, n // rest))) | {n - 1})
    for i in points:
        yield f"truncate@{i}", data[:i]


def bit_flips(data: bytes, rng: random.Random, n: int) -> Iterator[tuple[str, bytes]]:
    for k in range(n):
        out = bytearray(data)
        flips = rng.choice([1, 1, 2, 4, 16, 64])
        for _ in range(flips):
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        if rng.random() < 0.3:  # a splat of random bytes
            i = rng.randrange(len(out))
            ln = rng.randrange(1, 64)
            out[i:i + ln] = bytes(rng.randrange(256) for _ in range(ln))
        yield f"flip#{k}x{flips}", bytes(out)


def _json_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            yield from _json_paths(v, prefix + (i,))


def _replace(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        out = dict(obj)
        out[head] = _replace(obj[head], rest, value)
        return out
    out_l = list(obj)
    out_l[head] = _replace(obj[head], rest, value)
    return out_l


JSON_SWAPS: list[Any] = [None, True, -1, 0, 2**64, 1.5e308, "x", "\x1b[2J", [], {}, [[]],
                         {"a": None}, "-1", 10**30]


def json_cases(data: bytes, rng: random.Random, n: int) -> Iterator[tuple[str, bytes]]:
    """Type swaps at random places of a JSON document, plus structural horrors."""
    obj = json.loads(data)
    paths = list(_json_paths(obj))
    for k in range(n):
        path = rng.choice(paths)
        value = rng.choice(JSON_SWAPS)
        try:
            text = json.dumps(_replace(obj, path, value))
        except (TypeError, ValueError):
            continue
        yield f"json#{k}:{'/'.join(map(str, path))[:40]}={value!r}"[:90], text.encode()
    yield "deep-array", b"[" * 100_000 + b"]" * 100_000
    yield "deep-object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    yield "deep-unclosed", b"[" * 1_000_000
    yield "huge-number", b"[" + b"9" * 100_000 + b"]"
    yield "nan", b'{"traceEvents": NaN}'
    yield "bad-utf8", data[:len(data) // 2] + b"\xff\xfe\xc3(" + data[len(data) // 2:]
    yield "bom", b"\xef\xbb\xbf" + data
    yield "nul", b"\0" * 4096
    yield "not-json", b"hello\n"
    yield "wrong-top-array", b"[1, 2, 3]"
    yield "wrong-top-string", b'"trace"'
    yield "enormous-string", b'{"horovod_profiler": {"format_version": 1, "x": "' + \
        b"A" * (64 << 20) + b'"}}'
    yield "enormous-array", b"[" + b"{}," * (4 << 20) + b"{}]"


def version_cases(name: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    if name in ("raw", "header"):
        for v in (0, 2, 999, 2**32 - 1):
            m = _set_field(data, F.HEADER_DTYPE, 0, "version", v)
            if m:
                yield f"version={v}", m
    elif name == "agg":
        for v in (0, 2, 2**32 - 1):
            m = _set_field(data, F.AGG_HEADER_DTYPE, 0, "version", v)
            if m:
                yield f"version={v}", m
    elif name in ("trace", "meta"):
        obj = json.loads(data)
        block = obj.get("horovod_profiler", obj)
        bad_versions: list[Any] = [2, 999, -1, "1", None, 1.5]
        for v in bad_versions:
            b2 = dict(block)
            b2["format_version"] = v
            o2 = dict(obj, horovod_profiler=b2) if "horovod_profiler" in obj else b2
            yield f"format_version={v!r}", json.dumps(o2).encode()


def raw_structs(data: bytes) -> Iterator[tuple[str, bytes]]:
    yield from struct_cases(data, F.HEADER_DTYPE, 0, "header")
    h = np.frombuffer(data[:F.HEADER_BYTES], dtype=F.HEADER_DTYPE)[0]
    first = int(h["first_chunk_offset"])
    yield from struct_cases(data, F.CHUNK_HEADER_DTYPE, first, "chunk0")
    yield from struct_cases(data, F.COMM_ENTRY_DTYPE, int(h["comm_table_offset"]), "comm0")
    yield from struct_cases(data, F.TRACK_ENTRY_DTYPE, int(h["track_table_offset"]),
                            "track0")
    # the first record's fields (comm/track indices out of the tables, enums unknown)
    yield from struct_cases(data, F.RECORD_DTYPE, first + F.CHUNK_HEADER_BYTES, "rec0")


def agg_structs(data: bytes) -> Iterator[tuple[str, bytes]]:
    yield from struct_cases(data, F.AGG_HEADER_DTYPE, 0, "agg")
    yield from struct_cases(data, F.AGG_ENTRY_DTYPE, F.AGG_HEADER_BYTES, "entry0")


# ---------------------------------------------------------------------------
# readers
# ---------------------------------------------------------------------------
@dataclass
class Target:
    """How one reader is fed: where the mutated bytes go and what runs on them."""

    name: str
    binary: bool
    place: Callable[[Path, dict[str, Path]], Path]  # set up a case dir -> the file to mutate
    api: Callable[[Path, Path], Any]  # (file, case dir) -> result
    cli: Callable[[Path, Path], list[str]]  # (file, case dir) -> argv for profiler.cli.main
    parse: Callable[[Path, Path], Any] | None = None  # the parser alone, for truncations
    every_byte: bool = False  # truncate at every byte boundary whatever the budget


def _copy_profile(case: Path, seeds: dict[str, Path], *, raw: bool = True) -> Path:
    prof = case / "prof"
    (prof / "raw").mkdir(parents=True)
    (prof / "ranks").mkdir()
    if raw:
        shutil.copy(seeds["raw"], prof / "raw" / "rank-00000.hvprof")
    return prof


def _place_raw(case: Path, seeds: dict[str, Path]) -> Path:
    return _copy_profile(case, seeds) / "raw" / "rank-00000.hvprof"


def _place_agg(case: Path, seeds: dict[str, Path]) -> Path:
    prof = _copy_profile(case, seeds, raw=False)
    shutil.copy(seeds["_summary_raw"], prof / "raw" / "rank-00000.hvprof")
    return prof / "raw" / "rank-00000.agg"


def _place_ranks(which: str) -> Callable[[Path, dict[str, Path]], Path]:
    def place(case: Path, seeds: dict[str, Path]) -> Path:
        prof = _copy_profile(case, seeds, raw=False)
        for ext in ("json", "parquet"):
            shutil.copy(seeds["_full_dir"] / "ranks" / f"rank-00000.{ext}",
                        prof / "ranks" / f"rank-00000.{ext}")
        return prof / "ranks" / f"rank-00000.{which}"
    return place


def _place_trace(case: Path, seeds: dict[str, Path]) -> Path:
    prof = _copy_profile(case, seeds, raw=False)
    for ext in ("json", "parquet"):
        shutil.copy(seeds["_full_dir"] / "ranks" / f"rank-00000.{ext}",
                    prof / "ranks" / f"rank-00000.{ext}")
    return prof / "trace.json"


def _place_plain(key: str, name: str) -> Callable[[Path, dict[str, Path]], Path]:
    def place(case: Path, seeds: dict[str, Path]) -> Path:
        return case / name
    return place


def _api_raw(f: Path, case: Path) -> Any:
    from profiler.postjob.convert import convert_raw

    return convert_raw(f, f.parent.parent)


def _parse_raw(f: Path, case: Path) -> Any:
    from profiler.formats.raw import read_raw

    return read_raw(f)


def _api_agg(f: Path, case: Path) -> Any:
    from profiler.postjob.convert import convert_raw

    return convert_raw(f.with_suffix(".hvprof"), f.parent.parent)


def _api_header(f: Path, case: Path) -> Any:
    from profiler.formats.raw import read_header

    return read_header(f)


def _api_merge(f: Path, case: Path) -> Any:
    from profiler.postjob.merge import merge

    return merge(case / "prof")


def _api_parquet(f: Path, case: Path) -> Any:
    """read_dataset, then merge whatever read_dataset said (both must hold)."""
    from profiler.formats.dataset import read_dataset

    refused: ProfilerError | None = None
    try:
        read_dataset([f])
    except ProfilerError as exc:
        refused = exc
    _api_merge(f, case)
    if refused is not None:
        raise refused


def _parse_parquet(f: Path, case: Path) -> Any:
    from profiler.formats.dataset import read_dataset

    return read_dataset([f])


def _api_trace(f: Path, case: Path) -> Any:
    from profiler.analysis import load, load_meta

    load_meta(f)
    return load(f)


def _api_timeline(f: Path, case: Path) -> Any:
    from profiler.formats.timeline import parse, tensor_ops

    return tensor_ops(parse(f))


def _place_names(case: Path, seeds: dict[str, Path]) -> Path:
    prof = _copy_profile(case, seeds)
    return prof / "raw" / "rank-00000.tensors"


def _api_hang(f: Path, case: Path) -> Any:
    from profiler.analysis.hang import diagnose

    return diagnose(case / "prof")


def _api_plan(f: Path, case: Path) -> Any:
    from profiler.bench.sweep import read_plan

    return read_plan(str(f))


TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("raw", True, _place_raw, _api_raw,
           lambda f, c: ["merge", str(c / "prof")], _parse_raw, every_byte=True),
    Target("header", True, _place_raw, _api_header,
           lambda f, c: ["summarize", str(c / "prof")], every_byte=True),
    Target("agg", True, _place_agg, _api_agg,
           lambda f, c: ["merge", str(c / "prof")]),
    Target("meta", False, _place_ranks("json"), _api_merge,
           lambda f, c: ["merge", str(c / "prof")]),
    Target("parquet", True, _place_ranks("parquet"), _api_parquet,
           lambda f, c: ["summarize", str(f)], _parse_parquet),
    Target("trace", False, _place_trace, _api_trace,
           lambda f, c: ["summarize", str(f)]),
    Target("timeline", False, _place_plain("timeline", "timeline.json"), _api_timeline,
           lambda f, c: []),
    Target("plan", False, _place_plain("plan", "plan.json"), _api_plan,
           lambda f, c: []),
    Target("tensors", True, _place_names, _api_merge,
           lambda f, c: ["merge", str(c / "prof")]),
    Target("hang", True, _place_raw, _api_hang, lambda f, c: []),
]}


def parquet_schema_cases(seed: bytes) -> Iterator[tuple[str, bytes]]:
    """Well-formed parquet files of the wrong shape (what another tool might write):
    each column dropped, or retyped to a string, a float, a 128-bit decimal, a
    struct, a list; a column twice; exotic extra columns; a name with escapes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(seed))
    n = table.num_rows

    def out(t: Any) -> bytes:
        buf = io.BytesIO()
        pq.write_table(t, buf)
        return buf.getvalue()

    retypes: dict[str, Callable[[], Any]] = {
        "string": lambda: pa.array(["x"] * n),
        "float": lambda: pa.array([1.5] * n),
        "decimal128": lambda: pa.array([10**30] * n, pa.decimal128(38, 0)),
        "struct": lambda: pa.array([{"a": 1}] * n),
        "list": lambda: pa.array([[1, 2]] * n),
        "null": lambda: pa.nulls(n),
    }
    for i, name in enumerate(table.schema.names):
        yield f"schema:drop:{name}", out(table.remove_column(i))
        for kind, make in retypes.items():
            yield f"schema:{name}={kind}", out(table.set_column(i, name, make()))
    yield "schema:twice:rank", out(table.append_column("rank", table["rank"]))
    for kind, make in retypes.items():
        yield f"schema:extra={kind}", out(table.append_column("extra", make()))
    yield "schema:escape-name", out(table.append_column("x\x1b[2J", retypes["string"]()))


def cases_for(name: str, seed: bytes, rng: random.Random, n_random: int, trunc_budget: int
              ) -> Iterator[tuple[str, bytes | str]]:
    yield from truncations(seed, len(seed) if TARGETS[name].every_byte else trunc_budget)
    yield from bit_flips(seed, rng, n_random)
    yield from version_cases(name, seed)
    if name in ("raw", "header", "hang"):
        yield from raw_structs(seed)
    if name == "agg":
        yield from agg_structs(seed)
    if name == "parquet":
        yield from parquet_schema_cases(seed)
    if not TARGETS[name].binary:
        yield from json_cases(seed, rng, n_random)
    else:
        yield "random-bytes", bytes(rng.randrange(256) for _ in range(len(seed)))
        yield "zeros", b"\0" * len(seed)
    for kind in SPECIAL_PATHS:
        yield f"path:{kind}", kind
