"""Horovod timeline parsing (profiler.formats.timeline).

Fixtures under tests/data/ are real timelines written by Horovod 0.28.1 at
np=2 (tests/data/gen_horovod_timelines.py): a model with 4 float32 parameter
tensors (0.weight [16, 8], 0.bias [16], 2.weight [4, 16], 2.bias [4]; 212
elements, 848 bytes), 4 parameter broadcasts, 5 training steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from profiler.errors import NotATraceError, NotFoundError, ProfilerError, TruncatedError, UsageError
from profiler.formats import timeline as T

DATA = Path(__file__).parent / "data"
FUSED = DATA / "horovod_timeline_fused.json"
UNFUSED = DATA / "horovod_timeline_nocache_unfused.json"
PARAMS = {"0.weight": 128, "0.bias": 16, "2.weight": 64, "2.bias": 4}
STEPS = 5


def test_fixtures_are_small_real_timelines() -> None:
    for f in (FUSED, UNFUSED):
        assert f.stat().st_size < 200_000
        assert isinstance(orjson.loads(f.read_bytes()), list)


def test_fused_timeline() -> None:
    tl = T.parse(FUSED)
    assert not tl.truncated and tl.skipped == 0 and tl.unclosed == 0
    assert tl.start_epoch_us is not None and tl.start_epoch_us > 1_500_000_000_000_000
    assert sorted(tl.tensors.values()) == sorted(
        [f"allreduce.{p}" for p in PARAMS] + [f"broadcast.{p}" for p in PARAMS])
    ops = T.tensor_ops(tl)
    ar = ops[ops["op"] == "ALLREDUCE"]
    bc = ops[ops["op"] == "BROADCAST"]
    assert len(ar) == STEPS * len(PARAMS) and len(bc) == len(PARAMS)
    # Every parameter exactly once per occurrence (= step).
    for _occ, part in ar.groupby("occurrence"):
        assert sorted(part["tensor"]) == sorted(f"allreduce.{p}" for p in PARAMS)
    assert sorted(ar["occurrence"].unique()) == list(range(STEPS))
    # Sizes from the closing args.
    for p, n in PARAMS.items():
        sel = ar[ar["tensor"] == f"allreduce.{p}"]
        assert (sel["elements"] == n).all() and (sel["tensor_bytes"] == 4 * n).all()
        assert (sel["dtype"] == "float32").all()
    assert ar["complete"].all()
    assert (ar["comm_activity"] == "MPI_ALLREDUCE").all()
    assert (bc["comm_activity"] == "MPI_BCAST").all()
    # Fusion on: one MPI_ALLREDUCE per step carrying all 4 tensors.
    assert (ar["n_fused"] == 4).all()
    assert ar.groupby("occurrence")["comm_group"].nunique().eq(1).all()
    assert ar["comm_group"].nunique() == STEPS
    fused = T.fused_ops(tl, ops)
    far = fused[fused["op"] == "ALLREDUCE"]
    assert len(far) == STEPS
    assert (far["n_tensors"] == 4).all() and (far["tensor_bytes"] == 848).all()
    assert len(fused[fused["op"] == "BROADCAST"]) == 4
    assert fused["t_start_us"].is_monotonic_increasing
    # CPU tensors: no WAIT_FOR_DATA; negotiation spans exist and are >= 0.
    assert (ops["wait_for_data_us"] == 0).all()
    assert (ops["negotiation_us"] >= 0).all() and ops["neg_start_us"].notna().all()
    # Response cache: per-rank readiness only for each tensor's first (uncached) time.
    assert (ar[ar["occurrence"] == 0]["ready_ranks"] == 2).all()
    assert (ar[ar["occurrence"] > 0]["ready_ranks"] == 0).all()
    assert (ar[ar["occurrence"] > 0]["last_ready_rank"] == -1).all()
    assert len(tl.ready) == 2 * 8


def test_unfused_nocache_timeline_and_straggler() -> None:
    tl = T.parse(UNFUSED)
    ops = T.tensor_ops(tl)
    ar = ops[ops["op"] == "ALLREDUCE"]
    assert len(ar) == STEPS * len(PARAMS)
    # Fusion off: one call per tensor.
    assert (ar["n_fused"] == 1).all() and ar["comm_group"].nunique() == len(ar)
    fused = T.fused_ops(tl, ops)
    assert len(fused[fused["op"] == "ALLREDUCE"]) == STEPS * len(PARAMS)
    # Cache off: every negotiation has both ranks' readiness.
    assert (ops["ready_ranks"] == 2).all()
    assert len(tl.ready) == 2 * len(ops)
    # Step 2: rank 1 slept 50 ms before its backward pass.
    step2 = ar[ar["occurrence"] == 2]
    assert (step2["last_ready_rank"] == 1).all()
    assert (step2["ready_spread_us"] > 40_000).all()
    assert step2["ready_spread_us"].min() > ar[ar["occurrence"] != 2]["ready_spread_us"].max()
    assert (step2["negotiation_us"] >= step2["ready_spread_us"]).all()
    rd = T.readiness(tl)
    assert set(rd["rank"]) == {0, 1} and (rd["lag_us"] >= 0).all()
    st = T.stragglers(tl, min_spread_us=20_000)
    by_rank = st.set_index("rank")
    # Above 20 ms: the 4 parameter broadcasts (rank 1 started late) and step 2's 4 tensors.
    assert by_rank.loc[1, "last_count"] == 8 and by_rank.loc[0, "last_count"] == 0
    assert by_rank.loc[1, "max_wait_us"] >= 40_000


def test_summary_is_jsonable() -> None:
    s = T.parse(FUSED).summary()
    assert orjson.loads(orjson.dumps(s))["tensors"] == 8


# ---------------------------------------------------------------------------
# truncated files
# ---------------------------------------------------------------------------

def _events_in(data: bytes) -> int:
    return len(orjson.loads(data))


@pytest.mark.parametrize("fixture", [FUSED, UNFUSED])
def test_truncated_anywhere_keeps_every_complete_event(tmp_path: Path, fixture: Path) -> None:
    data = fixture.read_bytes()
    full = T.parse(fixture)
    n_full = _events_in(data)
    cut_file = tmp_path / "cut.json"
    prev = 0
    # Cut at 60 places across the file (plus just before the closing bracket).
    cuts = sorted({int(x) for x in np.linspace(400, len(data) - 1, 60)})
    for cut in cuts:
        cut_file.write_bytes(data[:cut])
        tl = T.parse(cut_file)
        assert tl.truncated
        assert tl.events <= n_full
        assert tl.events >= prev  # more bytes never lose events
        prev = tl.events
        # The count recovered is exactly the complete events before the cut.
        head = data[:cut]
        boundary = max(head.rfind(b"},{"), head.rfind(b"},\n{"))
        assert tl.events == _events_in(head[: boundary + 1] + b"]")
        ops = T.tensor_ops(tl)
        assert len(ops) <= len(T.tensor_ops(full))
    assert prev == n_full - 1  # the cut before "]" loses only the last event


def test_job_died_mid_step_leaves_unclosed_spans(tmp_path: Path) -> None:
    data = FUSED.read_bytes()
    # Cut right after the last step's fused MPI_ALLREDUCE began.
    pos = data.rfind(b'"name": "MPI_ALLREDUCE"')
    end = data.find(b"},{", pos)
    f = tmp_path / "died.json"
    f.write_bytes(data[: end + 2])  # ends with "},"
    tl = T.parse(f)
    assert tl.truncated and tl.unclosed > 0
    assert any("never closed" in n for n in tl.notes)
    ops = T.tensor_ops(tl)
    last = ops[ops["occurrence"] == STEPS - 1]
    assert len(last) == 4 and not last["complete"].any()
    assert last["tensor_bytes"].isna().all()
    fused = T.fused_ops(tl, ops)
    assert not fused.iloc[-1]["complete"] and np.isnan(fused.iloc[-1]["t_end_us"])
    assert fused.iloc[-1]["n_tensors"] == 4


# ---------------------------------------------------------------------------
# hostile inputs
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "content, error",
    [
        (b"", TruncatedError),
        (b"   \n", TruncatedError),
        (b"[", TruncatedError),
        (b"[]", TruncatedError),
        (b'{"traceEvents": []}', NotATraceError),
        (b"\x00\x01\x02garbage", NotATraceError),
        (b"[1, 2, 3]", NotATraceError),
        (b'[{"ph": "X", "name": "x", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]', NotATraceError),
        (b"[" + b"[" * 100_000, TruncatedError),
        (b'["a", "b"', NotATraceError),
    ],
)
def test_bad_files_raise_typed_errors(tmp_path: Path, content: bytes, error: type) -> None:
    f = tmp_path / "t.json"
    f.write_bytes(content)
    with pytest.raises(error) as exc:
        T.parse(f)
    assert isinstance(exc.value, ProfilerError)
    assert str(f) in str(exc.value) and "\n" not in str(exc.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        T.parse(tmp_path / "nope.json")
    with pytest.raises(NotFoundError):
        T.parse(tmp_path)


def test_size_limit(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="over the limit"):
        T.parse(FUSED, max_bytes=1000)
    tl = T.parse(FUSED, max_events=50)
    assert tl.events == 50 and tl.truncated


def test_unescaped_quote_in_tensor_name_skips_only_bad_events(tmp_path: Path) -> None:
    # Horovod writes names verbatim: a '"' in a name makes its metadata invalid JSON.
    data = FUSED.read_bytes().replace(
        b'"args": {"name": "allreduce.0.bias"}', b'"args": {"name": "allreduce.0"bias"}', 1)
    f = tmp_path / "q.json"
    f.write_bytes(data)
    tl = T.parse(f)
    assert tl.skipped == 1
    ops = T.tensor_ops(tl)
    ar = ops[ops["op"] == "ALLREDUCE"]
    assert len(ar) == STEPS * len(PARAMS)  # every op still there
    assert "pid7" in set(ar["tensor"]) or len(tl.tensors) == 7


def test_wrong_types_and_orphans_are_skipped(tmp_path: Path) -> None:
    events = [
        {"name": "process_name", "ph": "M", "pid": 0,
         "args": {"start_time_since_epoch_in_micros": 1_700_000_000_000_000}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.w"}},
        {"ph": "E", "ts": 5, "pid": 1},                              # orphan E
        {"ph": "B", "name": "ALLREDUCE", "ts": "soon", "pid": 1},    # bad ts
        {"ph": "B", "name": "ALLREDUCE", "ts": 10, "pid": -3},       # bad pid
        {"ph": "B", "name": "ALLREDUCE", "ts": 10, "pid": True},     # bool pid
        {"ph": "B", "name": 42, "ts": 10, "pid": 1},                 # bad name
        {"ph": "Q", "ts": 10, "pid": 1},                             # unknown phase
        "not an event",
        {"ph": "B", "name": "ALLREDUCE", "ts": 10, "pid": 1},
        {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 11, "pid": 1},
        {"ph": "X", "name": "not-a-rank", "ts": 11, "pid": 1, "dur": 0},
        {"ph": "E", "ts": 15, "pid": 1},
        {"ph": "E", "ts": 9, "pid": 1, "args": {"dtype": "float32", "shape": "[2, 3]"}},
        {"ph": "i", "name": "CYCLE_START", "ts": 20, "s": "g"},
    ]
    f = tmp_path / "w.json"
    f.write_bytes(orjson.dumps(events))
    tl = T.parse(f)
    assert tl.skipped == 8
    assert list(tl.markers["name"]) == ["CYCLE_START"]
    ops = T.tensor_ops(tl)
    assert len(ops) == 1
    r = ops.iloc[0]
    assert r["tensor"] == "allreduce.w" and r["tensor_bytes"] == 24
    assert r["t_end_us"] == 10  # an end before the start is clamped to the start
    assert r["comm_activity"] == "MPI_ALLREDUCE" and r["comm_end_us"] == 15


def test_deep_nesting_is_bounded(tmp_path: Path) -> None:
    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "t"}}]
    events += [{"ph": "B", "name": f"L{i}", "ts": i, "pid": 1} for i in range(50)]
    f = tmp_path / "deep.json"
    f.write_bytes(orjson.dumps(events))
    tl = T.parse(f)
    assert len(tl.spans) == T.MAX_DEPTH and tl.skipped == 50 - T.MAX_DEPTH
    assert tl.unclosed == T.MAX_DEPTH


def test_shape_elements() -> None:
    assert T.shape_elements("[4, 16]") == 64
    assert T.shape_elements("[]") == 1
    assert T.shape_elements("[0, 3]") == 0
    assert T.shape_elements("[a]") is None
    assert T.shape_elements("4, 16") is None
    assert T.shape_elements("[" + "1, " * 600 + "1]") is None  # too long


def test_escape_sequences_in_tensor_names_are_spelled_out(tmp_path: Path) -> None:
    # Horovod writes tensor names verbatim (the user names them): control
    # characters must not reach a terminal or a page from the parsed timeline
    evil = "allreduce.0.bias\\u001b]0;pwned\\u0007\\u001b[2J"
    data = FUSED.read_bytes().replace(b'"allreduce.0.bias"', f'"{evil}"'.encode(), 1)
    f = tmp_path / "evil.json"
    f.write_bytes(data)
    tl = T.parse(f)
    assert "allreduce.0.bias\\x1b]0;pwned\\x07\\x1b[2J" in tl.tensors.values(), tl.tensors
    ops = T.tensor_ops(tl)
    assert not any("\x1b" in str(t) or "\x07" in str(t) for t in ops["tensor"].unique())
