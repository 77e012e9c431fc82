#!/usr/bin/env bash
# Install the checkout into .venv as an editable package: Python is imported
# from the checkout itself (profiler/, with profiler/analysis a link to
# analysis/), the compiled parts are built in place (hooks/*.c ->
# profiler/_lib/libhvprof.so, the extensions), and the start-up hook
# (horovod_profiler.pth) is copied to site-packages, where an editable wheel
# cannot put it.  Rerun after changing C sources or setup.py; editing Python
# needs nothing.  tests/conftest.py reruns it when scripts/src_hash.py's hash of
# those sources has moved on.  Serialized with a lock (one install at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
exec flock /tmp/hvprof-dev-install.lock sh -c '
  set -e
  rm -rf build
  .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e . \
      2>&1 | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  .venv/bin/python -c "import importlib.metadata as m; m.version(\"horovod-profiler\")"
  test -f profiler/_lib/libhvprof.so
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])")
  cp profiler/horovod_profiler.pth "$site/.horovod_profiler.pth.$$"
  mv "$site/.horovod_profiler.pth.$$" "$site/horovod_profiler.pth"
  .venv/bin/python scripts/src_hash.py . --stamp'
