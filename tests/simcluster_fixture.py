"""pytest fixture for the simulated cluster (profiler.bench.simcluster): hosts as network,
UTS and time namespaces on this machine.  Tests that use it skip, with the
reason printed, where namespaces cannot be made (not root, no `ip`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from profiler.bench import simcluster

ClusterFactory = Callable[..., simcluster.SimCluster]

_WHY: list[tuple[bool, str]] = []


def cluster_available() -> tuple[bool, str]:
    if not _WHY:
        _WHY.append(simcluster.available(rate=True))
    return _WHY[0]


@pytest.fixture
def sim_cluster() -> Iterator[ClusterFactory]:
    """sim_cluster(hosts=3, offsets=[0, 777, 2501], rate=None, slots=2): a
    cluster, removed when the test ends (passed, failed or interrupted;
    a killed test's cluster is removed by the next start-up)."""
    ok, why = cluster_available()
    if not ok:
        print(f"SKIP simulated cluster: {why}")
        pytest.skip(f"simulated cluster unavailable: {why}")
    made: list[simcluster.SimCluster] = []

    def make(hosts: int = 2, offsets: Sequence[int] | None = None, rate: str | None = None,
             slots: int = 2, **more: Any) -> simcluster.SimCluster:
        """more: SimCluster's other arguments (host_rates, private)."""
        c = simcluster.SimCluster(hosts=hosts, offsets=offsets, rate=rate, slots=slots, **more)
        made.append(c)
        return c.__enter__()

    try:
        yield make
    finally:
        for c in made:
            c.close()
