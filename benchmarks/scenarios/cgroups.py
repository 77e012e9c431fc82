"""Real cgroups for the scenarios and tests: a child cgroup with a CPU quota
(cgroup v1's cpu controller where it is mounted, else cgroup v2's cpu.max), or
a cpuset, that one rank of a job moves itself into before it starts (a
wrapper: the rank writes its own pid into cgroup.procs, then execs the
program), removed afterwards, also after a failure.  Needs root.

    with quota_cgroup(0.3) as cg:          # 30 ms every 100 ms
        argv = cg.wrap(argv, rank=1)        # rank 1 runs under the quota
        subprocess.run(["mpirun", "-n", "2", *argv])
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

V1_CPU = Path("/sys/fs/cgroup/cpu")
V1_CPUSET = Path("/sys/fs/cgroup/cpuset")
V2 = Path("/sys/fs/cgroup/unified")
PERIOD_US = 100_000


@dataclass
class Cgroup:
    path: Path  # the cgroup's folder
    version: int
    kind: str  # "quota" or "cpuset"

    def wrap(self, argv: Sequence[str], rank: int) -> list[str]:
        """argv run so that the rank `rank` of an Open MPI job (OMPI_COMM_WORLD_RANK)
        moves itself into this cgroup before it starts; the other ranks run as
        they are."""
        procs = shlex.quote(str(self.path / "cgroup.procs"))
        script = (f'if [ "${{OMPI_COMM_WORLD_RANK:-}}" = "{int(rank)}" ]; then '
                  f'echo $$ > {procs}; fi; exec "$@"')
        return ["sh", "-c", script, "sh", *argv]


def available(kind: str = "quota") -> tuple[bool, str]:
    """(True, "") when a child cgroup of this kind can be made here, else why not."""
    if os.geteuid() != 0:
        return False, "cgroups need root"
    if kind == "quota":
        if (V1_CPU / "cpu.cfs_quota_us").exists():
            return True, ""
        if (V2 / "cgroup.controllers").exists() and "cpu" in (
                V2 / "cgroup.controllers").read_text().split():
            return True, ""
        return False, "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 with cpu)"
    if (V1_CPUSET / "cpuset.cpus").exists():
        return True, ""
    return False, "no cgroup v1 cpuset controller at /sys/fs/cgroup/cpuset"


def _empty(path: Path, parent: Path) -> None:
    """Move whatever still runs in the cgroup to its parent (a killed job's
    ranks are killed), then remove it."""
    for _ in range(50):
        try:
            pids = [int(x) for x in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def sweep_stale(prefix: str = "hvprof-") -> None:
    """Remove the cgroups this module made for jobs that are gone (a killed
    test): empty ones named with `prefix`."""
    for base in (V1_CPU, V1_CPUSET, V2):
        if not base.is_dir():
            continue
        for d in base.glob(f"{prefix}*"):
            with contextlib.suppress(OSError):
                if not (d / "cgroup.procs").read_text().split():
                    d.rmdir()


@contextlib.contextmanager
def quota_cgroup(cpus: float, period_us: int = PERIOD_US) -> Iterator[Cgroup]:
    """A child cgroup whose CPU quota is `cpus` CPUs (quota = cpus x period)."""
    ok, why = available("quota")
    if not ok:
        raise RuntimeError(why)
    sweep_stale()
    name = f"hvprof-q-{os.getpid()}-{secrets.token_hex(2)}"
    quota = max(1000, int(cpus * period_us))
    if (V1_CPU / "cpu.cfs_quota_us").exists():
        path, version = V1_CPU / name, 1
        path.mkdir()
        try:
            (path / "cpu.cfs_period_us").write_text(str(period_us))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
        except BaseException:
            _empty(path, V1_CPU)
            raise
        parent = V1_CPU
    else:
        path, version, parent = V2 / name, 2, V2
        path.mkdir()
        try:
            (path / "cpu.max").write_text(f"{quota} {period_us}")
        except BaseException:
            _empty(path, V2)
            raise
    try:
        yield Cgroup(path, version, "quota")
    finally:
        _empty(path, parent)


@contextlib.contextmanager
def cpuset_cgroup(cpus: str) -> Iterator[Cgroup]:
    """A child cpuset cgroup (v1) allowing only `cpus` ("0", "0-1")."""
    ok, why = available("cpuset")
    if not ok:
        raise RuntimeError(why)
    sweep_stale()
    path = V1_CPUSET / f"hvprof-s-{os.getpid()}-{secrets.token_hex(2)}"
    path.mkdir()
    try:
        (path / "cpuset.mems").write_text((V1_CPUSET / "cpuset.mems").read_text())
        (path / "cpuset.cpus").write_text(cpus)
        yield Cgroup(path, 1, "cpuset")
    finally:
        _empty(path, V1_CPUSET)
