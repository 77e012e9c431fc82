"""The hash of what the editable install compiles (setup.py, hooks/, the
extensions in profiler/_ext/, the start-up hook, and the version of the
environment's TensorFlow, whose headers the kernel hooks are built against):
one definition for scripts/setup.sh and scripts/dev-install.sh, which record it
at each install (.venv/.hvprof-package), and tests/conftest.py, which rebuilds
when the checkout has moved on since.  Python sources are not in it: the
editable install imports them from the checkout.

    python scripts/src_hash.py ROOT          # print the hash
    python scripts/src_hash.py ROOT --stamp  # write it to ROOT/.venv/.hvprof-package
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

PATTERNS = ["setup.py", "hooks/*.c", "hooks/*.h", "hooks/tf/*.cc", "profiler/_ext/*",
            "profiler/*.pth"]
STAMP = Path(".venv") / ".hvprof-package"


def src_hash(root: Path) -> str:
    h = hashlib.sha256()
    files = sorted({p for pat in PATTERNS for p in root.glob(pat) if p.is_file()})
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(b"tensorflow=" + tensorflow_version().encode())
    return h.hexdigest()


def tensorflow_version() -> str:
    """The version of TensorFlow in the running interpreter's environment
    ("none" without it), without importing it: installing or changing it
    after the package rebuilds the kernel hooks."""
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        return "none"
    dists = md.packages_distributions().get("tensorflow") or []
    return md.version(dists[0]) if dists else "unknown"


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve()
    digest = src_hash(root)
    if sys.argv[2:] == ["--stamp"]:
        (root / STAMP).write_text(digest + "\n")
    else:
        print(digest)
