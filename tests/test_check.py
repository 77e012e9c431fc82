"""Cross-rank consistency (`profiler check`): a clean real job is consistent; a
collective whose operation or size differs between ranks, and a rank that left a
call out, are named with the communicator and sequence number."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from analysis_fixtures import training

from profiler.analysis.consistency import count_mismatches, mismatches

DATA = Path(__file__).parent / "data" / "analysis"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "profiler.cli", *args],
                          capture_output=True, text=True, timeout=120)


def test_clean_jobs_are_consistent() -> None:
    df = training(steps=6)
    assert mismatches(df).empty and count_mismatches(df).empty
    for name in ("fused", "unfused"):  # real 2-rank Horovod runs
        p = _cli("check", str(DATA / name / "trace.json"))
        assert p.returncode == 0, p.stdout + p.stderr
        assert "consistent" in p.stdout and "INCONSISTENT" not in p.stdout


def test_different_op_and_size_on_one_call_are_named() -> None:
    df = training(steps=6)
    data = df.index[(df["kind"] == "data") & (df["rank"] == 1)]
    i, j = data[3], data[7]
    df["op"] = df["op"].cat.add_categories(["bcast"])
    df.loc[i, "op"] = "bcast"
    df.loc[j, "bytes"] = df.loc[j, "bytes"] + 4
    bad = mismatches(df)
    got = {(int(r.seq), r.field) for r in bad.itertuples()}
    assert got == {(int(df.loc[i, "seq"]), "op"), (int(df.loc[j, "seq"]), "bytes")}
    row = bad.loc[bad["field"] == "op"].iloc[0]
    assert row["values"] == "allreduce: 0; bcast: 1"


def test_a_rank_that_left_a_call_out_is_named() -> None:
    df = training(steps=6)
    drop = df.index[(df["kind"] == "data") & (df["rank"] == 0)][2]
    short = count_mismatches(df.drop(index=drop))
    assert len(short) == 1
    r = short.iloc[0]
    assert int(r["rank"]) == 0 and int(r["calls"]) == int(r["expected"]) - 1


def test_check_cli_exit_1_and_json(tmp_path: Path) -> None:
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    df = training(steps=4)
    k = df.index[(df["kind"] == "data") & (df["rank"] == 1)][0]
    df.loc[k, "bytes"] = 12345
    f = tmp_path / "job.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), f)
    p = _cli("check", str(f))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "INCONSISTENT" in p.stdout and f"seq {int(df.loc[k, 'seq'])}: bytes" in p.stdout
    j = _cli("check", str(f), "--format", "json")
    assert j.returncode == 1 and json.loads(j.stdout)["consistent"] is False
    missing = _cli("check", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
