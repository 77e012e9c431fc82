"""A small cluster on one machine: simulated hosts for multi-host runs.

    python -m profiler.bench.simcluster up --hosts 3 --offsets 0,777,2501 --rate 1gbit
    python -m profiler.bench.simcluster run [--name NAME] [--np 6] -- python job.py
    python -m profiler.bench.simcluster status
    python -m profiler.bench.simcluster down [--name NAME | --all]

(`scripts/simcluster.py` is the same command.)  Each host is a network
namespace (`ip netns`) with one veth link (``eth0``, 10.77.0.(10+i)/24) to a
bridge that lives in a namespace of its own (the "switch"), so nothing is
added to the machine's own network and every cluster has its own subnet.
`/etc/netns/<ns>/hosts` names the hosts.  Processes on a host run in their
own UTS namespace (`unshare --uts`: the host's name) and time namespace
(`unshare --time --monotonic S --boottime S`: CLOCK_MONOTONIC shifted by the
host's offset S seconds; rdtsc is not shifted).  A rate (tbf qdisc, both ends
of every link) emulates a slower interconnect; netem (added latency) is not in
this kernel.

Open MPI spans the hosts: mpirun runs on the first host with
`--mca plm_rsh_agent <agent>` (a script that runs the launcher's command on a
host through `ip netns exec <ns> unshare --uts --time ...`), `--mca btl
tcp,self` and the TCP interfaces restricted to the cluster's subnet.

Every cluster has a unique name (``hvsim-<token>``), a state file under
/run/hvsim, and an owner process: a cluster whose owner died (a killed test)
is removed by the next start-up of any cluster.  Clusters made by `up` have no
owner and last until `down`.  Needs root, `ip`, `unshare` (and `tc` for a
rate); `available()` says why not.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_DIR = Path(os.environ.get("HVSIM_STATE_DIR", "/run/hvsim"))
NETNS_ETC = Path("/etc/netns")
PREFIX = "hvsim-"
SUBNET = "10.77.0.0/24"
MAX_HOSTS = 16

# Environment variables a rank needs from the launching environment (the
# remote daemons inherit the launcher's environment here, but the list is
# passed with -x as on a real cluster).
FORWARD_PREFIXES = ("HOROVOD_", "NCCL_", "PYTHON", "OMP_", "MKL_")
# TMPDIR is each host's own (its folder in the cluster's state, gone with
# it): Open MPI's session folders of a killed job go with the cluster.
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "VIRTUAL_ENV")
# Settings for one machine that must not reach a cluster run.
_DROP_ENV = ("OMPI_MCA_btl", "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include",
             "OMPI_MCA_btl_tcp_if_exclude", "OMPI_MCA_oob_tcp_if_exclude", "OMPI_MCA_pml")


class SimClusterError(RuntimeError):
    pass


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SimClusterError(f"{' '.join(shlex.quote(c) for c in cmd)}: "
                              f"{(p.stderr or p.stdout).strip()}")
    return p


def available(rate: bool = False) -> tuple[bool, str]:
    """(True, "") when simulated hosts can be made here, else (False, why)."""
    if sys.platform != "linux":
        return False, "simulated hosts need Linux namespaces"
    if os.geteuid() != 0:
        return False, "simulated hosts need root (network, UTS and time namespaces)"
    for tool in ("ip", "unshare") + (("tc",) if rate else ()):
        if shutil.which(tool) is None:
            return False, f"simulated hosts need `{tool}` (not found)"
    if not Path("/proc/self/ns/time").exists():
        return False, "this kernel has no time namespaces (/proc/self/ns/time)"
    probe = f"{PREFIX}probe-{os.getpid()}-{secrets.token_hex(2)}"
    p = _sh("ip", "netns", "add", probe, check=False)
    if p.returncode != 0:
        return False, f"ip netns add failed: {p.stderr.strip()}"
    _sh("ip", "netns", "del", probe, check=False)
    p = _sh("unshare", "--uts", "--time", "--monotonic", "1", "--boottime", "1", "true",
            check=False)
    if p.returncode != 0:
        return False, f"unshare --uts --time failed: {p.stderr.strip()}"
    return True, ""


def _proc_start(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class Host:
    name: str  # hostname inside the host (UTS) and in /etc/hosts
    ns: str  # network namespace
    ip: str
    offset_s: int  # CLOCK_MONOTONIC / CLOCK_BOOTTIME shift, seconds


@dataclass
class ClusterState:
    name: str
    switch_ns: str
    hosts: list[Host]
    rate: str | None
    slots: int
    owner_pid: int | None = None
    owner_start: int | None = None
    created: float = field(default_factory=time.time)
    #: a path every host sees as a folder of its own (a mount namespace per
    #: host process tree, host_private(h) bound over it): hosts that share no
    #: disk there, as node-local scratch or Kubernetes pods
    private: str | None = None

    @property
    def dir(self) -> Path:
        return STATE_DIR / self.name

    @property
    def agent(self) -> Path:
        return self.dir / "agent.sh"

    def namespaces(self) -> list[str]:
        return [h.ns for h in self.hosts] + [self.switch_ns]

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = STATE_DIR / f".{self.name}.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(STATE_DIR / f"{self.name}.json")

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        d = json.loads(path.read_text())
        d["hosts"] = [Host(**h) for h in d["hosts"]]
        return cls(**d)

    def owner_alive(self) -> bool:
        if self.owner_pid is None:
            return True  # made by `up`: lasts until `down`
        return _proc_start(self.owner_pid) == self.owner_start


# ---------------------------------------------------------------------------
# teardown (also of stale clusters)


def _kill_ns_processes(ns: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = _sh("ip", "netns", "pids", ns, check=False)
        pids = [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if not _sh("ip", "netns", "pids", ns, check=False).stdout.split():
                return
            time.sleep(0.05)


def _remove_namespaces(names: Sequence[str]) -> None:
    for ns in names:
        _kill_ns_processes(ns)
    for ns in names:
        # deleting a namespace removes its veth ends (and so the peers) and bridge
        _sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def _existing_namespaces() -> list[str]:
    p = _sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def teardown(state: ClusterState) -> None:
    _remove_namespaces(state.namespaces())
    shutil.rmtree(state.dir, ignore_errors=True)
    try:
        (STATE_DIR / f"{state.name}.json").unlink()
    except FileNotFoundError:
        pass


def clusters() -> list[ClusterState]:
    out = []
    for p in sorted(STATE_DIR.glob(f"{PREFIX}*.json")):
        try:
            out.append(ClusterState.load(p))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return out


@contextlib.contextmanager
def _locked() -> Any:
    """One sweep or bring-up at a time on this machine (parallel test workers):
    a sweep must not take a cluster being made for a leftover."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sweep_stale() -> list[str]:
    """Remove clusters whose owner died, and namespaces, /etc/netns entries and
    state folders that belong to no cluster (a run killed half-way).  Returns
    what was removed."""
    with _locked():
        return _sweep_stale()


