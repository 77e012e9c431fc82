"""`profiler watch` runs at the scheduler's idle priority (SCHED_IDLE) so that,
sharing cores with the ranks, it takes only time they leave; --priority normal
keeps the priority it was started with, and so does --once unless told idle.
Read from the running watcher's process (its scheduling policy as the kernel
holds it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import rawgen
from conftest import ROOT

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")


def policy_of_running_watcher(directory: Path, *extra: str) -> int:
    """The scheduling policy of `profiler watch DIR --follow` once it has
    refreshed (a frame on its output), read while it runs."""
    p = subprocess.Popen([sys.executable, "-m", "profiler.cli", "watch", str(directory),
                          "--follow", "--interval", "0.2", "--format", "json", *extra],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # the first refresh is done
        assert line.startswith("{"), p.stderr.read() if p.stderr else line
        return os.sched_getscheduler(p.pid)
    finally:
        p.kill()
        p.wait(timeout=30)


@pytest.fixture()
def running(tmp_path: Path) -> Path:
    (tmp_path / "raw").mkdir()
    rawgen.simple_rank(0, 1, n=50).write(tmp_path / "raw" / "rank-00000.hvprof")
    return tmp_path


def test_the_watcher_runs_at_idle_priority(running: Path) -> None:
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the test's own is not
    assert policy_of_running_watcher(running) == os.SCHED_IDLE


def test_priority_normal_keeps_the_callers(running: Path) -> None:
    mine = os.sched_getscheduler(0)
    assert policy_of_running_watcher(running, "--priority", "normal") == mine


@pytest.mark.parametrize(("extra", "want"), [
    ([], "idle"), (["--once"], "normal"), (["--once", "--priority", "idle"], "idle"),
    (["--priority", "normal"], "normal")])
def test_once_keeps_its_priority_unless_told(extra: list[str], want: str) -> None:
    """One snapshot someone waits for is not left to the time that spinning
    ranks leave (a hung job's ranks may leave none)."""
    import argparse

    from profiler.cli import watch

    ap = argparse.ArgumentParser()
    watch.add_parser(ap.add_subparsers())
    assert watch.priority_of(ap.parse_args(["watch", "DIR", *extra])) == want
