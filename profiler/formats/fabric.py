"""The interconnect a job used, from what each rank's MPI library said (MPI_T) and
the TCP connections each rank held (raw/rank-R.mpit.json, written by
hooks/mpit.c before MPI_Finalize), as trace metadata.

Per rank (``ranks[i]["interconnect"]`` in trace.json, :func:`rank_doc`): the PML,
BTLs and MTLs still open after MPI_Init (Open MPI closes the components it did
not select, and their MPI_T control variables become invalid), the TCP BTL's
interfaces, the requested selections (cvars ``pml``, ``btl``,
``MPIR_CVAR_CH4_NETMOD`` ...), the names of the performance variables, and
the established TCP connections with their local interface and its kind
(veth, physical, virtual: read from /sys/class/net by the rank itself).

Per host pair (``interconnect`` in trace.json, :func:`job_doc`): the transport
between two hosts and how it is known:

- ``observed``: TCP connections from ranks on one host to the other host's
  addresses were open at MPI_Finalize (Open MPI's TCP BTL connects on the
  first message to a peer, so they carried the job's traffic);
- ``inferred``: from the components open after MPI_Init and Open MPI's
  selection rule (for peers on the same host the shared-memory BTL, vader,
  outranks tcp by exclusivity; a host pair with no connection seen but tcp
  open is ``tcp`` inferred);
- ``launcher``: no MPI_T document (not Open MPI, an old library): the
  launcher's settings (OMPI_MCA_btl in the recorded environment), labelled so.

MPI_T holds no per-BTL byte counts in Open MPI 4.1 (its 46 pvars: ob1 queue
lengths, psm2 counters, osc retries) and no pvars at all in MPICH 4.0, so
bytes per transport are not known; this module says which transport, not how
much.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from profiler.layout import mpit_path

# Open MPI components -> the short transport name used in the one-line summary
SHM_BTLS = ("vader", "sm", "smcuda")
NET_BTLS = ("tcp", "openib", "uct", "ofi", "usnic", "portals4", "ugni")


def read_mpit(raw_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """raw/rank-R.mpit.json as the library wrote it, or None."""
    try:
        doc = orjson.loads(mpit_path(raw_path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def interface_kind(name: str, sys_net: str | os.PathLike[str] = "/sys/class/net") -> str:
    """loopback, physical (has a device), veth (a virtual link with a peer:
    iflink differs from ifindex), virtual, or '' (not found).  Meaningful only in
    the rank's own network namespace."""
    if not name:
        return ""
    base = Path(sys_net) / name.split(":", 1)[0]
    if not base.exists():
        return ""
    if name.startswith("lo"):
        return "loopback"
    if (base / "device").exists():
        return "physical"
    try:
        iflink = (base / "iflink").read_text().strip()
        ifindex = (base / "ifindex").read_text().strip()
    except OSError:
        return "virtual"
    return "veth" if iflink != ifindex else "virtual"


def interface_names(doc: Mapping[str, Any]) -> list[str]:
    """The network interfaces a rank's interconnect sidecar names."""
    names = {str(a.get("interface", "")) for a in doc.get("addresses", [])}
    names |= {str(i) for i in (doc.get("mpit") or {}).get("tcp_interfaces", [])}
    return sorted(n for n in names if n)