def _probe_gone(ns: str) -> bool:
    """False for the probe namespace of a live process (available())."""
    if "-probe-" not in ns:
        return True
    pid = ns.split("-probe-", 1)[1].split("-", 1)[0]
    return not (pid.isdigit() and Path(f"/proc/{pid}").exists())


def _sweep_stale() -> list[str]:
    removed: list[str] = []
    live: set[str] = set()
    for st in clusters():
        if st.owner_alive():
            live.update(st.namespaces())
            live.add(st.name)
        else:
            teardown(st)
            removed.append(st.name)
    # state is written before any namespace is made, so a namespace of ours
    # without live state is left over
    orphans = [ns for ns in _existing_namespaces()
               if ns.startswith(PREFIX) and ns not in live and _probe_gone(ns)]
    _remove_namespaces(orphans)
    removed += orphans
    if NETNS_ETC.is_dir():
        for d in NETNS_ETC.glob(f"{PREFIX}*"):
            if d.name not in live and d.name not in _existing_namespaces():
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
    if STATE_DIR.is_dir():
        for d in STATE_DIR.glob(f"{PREFIX}*"):
            if d.is_dir() and d.name not in live:
                shutil.rmtree(d, ignore_errors=True)
    return removed


# ---------------------------------------------------------------------------
# bring-up


def _tbf(ns: str, dev: str, rate: str) -> None:
    bits = _rate_bits(rate)
    # burst: at least 2 ms of traffic at the rate (and a few jumbo frames),
    # so the kernel's timer granularity does not cap the rate below `rate`
    burst = max(64 * 1024, int(bits / 8 * 0.002))
    _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
        "rate", rate, "burst", str(burst), "latency", "100ms")


