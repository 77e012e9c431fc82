"""What a person sees in a real terminal: each command run in a pseudo-terminal
of 80 and of 120 columns fits the width, and no cell is cut ("…")."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "analysis"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_pty(args: list[str], cols: int, cwd: Path) -> tuple[int, str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, cols, 0, 0))
    env = {**os.environ, "COLUMNS": str(cols), "LINES": "60", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-P", "-m", "profiler.cli", *args], cwd=cwd,
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO once the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    rc = proc.wait(timeout=120)
    text = ANSI.sub("", b"".join(chunks).decode("utf-8", "replace")).replace("\r\n", "\n")
    return rc, text


FUSED = str(DATA / "fused" / "trace.json")
UNFUSED = str(DATA / "unfused" / "trace.json")
COMMANDS = {
    "summarize": ["summarize", FUSED],
    "summarize-by-rank": ["summarize", UNFUSED, "--by", "op,bucket,rank"],
    "advise": ["advise", FUSED, UNFUSED],
    "compare": ["compare", FUSED, UNFUSED, "--labels", "fused,unfused"],
    "compare-all": ["compare", FUSED, UNFUSED, "--all"],
    "check": ["check", FUSED],
    "tensors": ["tensors", FUSED],
}


@pytest.mark.parametrize("cols", [80, 120])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_fits_the_terminal_and_cuts_no_cell(name: str, cols: int, tmp_path: Path) -> None:
    rc, text = run_in_pty(COMMANDS[name], cols, tmp_path)
    assert rc == 0, text[-2000:]
    lines = text.splitlines()
    assert lines and lines[0].strip()
    assert "\u2026" not in text, text
    too_long = [ln for ln in lines if len(ln) > cols]
    assert not too_long, too_long
    assert not re.search(r"\d\.?\d*e[+-]\d\d", text), text
    if name.startswith("summarize"):
        # the call counts are never dropped, whatever the width
        assert "calls" in text
