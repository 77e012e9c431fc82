"""The hash of what the installed package is built from (setup.py, hooks/,
profiler/, analysis/): one definition for scripts/setup.sh and
scripts/dev-install.sh, which record it at each install
(.venv/.hvprof-package), and tests/conftest.py, which reinstalls when the
checkout has moved on since.

    python scripts/src_hash.py ROOT          # print the hash
    python scripts/src_hash.py ROOT --stamp  # write it to ROOT/.venv/.hvprof-package
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

PATTERNS = ["setup.py", "pyproject.toml", "hooks/*.c", "hooks/*.h", "profiler/**/*.py",
            "profiler/*.pth", "profiler/py.typed", "analysis/**/*.py", "analysis/**/*.js"]
STAMP = Path(".venv") / ".hvprof-package"


def src_hash(root: Path) -> str:
    h = hashlib.sha256()
    files = sorted({p for pat in PATTERNS for p in root.glob(pat) if p.is_file()})
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve()
    digest = src_hash(root)
    if sys.argv[2:] == ["--stamp"]:
        (root / STAMP).write_text(digest + "\n")
    else:
        print(digest)
