"""Job records for the site tests (tests/test_site_*.py): one real record, made
once from the committed two-rank fixture (tests/data/analysis/fused), and
copies of it varied by known amounts (name, user, start, step time, the parts
of the step, settings, interconnect), so that every expected answer follows
from the construction."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from profiler.site.record import build_record, node_hours_lost, sig4

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "analysis" / "fused"
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=timezone.utc)


def copy_fixture(dest: Path) -> Path:
    """The fixture profile copied to `dest` (a record is written beside it)."""
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("timeline.json"))
    return dest


@functools.lru_cache(maxsize=1)
def _base() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        return build_record(copy_fixture(Path(tmp) / "fused") / "trace.json",
                            {"SLURM_JOB_ID": "1000", "SLURM_JOB_NAME": "resnet",
                             "SLURM_JOB_USER": "alice", "SLURM_JOB_PARTITION": "gpu"})


def base_record() -> dict[str, Any]:
    """The fixture's record (made once per session), a copy of it."""
    return copy.deepcopy(_base())


def varied(base: dict[str, Any], i: int, *, name: str = "resnet", user: str = "alice",
           partition: str = "gpu", framework: str = "pytorch", hours: float = 1.0,
           hosts: int = 2, parts: dict[str, float] | None = None,
           settings: dict[str, str] | None = None, transports: list[str] | None = None,
           ranks: int = 8, day: float | None = None) -> dict[str, Any]:
    """A copy of `base` as job number `i`: its parts (ms per step) set the
    breakdown and the step time; node-hours lost follow from them."""
    r = copy.deepcopy(base)
    parts = parts or {"compute": 80.0, "wait_ranks": 10.0, "horovod": 5.0, "transfer": 5.0}
    step = sum(parts.values())
    start = T0 + timedelta(days=i if day is None else day)
    r["job"].update(id=f"slurm-{1000 + i}-0x{i:016x}", job_id=str(1000 + i), name=name,
                    user=user, partition=partition)
    r["versions"]["framework"] = framework
    r["start"] = start.isoformat(timespec="seconds")
    r["end"] = (start + timedelta(hours=hours)).isoformat(timespec="seconds")
    r["duration_s"] = hours * 3600
    r["hosts"] = [f"node{h:03d}" for h in range(hosts)]
    r["ranks"] = ranks
    r["step_ms"] = sig4(step)
    r["breakdown"] = [{"part": p, "ms": sig4(v), "lo_ms": sig4(v * 0.95), "hi_ms": sig4(v * 1.05),
                       "share": sig4(v / step)} for p, v in parts.items()]
    r["node_hours"] = sig4(hours * hosts)
    r["node_hours_comm"], r["node_hours_wait"] = node_hours_lost(hours * hosts, r["breakdown"])
    r["settings"] = dict(settings or {"HOROVOD_FUSION_THRESHOLD": "134217728"})
    r["interconnect"] = {"transports": list(transports or ["tcp"]), "line": ""}
    return r


@contextlib.contextmanager
def shared_tmp() -> Iterator[Path]:
    """A temporary folder other users can reach (pytest's own is root's 0700),
    removed afterwards, also after a failure."""
    d = Path(tempfile.mkdtemp(prefix="hvprof-site-"))
    try:
        os.chmod(d, 0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user(uid: int, gid: int, argv: list[str], env: dict[str, str] | None = None,
            groups: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`argv` run as another user (setpriv; the tests that call it need root)."""
    grp = (["--groups=" + ",".join(map(str, groups))] if groups else ["--clear-groups"])
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", *grp, *argv],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=60)


def chown_tree(top: Path, uid: int, gid: int) -> None:
    for dirpath, _dirs, files in os.walk(top):
        os.chown(dirpath, uid, gid)
        for f in files:
            os.chown(os.path.join(dirpath, f), uid, gid)


PG_BIN = Path("/usr/lib/postgresql/15/bin")


class Postgres:
    """A real server (Debian's PostgreSQL 15) in a temporary folder, on a unix
    socket only, fsync off: for tests/test_site_store.py and
    benchmarks/site_store.py."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hvprof-pg-"))
        self.data = self.dir / "data"
        self.sock = self.dir / "sock"
        self.sock.mkdir()
        self.owner: tuple[int, int] | None = None
        if os.geteuid() == 0:  # the server refuses root: run it as postgres
            pw = pwd.getpwnam("postgres")
            self.owner = (pw.pw_uid, pw.pw_gid)
            os.chmod(self.dir, 0o755)
            for p in (self.dir, self.sock):
                os.chown(p, *self.owner)

    def run(self, *argv: str) -> None:
        cmd = [str(PG_BIN / argv[0]), *argv[1:]]
        if self.owner:
            cmd = ["setpriv", f"--reuid={self.owner[0]}", f"--regid={self.owner[1]}",
                   "--clear-groups", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=self.dir)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {p.stdout}{p.stderr}")

    def start(self) -> None:
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.run("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.dir / "log"), "-o",
                 f"-k {self.sock} -c listen_addresses='' -c fsync=off", "start")

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, user: str) -> str:
        return f"postgresql://{user}@/postgres?host={self.sock}"
