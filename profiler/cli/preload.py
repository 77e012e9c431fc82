"""`profiler preload`: print the interposition library's path, for LD_PRELOAD.

    mpirun -x HOROVOD_PROFILE=1 -x LD_PRELOAD=$(profiler preload) ./app
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "preload", help="print the library path for LD_PRELOAD (non-Python programs)",
        description="Print the path of libhvprof.so, for `mpirun -x LD_PRELOAD=$(profiler "
                    "preload) ./app`.")
    return p


def run(args: argparse.Namespace) -> int:
    from profiler.collect.native import library_path

    print(library_path())
    return 0
