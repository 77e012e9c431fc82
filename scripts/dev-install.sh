#!/usr/bin/env bash
# Rebuild and reinstall the package (C library included) into .venv.
# Serialized with a lock so that concurrent developers don't clash.
set -euo pipefail
cd "$(dirname "$0")/.."
# build/ first: setuptools would pack a moved or removed module from build/lib.
exec flock /tmp/hvprof-dev-install.lock \
  sh -c 'rm -rf build && .venv/bin/pip install --no-build-isolation --no-deps --force-reinstall -q . \
         && .venv/bin/python scripts/src_hash.py . --stamp'