def _rate_bits(rate: str) -> float:
    r = rate.strip().lower()
    units = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for u, f in units.items():
        if r.endswith(u):
            return float(r[: -len(u)]) * f
    raise SimClusterError(f"rate {rate!r}: use e.g. 1gbit, 10gbit, 500mbit")


AGENT = """#!/bin/sh
# Open MPI's plm_rsh_agent for simulated cluster {name}: `agent.sh HOST CMD...`
# runs CMD (a shell command, as ssh would) on HOST: its network namespace,
# its hostname (UTS namespace), its clock offset (time namespace), its own
# TMPDIR and, with a private folder, its own mount namespace with the host's
# folder bound over that path.
host=$1; shift
case "$host" in
{cases}
  *) echo "simcluster agent: unknown host $host" >&2; exit 255 ;;
esac
mkdir -p "$tmp"
exec ip netns exec "$ns" env TMPDIR="$tmp" HVSIM_OWN="$own" unshare --uts --time \\
    --monotonic "$off" --boottime "$off" {mount}/bin/sh \\
    -c '{bind}hostname "$0" && eval "$1"' "$host" "$*"
"""

# horovodrun's remote shell for the same cluster: `ssh [-o OPT]... HOST [-p
# PORT] [-i KEY] [-o OPT] CMD` becomes `agent.sh HOST CMD` (horovodrun --gloo
# starts its workers on other hosts with ssh).
SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
while [ $# -gt 0 ]; do  # horovodrun puts -p, -i and -o after the host
  case "$1" in
    -o|-p|-i) shift 2 ;;
    *) break ;;
  esac
done
exec {agent} "$host" "$*"
"""


def _write_agent(st: ClusterState) -> None:
    cases = "\n".join(
        f"  {h.name}|{h.ip}) ns={h.ns}; off={h.offset_s}; "
        f"tmp={shlex.quote(str(host_tmp(st, h)))}; "
        f"own={shlex.quote(str(host_private(st, h)))} ;;" for h in st.hosts)
    st.dir.mkdir(parents=True, exist_ok=True)
    mount, bind = _private_mount(st, '"$HVSIM_OWN"')
    st.agent.write_text(AGENT.format(name=st.name, cases=cases, mount=mount, bind=bind))
    st.agent.chmod(0o755)
    shim = st.dir / "bin" / "ssh"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(SSH.format(agent=shlex.quote(str(st.agent))))
    shim.chmod(0o755)
    (st.dir / "hostfile").write_text(
        "".join(f"{h.name} slots={st.slots}\n" for h in st.hosts))


def create(hosts: int = 2, offsets: Sequence[int] | None = None, rate: str | None = None,
           slots: int = 2, owner: bool = True, names: Sequence[str] | None = None,
           host_rates: Mapping[int, str] | None = None,
           private: str | os.PathLike[str] | None = None) -> ClusterState:
    """Make a cluster (stale ones are swept first).  offsets: seconds per host
    (CLOCK_MONOTONIC shift, >= 0), default 0 for all; host_rates: a rate for
    some hosts' links (host index -> rate) instead of `rate`: one slow link;
    private: an absolute path each host sees as a folder of its own
    (host_private), as hosts that share no disk there."""
    if private is not None and not os.path.isabs(private):
        raise SimClusterError(f"private path {private}: must be absolute")
    if not 1 <= hosts <= MAX_HOSTS:
        raise SimClusterError(f"--hosts {hosts}: 1 to {MAX_HOSTS}")
    offs = list(offsets) if offsets is not None else [0] * hosts
    if len(offs) != hosts:
        raise SimClusterError(f"{len(offs)} offsets for {hosts} hosts")
    if any(o < 0 for o in offs):
        raise SimClusterError("clock offsets must be >= 0 seconds (the clock cannot go "
                              "below zero in a time namespace)")
    for r in [rate, *(host_rates or {}).values()]:
        if r:
            _rate_bits(r)
    bad = [i for i in (host_rates or {}) if not 0 <= i < hosts]
    if bad:
        raise SimClusterError(f"host_rates: no host {bad[0]} in a cluster of {hosts}")
    ok, why = available(rate=bool(rate or host_rates))
    if not ok:
        raise SimClusterError(why)
    with _locked():
        _sweep_stale()
        return _create(hosts, offs, rate, slots, owner, names, host_rates,
                       str(private) if private is not None else None)


def _create(hosts: int, offs: list[int], rate: str | None, slots: int, owner: bool,
            names: Sequence[str] | None,
            host_rates: Mapping[int, str] | None = None,
            private: str | None = None) -> ClusterState:
    token = secrets.token_hex(3)
    name = f"{PREFIX}{token}"
    hnames = list(names) if names else [f"h{i}" for i in range(hosts)]
    st = ClusterState(
        name=name, switch_ns=f"{name}-sw",
        hosts=[Host(hnames[i], f"{name}-{hnames[i]}", f"10.77.0.{10 + i}", int(offs[i]))
               for i in range(hosts)],
        rate=rate, slots=slots,
        owner_pid=os.getpid() if owner else None,
        owner_start=_proc_start(os.getpid()) if owner else None, private=private)
    st.save()  # first: a kill from here on leaves state the sweep can find
    try:
        _sh("ip", "netns", "add", st.switch_ns)
        sw = ["ip", "-n", st.switch_ns]
        _sh(*sw, "link", "add", "br0", "type", "bridge")
        _sh(*sw, "link", "set", "br0", "up")
        _sh(*sw, "link", "set", "lo", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.ip} {h.name}\n" for h in st.hosts)
        for i, h in enumerate(st.hosts):
            _sh("ip", "netns", "add", h.ns)
            port = f"p{i}"
            _sh("ip", "link", "add", "name", "eth0", "netns", h.ns, "type", "veth",
                "peer", "name", port, "netns", st.switch_ns)
            _sh(*sw, "link", "set", port, "master", "br0")
            _sh(*sw, "link", "set", port, "up")
            hn = ["ip", "-n", h.ns]
            _sh(*hn, "addr", "add", f"{h.ip}/24", "dev", "eth0")
            _sh(*hn, "link", "set", "eth0", "up")
            _sh(*hn, "link", "set", "lo", "up")
            link_rate = (host_rates or {}).get(i) or rate
            if link_rate:
                _tbf(h.ns, "eth0", link_rate)
                _tbf(st.switch_ns, port, link_rate)
            etc = NETNS_ETC / h.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
        _write_agent(st)
    except BaseException:
        teardown(st)
        raise
    return st


# ---------------------------------------------------------------------------
# running


def host_tmp(st: ClusterState, h: Host) -> Path:
    """A host's TMPDIR: in the cluster's state folder, removed with it."""
    return st.dir / "tmp" / h.name


def host_private(st: ClusterState, h: Host | int) -> Path:
    """What a host sees at the cluster's private path: a folder of its own in
    the cluster's state folder (kept until the cluster is removed)."""
    host = st.hosts[h] if isinstance(h, int) else h
    return st.dir / "private" / host.name


