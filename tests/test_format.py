"""The Python view of the raw format (profiler.formats.record) against hooks/hvprof_format.h:
(1) the layout the library itself reports (hvprof_layout_json), (2) a C program
compiled from the header that prints sizeof/offsetof and the X-macro tables."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from profiler.formats import record as F

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "hooks" / "hvprof_format.h"

# library's struct names -> ours
LIB_NAMES = {
    "record": "hvprof_record",
    "chunk_header": "hvprof_chunk_header",
    "comm_entry": "hvprof_comm_entry",
    "track_entry": "hvprof_track_entry",
    "file_header": "hvprof_file_header",
    "agg_header": "hvprof_agg_header",
    "agg_entry": "hvprof_agg_entry",
}


def _py_fields(struct: str) -> dict[str, tuple[int, int]]:
    dt = F.STRUCTS[struct]
    assert dt.fields is not None
    return {name: (int(spec[1]), spec[0].itemsize) for name, spec in dt.fields.items()}


def test_sizes_and_constants() -> None:
    assert F.RECORD_DTYPE.itemsize == F.RECORD_BYTES == 64
    assert F.CHUNK_HEADER_DTYPE.itemsize == 64
    assert F.COMM_ENTRY_DTYPE.itemsize == 64
    assert F.TRACK_ENTRY_DTYPE.itemsize == 64
    assert F.HEADER_DTYPE.itemsize == F.HEADER_BYTES == 4096
    assert F.CHUNK_MAGIC.to_bytes(4, "little") == b"ROCK"
    assert len(F.MAGIC) == 8


@pytest.fixture(scope="module")
def library_layout() -> dict:
    from profiler.collect import native

    try:
        native.library_path()
    except Exception as exc:  # pragma: no cover - package not installed with its library
        pytest.skip(f"library not available: {exc}")
    return json.loads(native.layout_json())


def test_library_layout_structs(library_layout: dict) -> None:
    assert library_layout["version"] == F.FORMAT_VERSION
    assert library_layout["chunk_magic"] == F.CHUNK_MAGIC
    for lib_name, ours in LIB_NAMES.items():
        spec = library_layout[lib_name]
        assert spec["size"] == F.STRUCTS[ours].itemsize, lib_name
        lib_fields = {k: (v[0], v[1]) for k, v in spec["fields"].items()}
        assert lib_fields == _py_fields(ours), lib_name


def test_library_layout_enums(library_layout: dict) -> None:
    assert {int(k): tuple(v) for k, v in library_layout["ops"].items()} == {
        k: (v[1], v[2]) for k, v in F.OPS.items()}
    assert {int(k): v for k, v in library_layout["dtypes"].items()} == {
        k: v[1] for k, v in F.DTYPES.items()}
    assert {int(k): v for k, v in library_layout["redops"].items()} == {
        k: v[1] for k, v in F.REDOPS.items()}
    assert {int(k): v for k, v in library_layout["flags"].items()} == {
        k: v[1] for k, v in F.FLAGS.items()}
    assert library_layout["states"] == {v: k for k, v in F.STATES.items()}
    assert library_layout["modes"] == {v: k for k, v in F.MODES.items()}


C_TEMPLATE = r"""
#include <stddef.h>
#include <stdio.h>
#include "hvprof_format.h"
#define FIELD(T, f) printf("%s %s %zu %zu\n", #T, #f, offsetof(T, f), sizeof(((T *)0)->f));
#define OP(v, N, s, b) printf("op %d %s %s\n", v, s, b);
#define DT(v, N, s) printf("dtype %d %s\n", (int)(v), s);
#define RO(v, N, s) printf("redop %d %s\n", (int)(v), s);
#define FL(v, N, s) printf("flag %d %s\n", (int)(v), s);
int main(void) {
%(body)s
    HVPROF_OPS(OP) HVPROF_DTYPES(DT) HVPROF_REDOPS(RO) HVPROF_FLAGS(FL)
    printf("const version %u\n", HVPROF_FORMAT_VERSION);
    printf("const chunk_magic %u\n", HVPROF_CHUNK_MAGIC);
    printf("const header_bytes %u\n", HVPROF_HEADER_BYTES);
    printf("const record_bytes %u\n", HVPROF_RECORD_BYTES);
    printf("const default_chunk %u\n", HVPROF_DEFAULT_CHUNK_BYTES);
    printf("const comm_cap %u\n", HVPROF_COMM_TABLE_CAPACITY);
    printf("const track_cap %u\n", HVPROF_TRACK_TABLE_CAPACITY);
    printf("const state_open %u\n", HVPROF_STATE_OPEN);
    printf("const state_mpi_init %u\n", HVPROF_STATE_MPI_INIT);
    printf("const state_finalized %u\n", HVPROF_STATE_FINALIZED);
    printf("const state_closed %u\n", HVPROF_STATE_CLOSED);
    printf("const state_truncated %u\n", HVPROF_STATE_TRUNCATED);
    printf("const mode_full %u\n", HVPROF_MODE_FULL);
    printf("const mode_summary %u\n", HVPROF_MODE_SUMMARY);
    printf("const agg_buckets %u\n", HVPROF_AGG_BUCKETS);
    for (unsigned long long d = 0; d < 100000; d = d * 3 / 2 + 1)
        printf("bucket %llu %u\n", d, hvprof_agg_bucket(d));
    printf("bucket %llu %u\n", ~0ull, hvprof_agg_bucket(~0ull));
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:  # pragma: no cover
        pytest.skip("no C compiler")
    body = []
    for struct, dt in F.STRUCTS.items():
        body.append(f'    printf("size {struct} %zu\\n", sizeof({struct}));')
        assert dt.names is not None
        for name in dt.names:
            body.append(f"    FIELD({struct}, {name})")
    d = tmp_path_factory.mktemp("layout")
    src = d / "layout.c"
    src.write_text(C_TEMPLATE.replace("%(body)s", "\n".join(body)))
    exe = d / "layout"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", str(HEADER.parent), str(src),
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [line.split(" ") for line in out.splitlines()]


def test_c_program_structs(c_layout: list[list[str]]) -> None:
    sizes = {r[1]: int(r[2]) for r in c_layout if r[0] == "size"}
    for struct, dt in F.STRUCTS.items():
        assert sizes[struct] == dt.itemsize, struct
        c_fields = {r[1]: (int(r[2]), int(r[3])) for r in c_layout if r[0] == struct}
        assert c_fields == _py_fields(struct), struct


def test_c_program_enums_and_constants(c_layout: list[list[str]]) -> None:
    ops = {int(r[1]): (r[2], r[3]) for r in c_layout if r[0] == "op"}
    assert ops == {k: (v[1], v[2]) for k, v in F.OPS.items()}
    assert {int(r[1]): r[2] for r in c_layout if r[0] == "dtype"} == {
        k: v[1] for k, v in F.DTYPES.items()}
    assert {int(r[1]): r[2] for r in c_layout if r[0] == "redop"} == {
        k: v[1] for k, v in F.REDOPS.items()}
    assert {int(r[1]): r[2] for r in c_layout if r[0] == "flag"} == {
        k: v[1] for k, v in F.FLAGS.items()}
    const = {r[1]: int(r[2]) for r in c_layout if r[0] == "const"}
    assert const == {
        "version": F.FORMAT_VERSION, "chunk_magic": F.CHUNK_MAGIC,
        "header_bytes": F.HEADER_BYTES, "record_bytes": F.RECORD_BYTES,
        "default_chunk": F.DEFAULT_CHUNK_BYTES, "comm_cap": F.COMM_TABLE_CAPACITY,
        "track_cap": F.TRACK_TABLE_CAPACITY, "state_open": F.STATE_OPEN,
        "state_mpi_init": F.STATE_MPI_INIT, "state_finalized": F.STATE_FINALIZED,
        "state_closed": F.STATE_CLOSED, "state_truncated": F.STATE_TRUNCATED,
        "mode_full": F.MODE_FULL, "mode_summary": F.MODE_SUMMARY,
        "agg_buckets": F.AGG_BUCKETS,
    }
    buckets = [(int(r[1]), int(r[2])) for r in c_layout if r[0] == "bucket"]
    assert len(buckets) > 20
    for d, b in buckets:
        assert F.agg_bucket(d) == b, d
        if b < F.AGG_BUCKETS - 1:
            lo, hi = F.agg_bucket_bounds(b)
            assert lo <= d < hi, (d, b)


def test_c_field_count_matches_header_text() -> None:
    """Every field the header declares in a struct appears in our dtype (a field added
    to the header without a Python twin fails here even before the library rebuilds)."""
    import re

    text = HEADER.read_text()
    assert set(re.findall(r"typedef struct (\w+) \{", text)) == set(F.STRUCTS)
    for struct, dt in F.STRUCTS.items():
        m = re.search(r"typedef struct " + struct + r" \{(.*?)\} " + struct + ";", text, re.S)
        assert m, struct
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
        names = re.findall(r"\b(\w+)\s*(?:\[[^\]]*\])?\s*;", body)
        assert names == list(dt.names or ()), struct
