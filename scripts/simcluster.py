#!/usr/bin/env python3
"""A small cluster on one machine (network, UTS and time namespaces), for
multi-host runs of the profiler.  Same as `python -m profiler.bench.simcluster`; runs
from the checkout without the package installed.

    scripts/simcluster.py up --hosts 3 --offsets 0,777,2501 --rate 1gbit
    scripts/simcluster.py run -- python job.py      # mpirun across the hosts
    scripts/simcluster.py exec h1 -- hostname       # a command on one host
    scripts/simcluster.py status
    scripts/simcluster.py down [--all]
"""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.argv[0] = "simcluster"
    here = Path(__file__).resolve().parent.parent
    runpy.run_path(str(here / "profiler" / "bench" / "simcluster.py"), run_name="__main__")