def _private_mount(st: ClusterState, own: str) -> tuple[str, str]:
    """The unshare options and the shell command (before the host's own) that
    bind a host's private folder over the private path; empty without one."""
    if not st.private:
        return "", ""
    return ("--mount --propagation private ",
            f"mkdir -p {own} {shlex.quote(st.private)} && "
            f"mount --bind {own} {shlex.quote(st.private)} && ")


def host_cmd(st: ClusterState, host: Host | int, argv: Sequence[str]) -> list[str]:
    """argv run on a host (its namespace, hostname, clock and TMPDIR)."""
    h = st.hosts[host] if isinstance(host, int) else host
    off = str(h.offset_s)
    tmp = host_tmp(st, h)
    tmp.mkdir(parents=True, exist_ok=True)
    mount, bind = _private_mount(st, shlex.quote(str(host_private(st, h))))
    return ["ip", "netns", "exec", h.ns, "env", f"TMPDIR={tmp}", "unshare", "--uts", "--time",
            "--monotonic", off, "--boottime", off, *mount.split(), "/bin/sh", "-c",
            bind + 'hostname "$0" && exec "$@"', h.name, *argv]


def mpirun_cmd(st: ClusterState, np: int, argv: Sequence[str], *,
               env_names: Sequence[str] = (), per_host: int | None = None,
               btl: str = "tcp,self", mpirun: str = "mpirun",
               extra: Sequence[str] = ()) -> list[str]:
    """The command line (run it anywhere: it enters the first host) of
    `mpirun -n np argv` across the cluster, ranks filling hosts in order,
    `per_host` (default: the cluster's slots) per host."""
    k = per_host or st.slots
    hosts = ",".join(f"{h.name}:{k}" for h in st.hosts)
    mp = [shutil.which(mpirun) or mpirun, "-n", str(np), "-H", hosts,
          "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
          "--mca", "plm_rsh_agent", str(st.agent),
          "--mca", "plm_rsh_no_tree_spawn", "1",
          "--mca", "btl", btl, "--mca", "pml", "ob1",
          "--mca", "btl_tcp_if_include", SUBNET, "--mca", "oob_tcp_if_include", SUBNET]
    for n in env_names:
        mp += ["-x", n]
    return host_cmd(st, 0, [*mp, *extra, *argv])