def rank_doc(raw_path: str | os.PathLike[str], *,
             kinds: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The rank's ``interconnect`` entry: the sidecar, with the kind of each
    interface when the rank told them at its exit (kinds: interface_kind of
    each of interface_names, read in the rank's own network namespace)."""
    doc = read_mpit(raw_path)
    if doc is None:
        return None
    if kinds is not None:
        doc["interface_kinds"] = {n: kinds[n] for n in interface_names(doc) if n in kinds}
    return doc


def _components(doc: Mapping[str, Any], fw: str) -> list[str]:
    comps = (doc.get("mpit") or {}).get("open_components") or []
    return sorted(str(c).split("/", 1)[1] for c in comps if str(c).startswith(fw + "/"))


def job_doc(ranks: Sequence[Mapping[str, Any]], env: Mapping[str, Any] | None = None
            ) -> dict[str, Any]:
    """The job's interconnect per host pair.  ranks: dicts with rank, host and
    interconnect (the rank_doc, or None).  Rank files are input: a document of
    the wrong shape gives a job document that says so, never an exception."""
    try:
        return _job_doc(ranks, env)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        return {"source": "unreadable", "library": "", "pml": [], "btl": [], "pairs": [],
                "note": f"the ranks' interconnect documents are malformed ({type(exc).__name__})"}


def _job_doc(ranks: Sequence[Mapping[str, Any]], env: Mapping[str, Any] | None
             ) -> dict[str, Any]:
    docs = {int(r["rank"]): r.get("interconnect") for r in ranks}
    host_of = {int(r["rank"]): str(r.get("host", "")) for r in ranks}
    hosts = sorted(set(host_of.values()))
    have = {k: v for k, v in docs.items() if isinstance(v, dict) and v.get("mpit")}
    if not have:
        btl = str((env or {}).get("OMPI_MCA_btl", ""))
        return {"source": "launcher", "library": "", "pml": [], "btl": [],
                "pairs": [], "note": ("no MPI_T document from any rank; the launcher's "
                                      f"setting: btl={btl or 'default'}")}
    ip_host: dict[str, str] = {}
    for rk, d in have.items():
        for a in d.get("addresses", []):
            ip = str(a.get("ip", ""))
            if ip and not ip.startswith("127."):
                ip_host[ip] = host_of[rk]
    btls = sorted({b for d in have.values() for b in _components(d, "btl")})
    pmls = sorted({p for d in have.values() for p in _components(d, "pml")})
    # MTLs carry data only under the cm PML; ob1 leaves the framework open unused
    mtls = sorted({m for d in have.values() for m in _components(d, "mtl")}
                  if "cm" in pmls else ())
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    seen: set[tuple[tuple[str, int], ...]] = set()  # a connection shows at both ends
    for rk, d in have.items():
        me = host_of[rk]
        kinds = d.get("interface_kinds") or {}
        for c in d.get("tcp_connections", []):
            other = ip_host.get(str(c.get("remote", "")))
            if other is None or other == me:
                continue  # the launcher's own connections, loopback, unknown peers
            ends = tuple(sorted([(str(c.get("local", "")), int(c.get("local_port") or 0)),
                                 (str(c.get("remote", "")), int(c.get("remote_port") or 0))]))
            key = (min(me, other), max(me, other))
            p = pairs.setdefault(key, {"hosts": list(key), "transport": "tcp",
                                       "how": "observed", "connections": 0,
                                       "interfaces": []})
            if ends not in seen:
                seen.add(ends)
                p["connections"] += 1
            ifn = str(c.get("interface", ""))
            label = f"{ifn} ({kinds[ifn]})" if kinds.get(ifn) else ifn
            if ifn and label not in p["interfaces"]:
                p["interfaces"].append(label)
    shm = next((b for b in btls if b in SHM_BTLS), None)
    net = next((b for b in btls if b in NET_BTLS), None)
    mpit0 = next(iter(have.values()))
    mpich = str(mpit0.get("library", "")).startswith("MPICH")
    sel0 = (mpit0.get("mpit") or {}).get("selected", {}) or {}
    if mpich and not net:
        dev = str(mpit0.get("device", ""))  # "ch4:ucx": the netmod it was built with
        net = f"{dev.split(':', 1)[0] or 'ch4'} netmod " + (
            sel0.get("MPIR_CVAR_CH4_NETMOD") or (dev.split(":", 1)[1] if ":" in dev
                                                 else "default"))
    if mpich and not shm:
        shm = str(sel0.get("MPIR_CVAR_CH4_SHM") or "posix")
    for i, a in enumerate(hosts):
        for b in hosts[i:]:
            if (a, b) in pairs:
                continue
            if a == b:
                ranks_here = sum(1 for h in host_of.values() if h == a)
                if ranks_here < 2:
                    continue
                t = f"sm/{shm}" if shm else (net or (f"pml {pmls[0]}" if pmls else "unknown"))
                pairs[(a, b)] = {"hosts": [a, b], "transport": t, "how": "inferred",
                                 "connections": 0, "interfaces": []}
            else:
                t = net or (f"mtl {mtls[0]}" if mtls else f"pml {pmls[0]}" if pmls else "unknown")
                pairs[(a, b)] = {"hosts": [a, b], "transport": t, "how": "inferred",
                                 "connections": 0, "interfaces": []}
    return {
        "source": "MPI_T",
        "library": str(mpit0.get("library", "")),
        "pml": pmls, "btl": btls, "mtl": mtls,
        "selected": (mpit0.get("mpit") or {}).get("selected", {}),
        "pvars": int((mpit0.get("mpit") or {}).get("pvars", 0)),
        "ranks_reporting": len(have), "ranks": len(docs),
        "pairs": [pairs[k] for k in sorted(pairs)],
    }


# ---------------------------------------------------------------------------
# per peer: what the kernel measured on the job's own connections
# ---------------------------------------------------------------------------


@dataclass
class Edge:
    """One direction between two hosts (``src`` sends to ``dst``), pooled over
    the connections of every rank on ``src`` to addresses of ``dst``, as the
    sending ranks' kernels measured them (hooks/mpit.c):

    * ``rate``: the delivery-rate samples the sampler kept (new data ACKed,
      not limited by the application), as a histogram of bytes/s
      (``bins``: {bin: count}, bin b = [2^(log2_min + b/per_octave), ...));
    * ``throughput``: the sampler's active intervals (at least
      ``active_bytes_min`` sent in one read interval): bytes over the
      interval, a histogram likewise;
    * ``bytes``: bytes the receivers acknowledged over the connections' life;
      ``busy_s``: the kernel's time with data in flight (tcpi_busy_time);
      ``retrans``: segments retransmitted; ``rtt_ms``: the largest smoothed
      RTT at the end; ``ranks``: the sending ranks."""

    src: str
    dst: str
    ranks: list[int] = field(default_factory=list)
    bytes: int = 0
    busy_s: float = 0.0
    retrans: int = 0
    rtt_ms: float = 0.0
    rate: dict[int, int] = field(default_factory=dict)
    throughput: dict[int, int] = field(default_factory=dict)
    log2_min: int = 10
    per_octave: int = 4

    @property
    def samples(self) -> int:
        return int(sum(self.rate.values()))

    def rate_quantile(self, q: float) -> float | None:
        """The q-quantile of the delivery-rate samples, bytes/s (the bin's
        geometric middle), None without samples."""
        return _hist_quantile(self.rate, q, self.log2_min, self.per_octave)

    def throughput_quantile(self, q: float) -> float | None:
        return _hist_quantile(self.throughput, q, self.log2_min, self.per_octave)


def _hist_quantile(h: Mapping[int, int], q: float, log2_min: int, per_octave: int
                   ) -> float | None:
    tot = sum(h.values())
    if tot <= 0:
        return None
    acc = 0
    for b in sorted(h):
        acc += h[b]
        if acc >= q * tot:
            return float(2.0 ** (log2_min + (b + 0.5) / per_octave))
    return None


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _hist(v: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for pair in v if isinstance(v, list) else []:
        if (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(x, int) and x >= 0 for x in pair)):
            out[pair[0]] = out.get(pair[0], 0) + pair[1]
    return out


def peer_edges(ranks: Sequence[Mapping[str, Any]]) -> list[Edge]:
    """Every direction between two of the job's hosts over which a rank held
    a TCP connection, with the kernel's figures (Edge).  ranks: {"rank",
    "host", "interconnect"} as job_doc takes them.  A peer address no rank
    of the job owns (a launcher's, a file server's) is not a host of the
    job and is left out.  Malformed documents give no edges."""
    try:
        return _peer_edges(ranks)
    except (AttributeError, TypeError, ValueError, KeyError):
        return []


def _peer_edges(ranks: Sequence[Mapping[str, Any]]) -> list[Edge]:
    docs = {int(r["rank"]): r.get("interconnect") for r in ranks}
    host_of = {int(r["rank"]): str(r.get("host", "")) for r in ranks}
    ip_host: dict[str, str] = {}
    for rk, d in docs.items():
        for a in (d or {}).get("addresses", []) if isinstance(d, dict) else []:
            ip = str(a.get("ip", ""))
            if ip and not ip.startswith("127."):
                ip_host[ip] = host_of[rk]
    edges: dict[tuple[str, str], Edge] = {}
    for rk, d in sorted(docs.items()):
        if not isinstance(d, dict):
            continue
        got = d.get("net_sampler")
        sampler: dict[str, Any] = got if isinstance(got, dict) else {}
        log2_min = int(sampler.get("bin_log2_min") or 10)
        per_octave = int(sampler.get("bins_per_octave") or 4)
        me = host_of[rk]
        for c in d.get("tcp_connections", []):
            other = ip_host.get(str(c.get("remote", "")))
            if other is None or other == me:
                continue
            e = edges.setdefault((me, other), Edge(me, other, log2_min=log2_min,
                                                   per_octave=per_octave))
            if rk not in e.ranks:
                e.ranks.append(rk)
            t = c.get("tcp_info") if isinstance(c.get("tcp_info"), dict) else {}
            e.bytes += int(_num(t.get("bytes_acked")))
            e.busy_s += _num(t.get("busy_us")) / 1e6
            e.retrans += int(_num(t.get("total_retrans")))
            e.rtt_ms = max(e.rtt_ms, _num(t.get("rtt_us")) / 1e3)
            s = c.get("sampled") if isinstance(c.get("sampled"), dict) else {}
            for k, v in _hist(s.get("rate_hist")).items():
                e.rate[k] = e.rate.get(k, 0) + v
            for k, v in _hist(s.get("out_hist")).items():
                e.throughput[k] = e.throughput.get(k, 0) + v
    return [edges[k] for k in sorted(edges)]


def link_active_ms(doc: Mapping[str, Any] | None) -> dict[int, float]:
    """Per step (the step records' numbers), the ms a rank's connections to
    other hosts carried bulk data in it, as its sampler measured (hooks/mpit.c:
    the running total at each step record, less the one before; a gap in the
    marks spreads its time evenly over the steps it covers).  {} without a
    sampler."""
    s = (doc or {}).get("net_sampler") if isinstance(doc, Mapping) else None
    marks = s.get("steps") if isinstance(s, dict) else None
    out: dict[int, float] = {}
    if not isinstance(marks, list):
        return out
    prev: tuple[int, float] | None = None
    for m in marks:
        if not (isinstance(m, list) and len(m) >= 3 and isinstance(m[0], int)
                and isinstance(m[2], int)):
            continue
        seq, active = int(m[0]), float(m[2]) / 1e6
        if prev is not None and seq > prev[0]:
            gap = seq - prev[0]
            for k in range(prev[0] + 1, seq + 1):
                out[k] = (active - prev[1]) / gap
        prev = (seq, active)
    return out


def nic_bytes(doc: Mapping[str, Any] | None) -> dict[str, dict[str, int]]:
    """Per network interface of the rank's host (InfiniBand ports as
    "dev/port"): bytes received and sent between the raw file's open and
    MPI_Finalize ({"rx", "tx"}; every process's traffic on that host), and its
    speed in Mb/s where the kernel states one (-1 otherwise)."""
    n = (doc or {}).get("nics") if isinstance(doc, Mapping) else None
    if not isinstance(n, dict):
        return {}
    a = {str(x.get("name")): x for x in n.get("start") or [] if isinstance(x, dict)}
    out: dict[str, dict[str, int]] = {}
    for x in n.get("end") or []:
        if not isinstance(x, dict) or str(x.get("name")) not in a:
            continue
        s = a[str(x["name"])]
        out[str(x["name"])] = {
            "rx": max(int(_num(x.get("rx_bytes")) - _num(s.get("rx_bytes"))), 0),
            "tx": max(int(_num(x.get("tx_bytes")) - _num(s.get("tx_bytes"))), 0),
            "speed_mbps": int(_num(x.get("speed_mbps")) or -1)}
    return out
