"""The shape of an example output in the docs: real output pasted there,
checked by the tests against what the code prints now, numbers masked (they
differ from run to run; the words, the parts and their order do not)."""

from __future__ import annotations

import re
from pathlib import Path

TIME = r"-?\d+(?:\.\d+)? (?:ns|us|ms|s)"


def mask(line: str) -> str:
    """A line's shape: times, shares, counts, bars and the findings' numbers
    masked."""
    line = re.sub(TIME, "T", line)
    line = re.sub(r"\u2190 [\d, ]+", "<- N", line)
    line = re.sub(r"\(\d+(?:, \d+)*\)", "(N)", line)
    line = re.sub(r"(?:<\s*)?\d+(?:\.\d+)?%", "P", line)  # "<1%" is a share too
    line = re.sub(r"\d+(?:[.,]\d+)*", "N", line)
    return re.sub(r"[\u2588\s]+", " ", line).strip()


def doc_block(path: Path, first: str) -> list[str]:
    """The indented example in `path` whose first line starts with `first`
    (after the 4-space indent), without that line and de-indented, up to the
    next unindented text."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("    " + first))
    block = []
    for x in lines[i + 1:]:
        if x and not x.startswith("    "):
            break
        block.append(x[4:])
    while block and not block[-1]:
        block.pop()
    return block
