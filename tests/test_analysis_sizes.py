"""Message-size distribution with and without fusion, on synthesised frames with
known counts."""

from __future__ import annotations

import pytest
from analysis_fixtures import concat, frame, sweep, training

from profiler.analysis.sizes import fusion_table, size_distribution, size_summary
from profiler.errors import ProfilerError


def _calls(sizes: list[int], label: str | None = None, ranks: int = 2):  # type: ignore[no-untyped-def]
    rows: dict[str, list[object]] = {k: [] for k in ("t_start_ns", "t_end_ns", "rank", "op",
                                                     "bytes", "seq")}
    for i, s in enumerate(sizes):
        for r in range(ranks):
            rows["t_start_ns"].append(i * 10)
            rows["t_end_ns"].append(i * 10 + 5)
            rows["rank"].append(r)
            rows["op"].append("allreduce")
            rows["bytes"].append(s)
            rows["seq"].append(i)
    return frame(rows, label=label)


def test_pow2_buckets_count_calls_and_bytes_of_one_rank() -> None:
    df = _calls([0, 1, 2, 3, 4, 5, 1000, 1024, 1025, 4096])
    d = size_distribution(df).set_index("size")
    # 0 | 1 | 2 | (2,4] | (4,8] | (512,1024] | (1024,2048] | (2048,4096]
    assert d["calls"].to_dict() == {0: 1, 1: 1, 2: 1, 4: 2, 8: 1, 1024: 2, 2048: 1, 4096: 1}
    assert d.loc[4, "bytes"] == 7 and d.loc[1024, "bytes"] == 2024
    assert d.loc[2048, "size_lo"] == 1024
    assert d["calls_share"].sum() == pytest.approx(1.0)
    assert d["bytes_share"].sum() == pytest.approx(1.0)
    assert d.loc[1024, "size_label"] == "\u2264 1 KiB"


def test_exact_sizes_and_rank_pooling() -> None:
    df = _calls([12, 12, 16, 3000], ranks=3)
    d = size_distribution(df, bucket="exact").set_index("size")
    assert d["calls"].to_dict() == {12: 2, 16: 1, 3000: 1}
    assert d["is_pow2"].to_dict() == {12: False, 16: True, 3000: False}
    pooled = size_distribution(df, bucket="exact", rank=None).set_index("size")
    assert pooled["calls"].to_dict() == {12: 6, 16: 3, 3000: 3}
    with pytest.raises(ProfilerError):
        size_distribution(df, rank=7)
    with pytest.raises(ProfilerError):
        size_distribution(df, bucket="log10")  # type: ignore[arg-type]


def test_control_and_app_rows_are_left_out_by_default() -> None:
    df = training(steps=3, sizes=(4096, 1 << 20), call_ns=(1000, 2000), control_per_step=5)
    d = size_distribution(df, bucket="exact").set_index("size")
    assert d["calls"].to_dict() == {4096: 3, 1 << 20: 3}
    all_kinds = size_distribution(df, bucket="exact", kinds=None).set_index("size")
    assert all_kinds.loc[8, "calls"] == 15


def test_fused_vs_unfused_side_by_side() -> None:
    unfused = _calls([100, 200, 300, 4000, 4000, 5000], label="unfused")
    fused = _calls([16000], label="fused")
    df = concat(fused, unfused)
    t = fusion_table(df, labels=["fused", "unfused"]).set_index("size")
    assert t["calls[fused]"].to_dict() == {128: 0, 256: 0, 512: 0, 4096: 0, 8192: 0, 16384: 1}
    assert t["calls[unfused]"].to_dict() == {128: 1, 256: 1, 512: 1, 4096: 2, 8192: 1,
                                             16384: 0}
    assert t["bytes[fused]"].sum() == 16000
    assert t["bytes[unfused]"].sum() == 13600
    s = size_summary(df).set_index("label")
    assert s.loc["fused", "calls"] == 1 and s.loc["unfused", "calls"] == 6
    assert s.loc["unfused", "distinct_sizes"] == 5
    assert s.loc["unfused", "bytes"] == 13600
    with pytest.raises(ProfilerError):
        fusion_table(unfused.drop(columns=["label"]))
    with pytest.raises(ProfilerError):
        fusion_table(df, labels=["nope"])


def test_by_op_split() -> None:
    a = sweep([8, 16], op="allreduce", iters=2)
    b = sweep([8], op="bcast", iters=3)
    d = size_distribution(concat(a, b), bucket="exact", by_op=True)
    got = {(r.op, r.size): r.calls for r in d.itertuples()}
    assert got == {("allreduce", 8): 2, ("allreduce", 16): 2, ("bcast", 8): 3}
