"""The scenarios' definitions: the Scenario record, the constants the runner
(suite.py) and the generator (randomized.py) share, and the fixed suite's
scenarios.  How each is run and judged: suite.py's docstring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "job.py"
TOLERANCE = 0.25
#: Alternating unprofiled (cause, twin) pairs behind a "twin" truth.
TWIN_ROUNDS = 3
#: Unprofiled runs behind an "alternate" truth: even, odd, even, odd.
ALT_ROUNDS = 4
#: A scenario job's time limit (seconds; they take 5-60 s here)
JOB_TIMEOUT_S = 600.0
#: The job's clocks corroborate a late rank the profiler names when they make
#: the same rank last at this p (the finding's own bar is 0.01: the profiler's
#: steps and the job's differ by one at the ends, so the two tests can fall
#: either side of it on one run)
CORROBORATE = 0.05

#: Open MPI on one small machine: root allowed, oversubscription, no binding.
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
}

#: Findings that name a rank, a message size or a setting: a null scenario must
#: not make any of them significant.
NAMING = ("late_ranks", "latency_cliffs", "cycle_time", "fusion", "horovod_settings",
          "control_plane", "uneven_data", "slow_link", "cpu_quota")

RULES = """1
2
1
2
3
0 0 0 0
131072 5 0 64
524288 0 0 0
"""
"""Open MPI tuned dynamic rules: allreduce (id 2) on 2-rank communicators uses the
segmented ring with 64-byte segments from 128 KiB to 512 KiB (a 20-40x cliff
at 2 ranks in shared memory), the default elsewhere."""


@dataclass
class Scenario:
    name: str
    cause: str
    expect: str | None
    truth: str
    job: list[str]
    env: dict[str, str] = field(default_factory=dict)
    #: significant findings that are true of this job by construction (key -> why)
    also: dict[str, str] = field(default_factory=dict)
    np: int = 2
    confirm: bool = False
    competitors: int = 0
    hosts: int = 1
    host_rates: dict[int, str] | None = None
    twin_env: dict[str, str] | None = None
    twin_job: list[str] | None = None
    fast: bool = False
    rules: bool = False
    #: the truth as a number, from the scenario's parameters (None: measured)
    value: Callable[[int], float] | None = None
    #: CPUs every rank is pinned to (taskset -c), twin included (None: not pinned)
    pin: str | None = None
    #: each rank bound to a CPU of its own (rank r on the r-th CPU, modulo
    #: their number), twin included
    bind: bool = False
    #: the CPU the competitors are pinned to (None: wherever the kernel puts them)
    competitor_cpu: int | None = None
    #: measure the fabric (the allreduce sweep on the same simulated hosts and
    #: link rates) and advise with it as the bench
    bench: bool = False
    #: true findings that may rank above the expected cause (key -> why): the
    #: expected one is judged as the first significant finding not named here
    above: dict[str, str] = field(default_factory=dict)
    #: the Open MPI rules file's text when `rules` (None: RULES)
    rules_text: str | None = None
    #: (rank, CPUs): that rank runs in a cgroup of its own with this CPU quota
    #: (benchmarks/scenarios/cgroups.py; the twin runs without it)
    quota: tuple[int, float] | None = None


BASE = ["--model", "mlp", "--steps", "40", "--batch", "64"]
COMPUTE_BOUND = "the job's compute is most of its step by construction"
WAITING = "ranks' step times vary on a shared 2-core machine"

SCENARIOS: list[Scenario] = [
    Scenario("clean", "nothing injected", None, "none", BASE,
             also={"compute_bound": COMPUTE_BOUND, "rank_waiting": WAITING}, fast=True),
    Scenario("jitter", "every rank sleeps uniform(0, 60) ms per step, independently",
             "rank_waiting", "jitter", [*BASE, "--jitter-ms", "60"],
             also={"compute_bound": COMPUTE_BOUND}, value=lambda n: 60.0 / 6, fast=True),
    Scenario("late", "rank 1 sleeps 40 ms per step", "late_ranks", "late",
             [*BASE, "--late-rank", "1", "--late-ms", "40"],
             also={"rank_waiting": WAITING}, value=lambda n: 40.0, fast=True),
    Scenario("late+jitter", "rank 1 sleeps 40 ms per step; every rank uniform(0, 20) ms",
             "late_ranks", "late",
             [*BASE, "--late-rank", "1", "--late-ms", "40", "--jitter-ms", "20"],
             also={"rank_waiting": "the jitter's own waiting"},
             value=lambda n: 40.0 + 10.0 - 20.0 * n / (n + 1)),
    Scenario("oversubscribed", "2 intra-op threads per rank: 4 compute threads on 2 cores",
             "cpu_contention", "runqueue", [*BASE, "--threads", "2", "--model", "wide"],
             also={"rank_waiting": WAITING, "transfer_bound": "contention slows transfers",
                   "compute_bound": "4 compute threads on 2 cores: compute, slowed by the "
                                    "wait for cores, is most of the step"}),
    Scenario("competitor", "two busy-looping processes beside the job",
             "noisy_neighbour", "runqueue_twin", BASE, competitors=2,
             also={"rank_waiting": WAITING, "transfer_bound": "contention slows transfers",
                   "cpu_contention": "the job's threads wait for cores the loops hold"}),
    Scenario("competitor-1core", "ranks bound a CPU each, a busy loop on rank 1's",
             "noisy_neighbour", "twin", BASE, competitors=1, competitor_cpu=1, bind=True,
             twin_env={},
             also={"rank_waiting": WAITING, "transfer_bound": "contention slows transfers",
                   "compute_bound": "compute slowed by the wait for the core",
                   "cpu_contention": "rank 1's threads wait for the core the loop holds"}),
    Scenario("slow-link", "2 simulated hosts, one link limited to 200 Mbit/s",
             "transfer_bound", "twin", [*BASE, "--model", "wide", "--steps", "20"],
             hosts=2, host_rates={1: "200mbit"}, twin_env={}, bench=True,
             also={"rank_waiting": WAITING}),
    Scenario("slow-host-3", "3 simulated hosts, one rank each, h2's link limited to 300 Mbit/s",
             "slow_link", "twin", [*BASE, "--model", "mid", "--steps", "20"],
             np=3, hosts=3, host_rates={2: "300mbit"}, twin_env={},
             also={"rank_waiting": WAITING, "transfer_bound": "the slow link's transfers"}),
    Scenario("slow-host-4", "4 simulated hosts, one rank each, h1's link limited to 300 Mbit/s",
             "slow_link", "twin", [*BASE, "--model", "mid", "--steps", "16"],
             np=4, hosts=4, host_rates={1: "300mbit"}, twin_env={},
             also={"rank_waiting": WAITING, "transfer_bound": "the slow link's transfers"}),
    Scenario("links-alike-3", "3 simulated hosts, every link limited to 300 Mbit/s", None,
             "none", [*BASE, "--model", "mid", "--steps", "16"],
             np=3, hosts=3, host_rates={0: "300mbit", 1: "300mbit", 2: "300mbit"},
             also={"rank_waiting": WAITING, "transfer_bound": "every link is slow"}),
    Scenario("quota", "rank 1 in a cgroup with a CPU quota of 0.25 CPU", "cpu_quota", "twin",
             BASE, quota=(1, 0.25), twin_env={},
             also={"rank_waiting": WAITING, "compute_bound": COMPUTE_BOUND,
                   "transfer_bound": "the throttled rank's transfers"}),
    Scenario("fusion-off", "128 small tensors, fusion off, 2 simulated hosts (TCP)",
             "fusion", "twin", ["--model", "small", "--steps", "30", "--batch", "16"],
             env={"HOROVOD_FUSION_THRESHOLD": "0"}, twin_env={"HOROVOD_FUSION_THRESHOLD": ""},
             hosts=2, also={"rank_waiting": WAITING, "transfer_bound": "the unfused calls"}),
    Scenario("fusion-split", "128 small tensors, a 4 KiB fusion threshold, 2 simulated hosts",
             "fusion", "twin", ["--model", "small", "--steps", "30", "--batch", "16"],
             env={"HOROVOD_FUSION_THRESHOLD": "4096"},
             twin_env={"HOROVOD_FUSION_THRESHOLD": ""}, hosts=2,
             also={"rank_waiting": WAITING, "transfer_bound": "the split calls"}),
    Scenario("fusion-cpu", "resnet8 (29 tensors), fusion off, 2 ranks on 2 cores",
             "fusion", "twin", ["--model", "resnet8", "--steps", "30", "--batch", "32"],
             env={"HOROVOD_FUSION_THRESHOLD": "0"}, twin_env={"HOROVOD_FUSION_THRESHOLD": ""},
             also={"rank_waiting": WAITING, "compute_bound": COMPUTE_BOUND},
             above={"cpu_contention": "4 busy threads on 2 cores: the compute thread's "
                    "whole run-queue wait, of which the unfused calls' polling is a part",
                    "compute_bound": COMPUTE_BOUND}),
    Scenario("fusion-1core", "resnet8, fusion off, both ranks pinned to one core",
             "fusion", "twin", ["--model", "resnet8", "--steps", "20", "--batch", "8"],
             env={"HOROVOD_FUSION_THRESHOLD": "0"}, twin_env={"HOROVOD_FUSION_THRESHOLD": ""},
             pin="0", also={"rank_waiting": WAITING,
                            "transfer_bound": "each unfused call waits for the peer's thread "
                                              "to get the core"}),
    Scenario("cycle", "HOROVOD_CYCLE_TIME=20 ms", "cycle_time", "twin", BASE,
             env={"HOROVOD_CYCLE_TIME": "20"}, twin_env={"HOROVOD_CYCLE_TIME": ""},
             also={"rank_waiting": WAITING}),
    Scenario("stall", "every rank stalls 60 ms per step loading data", "compute_bound",
             "outside", [*BASE, "--stall-ms", "60"], also={"rank_waiting": WAITING}),
    Scenario("cliff", "Open MPI allreduce forced to a slow algorithm from 128 KiB to 512 KiB",
             "latency_cliffs", "twin",
             ["--model", "heads", "--steps", "30", "--batch", "16"],
             env={"HOROVOD_FUSION_THRESHOLD": "0"}, rules=True, confirm=True,
             twin_env={}, also={"rank_waiting": WAITING,
                                "transfer_bound": "the cliff's slow transfers",
                                # the job runs unfused on purpose: fused, its ten
                                # gradients of 16 KiB-1 MiB (2.5 MiB a step, five of
                                # them in the slowed range) ride in about two calls
                                # of about 1 MiB a step, above the slowed range
                                "fusion": "fusion would lift the messages out of the "
                                          "slowed sizes"}),
    Scenario("cliff-twin", "the cliff scenario's job without the rules file", None, "none",
             ["--model", "heads", "--steps", "30", "--batch", "16"],
             env={"HOROVOD_FUSION_THRESHOLD": "0"}, confirm=True,
             also={"rank_waiting": WAITING, "compute_bound": COMPUTE_BOUND,
                   "transfer_bound": "one unfused call per tensor",
                   # fusion off, as in fusion-off: ten calls a step where fused
                   # would be about two (the what-if's own setting: 10.0 calls
                   # predicted, 10.0 made); the eight calls' latency is its claim
                   "fusion": "the job runs unfused on purpose: fusing cuts its calls"}),
]
BY_NAME = {s.name: s for s in SCENARIOS}