def forwarded_env_names(env: Mapping[str, str]) -> list[str]:
    return sorted(n for n in env if n in FORWARD_NAMES or n.startswith(FORWARD_PREFIXES))


def run_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    e = dict(os.environ if env is None else env)
    for n in _DROP_ENV:
        e.pop(n, None)
    e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return e


class SimCluster:
    """Context manager: a cluster for the duration of a `with` block.

        with SimCluster(hosts=3, offsets=[0, 777, 2501], rate="1gbit") as c:
            proc = c.mpirun(6, [sys.executable, "job.py"], env={...})
    """

    def __init__(self, hosts: int = 2, offsets: Sequence[int] | None = None,
                 rate: str | None = None, slots: int = 2,
                 host_rates: Mapping[int, str] | None = None,
                 private: str | os.PathLike[str] | None = None) -> None:
        self.args = dict(hosts=hosts, offsets=offsets, rate=rate, slots=slots,
                         host_rates=host_rates, private=private)
        self.state: ClusterState | None = None

    def __enter__(self) -> SimCluster:
        self.state = create(owner=True, **self.args)  # type: ignore[arg-type]
        atexit.register(self.close)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.state is not None:
            st, self.state = self.state, None
            teardown(st)

    @property
    def st(self) -> ClusterState:
        if self.state is None:
            raise SimClusterError("the cluster is not up")
        return self.state

    @property
    def hosts(self) -> list[Host]:
        return self.st.hosts

    def host_of_rank(self, rank: int, per_host: int | None = None) -> Host:
        return self.st.hosts[rank // (per_host or self.st.slots)]

    def mpirun(self, np: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               timeout: float = 120, per_host: int | None = None, cwd: str | Path | None = None,
               btl: str = "tcp,self", extra: Sequence[str] = (),
               ) -> subprocess.CompletedProcess[str]:
        return run(self.st, np, argv, env=env, timeout=timeout, per_host=per_host, cwd=cwd,
                   btl=btl, extra=extra)

    def horovodrun(self, np: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout: float = 180, per_host: int | None = None,
                   cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
        """`horovodrun --gloo -np np argv` from the first host across the
        cluster (its workers reach the other hosts through the ssh shim)."""
        return horovodrun(self.st, np, argv, env=env, timeout=timeout, per_host=per_host,
                          cwd=cwd)

    def private_dir(self, host: int) -> Path:
        """What host `host` sees at the private path."""
        return host_private(self.st, host)

    def exec_on(self, host: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen[bytes]:
        """Start argv on a host (returns the process; teardown kills it if still running)."""
        return subprocess.Popen(host_cmd(self.st, host, argv), **kw)


def horovodrun(st: ClusterState, np: int, argv: Sequence[str], *,
               env: Mapping[str, str] | None = None, timeout: float = 180,
               per_host: int | None = None, cwd: str | Path | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """horovodrun --gloo on the first host, ranks filling hosts in order, over
    eth0 (no interface discovery); remote workers start through the ssh shim,
    which carries the environment along as horovodrun's own ssh would with
    its exported variables."""
    k = per_host or st.slots
    hosts = ",".join(f"{h.name}:{k}" for h in st.hosts)
    full = run_env(None)
    full.update(env or {})
    full["PATH"] = f"{st.dir / 'bin'}{os.pathsep}{full.get('PATH', '')}"
    exe = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or "horovodrun"
    cmd = host_cmd(st, 0, [exe, "--gloo", "-np", str(np), "-H", hosts,
                           "--network-interfaces", "eth0", *argv])
    return _communicate(st, cmd, full, cwd, timeout)


def _communicate(st: ClusterState, cmd: list[str], env: Mapping[str, str],
                 cwd: str | Path | None, timeout: float) -> subprocess.CompletedProcess[str]:
    p = subprocess.Popen(cmd, env=dict(env), cwd=cwd, text=True, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        for h in st.hosts:
            _kill_ns_processes(h.ns)
        out, err = p.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def run(st: ClusterState, np: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        timeout: float = 120, per_host: int | None = None, cwd: str | Path | None = None,
        btl: str = "tcp,self", extra: Sequence[str] = (), capture: bool = True,
        ) -> subprocess.CompletedProcess[str]:
    full = run_env(None)
    full.update(env or {})
    for n in _DROP_ENV:
        full.pop(n, None)
    cmd = mpirun_cmd(st, np, argv, env_names=forwarded_env_names(full), per_host=per_host,
                     btl=btl, extra=extra)
    p = subprocess.Popen(cmd, env=full, cwd=cwd, text=True, start_new_session=True,
                         stdout=subprocess.PIPE if capture else None,
                         stderr=subprocess.PIPE if capture else None)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        for h in st.hosts:
            _kill_ns_processes(h.ns)
        out, err = p.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


# ---------------------------------------------------------------------------
# command line


def _pick(name: str | None) -> ClusterState:
    cs = [c for c in clusters() if name is None or c.name == name]
    if not cs:
        raise SimClusterError(f"no cluster {name}" if name else "no cluster is up (run `up`)")
    if len(cs) > 1:
        raise SimClusterError("several clusters are up; say which with --name: "
                              + ", ".join(c.name for c in cs))
    return cs[0]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="simcluster", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="make a cluster (prints its name)")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--offsets", default=None,
                    help="comma-separated CLOCK_MONOTONIC offsets in seconds, one per host")
    up.add_argument("--rate", default=None, help="per-link rate limit (tbf), e.g. 1gbit")
    up.add_argument("--slots", type=int, default=2, help="ranks per host (default 2)")
    r = sub.add_parser("run", help="mpirun across the cluster: run [opts] -- ARGS...")
    r.add_argument("--name", default=None)
    r.add_argument("--np", type=int, default=None, help="ranks (default hosts x slots)")
    r.add_argument("--per-host", type=int, default=None)
    r.add_argument("--btl", default="tcp,self")
    r.add_argument("--timeout", type=float, default=3600)
    r.add_argument("args", nargs=argparse.REMAINDER)
    e = sub.add_parser("exec", help="run a command on one host: exec HOST -- ARGS...")
    e.add_argument("--name", default=None)
    e.add_argument("host")
    e.add_argument("args", nargs=argparse.REMAINDER)
    d = sub.add_parser("down", help="remove a cluster")
    d.add_argument("--name", default=None)
    d.add_argument("--all", action="store_true", help="every cluster, and stale leftovers")
    sub.add_parser("status", help="list clusters")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "up":
            offs = [int(x) for x in a.offsets.split(",")] if a.offsets else None
            st = create(a.hosts, offs, a.rate, a.slots, owner=False)
            print(st.name)
            for h in st.hosts:
                print(f"  {h.name} {h.ip} ns={h.ns} offset={h.offset_s}s"
                      + (f" rate={st.rate}" if st.rate else ""))
        elif a.cmd == "run":
            args = a.args[1:] if a.args[:1] == ["--"] else a.args
            if not args:
                ap.error("run: give the program after --")
            st = _pick(a.name)
            np_ = a.np or len(st.hosts) * (a.per_host or st.slots)
            p = run(st, np_, args, timeout=a.timeout, per_host=a.per_host, btl=a.btl,
                    capture=False)
            return p.returncode
        elif a.cmd == "exec":
            args = a.args[1:] if a.args[:1] == ["--"] else a.args
            st = _pick(a.name)
            where = next((h for h in st.hosts if h.name == a.host), None)
            if where is None:
                raise SimClusterError(f"no host {a.host} in {st.name}")
            return subprocess.call(host_cmd(st, where, args or ["/bin/sh"]))
        elif a.cmd == "down":
            if a.all:
                for st in clusters():
                    teardown(st)
                sweep_stale()
            else:
                teardown(_pick(a.name))
        elif a.cmd == "status":
            for st in clusters():
                own = (f"owner pid {st.owner_pid}" + ("" if st.owner_alive() else " (dead)")
                       if st.owner_pid else "made by `up`")
                print(f"{st.name}: {len(st.hosts)} hosts, rate {st.rate or 'unlimited'}, {own}")
                for h in st.hosts:
                    print(f"  {h.name} {h.ip} offset={h.offset_s}s")
    except SimClusterError as exc:
        print(f"simcluster: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
