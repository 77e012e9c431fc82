#!/usr/bin/env python3
"""Per-call overhead of the profiler on MPI_Allreduce, 2 ranks (benchmarks/, not a test).

Builds overhead.c with mpicc and runs it under mpirun twice:
  - profiled: the library preloaded, so MPI_Allreduce goes through the wrapper
    while PMPI_Allreduce does not; blocks of calls alternate between the two in
    one process, and the median per-call difference is the added cost;
  - noise floor: nothing preloaded, both paths are the same function.
Also reports raw bytes per recorded call from the files the profiled run wrote.

Usage: python benchmarks/overhead/run.py [--rounds 31] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


def library() -> str:
    from profiler.collect import native

    return native.library_path()


def run(exe: Path, rounds: int, preload: str | None, prof_dir: Path) -> list[dict[str, float]]:
    env = {**os.environ, **ENV, "HOROVOD_PROFILE_DIR": str(prof_dir)}
    cmd = ["mpirun", "-n", "2"]
    if preload:
        env["HOROVOD_PROFILE"] = "1"
        cmd += ["-x", f"LD_PRELOAD={preload}", "-x", "HOROVOD_PROFILE", "-x", "HOROVOD_PROFILE_DIR"]
    out = subprocess.run([*cmd, str(exe), str(rounds)], env=env, capture_output=True, text=True,
                         check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0].isdigit():
            b, base, prof, add, p25, p75 = parts
            rows.append({"bytes": int(b), "base_ns": float(base), "prof_ns": float(prof),
                         "added_ns": float(add), "p25": float(p25), "p75": float(p75)})
    return rows


def bytes_per_call(prof_dir: Path) -> float:
    from profiler.formats.raw import read_raw

    files = sorted((prof_dir / "raw").glob("rank-*.hvprof"))
    size = sum(f.stat().st_size for f in files)
    calls = sum(len(read_raw(f).records) for f in files)
    return size / max(calls, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each kind, alternating")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "overhead"
        subprocess.run(["mpicc", "-O2", str(HERE / "overhead.c"), "-o", str(exe)], check=True)
        results: dict[str, list[list[dict[str, float]]]] = {"profiled": [], "floor": []}
        bpc = 0.0
        for i in range(args.repeat):
            d = Path(tmp) / f"prof{i}"
            results["profiled"].append(run(exe, args.rounds, library(), d))
            bpc = bytes_per_call(d)
            results["floor"].append(run(exe, args.rounds, None, Path(tmp) / f"none{i}"))
    print(f"{'bytes':>8} {'base ns':>10} {'added ns (median of runs)':>26} {'noise floor ns':>15}")
    summary = []
    for k, row in enumerate(results["profiled"][0]):
        added = sorted(r[k]["added_ns"] for r in results["profiled"])
        floor = sorted(r[k]["added_ns"] for r in results["floor"])
        base = sorted(r[k]["base_ns"] for r in results["profiled"])
        med = added[len(added) // 2]
        summary.append({"bytes": row["bytes"], "base_ns": base[len(base) // 2], "added_ns": med,
                        "added_all": added, "floor_ns": floor[len(floor) // 2]})
        print(f"{row['bytes']:>8} {base[len(base) // 2]:>10.1f} {med:>26.1f} "
              f"{floor[len(floor) // 2]:>15.1f}")
    print(f"raw bytes per recorded call: {bpc:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": summary, "bytes_per_call": bpc}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
