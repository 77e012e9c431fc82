"""Every rank's data at rank 0 when the ranks share no disk.

Rank 0 decides, from what it can see: a rank whose raw file it finds at that
rank's path in its own profile directory, with that rank's identity (pid and
start calibration, from the header), shares its disk and sends nothing.  The
others send their files, and rank 0's exit merge builds the one trace.  Two
transports:

* **MPI jobs** (mpirun, srun, horovodrun over MPI): at MPI_Finalize, over the
  job's own MPI, in the library (hooks/mpi_gather.c): an ordered gather in
  4 MiB chunks (rank 0 holds one chunk at a time).  A rank sends raw/ and
  hang/rank-R.* with raw/rank-R.facts.json, the facts only its process knew
  (written by its Python runtime just before: profiler.formats.facts), and
  converts nothing itself: rank 0's merge converts the copies (their header
  marked closed, self_converts 0).
* **Jobs without MPI** (horovodrun --gloo, elastic Horovod, Horovod on Ray
  and Spark: every launcher that runs Horovod's HTTP rendezvous server and
  gives its address to the workers as HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT):
  over TCP to rank 0's exit merge (`Receiver`).  The exit merge listens on
  an ephemeral port and puts its address (host:port) into the rendezvous
  server's key-value store (scope "hvprof", key: the profile directory's
  name): only that address goes through the rendezvous server, never the
  data.  Every other rank converts its own file at its exit as ever, then
  (`offer`) reads the address, offers its identity and file list, and, when
  asked, sends raw/, hang/ and ranks/rank-R.* in 1 MiB pieces, keeping their
  modification times so that its dataset stays up to date with its raw file.

At rank 0, whichever the transport, each file is written under a temporary
name and renamed when whole, and raw/rank-R.gathered.json says where the
rank's files came from (raw/gather.json: the whole gather's bytes and time);
`job_block` puts that into trace.json's metadata and the merge's line.
HOROVOD_PROFILE_GATHER=off turns both off.  Not covered: jobs with neither
MPI nor a Horovod rendezvous server (torchrun and NCCL only): their ranks'
files stay on their hosts, and the merge names them missing.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from profiler.formats import record as F
from profiler.layout import GATHER_FILE, RAW_DIR, gathered_path, raw_path

CHUNK = 1 << 20
SCOPE = "hvprof"
#: the names a rank may send: its own files in these folders, nothing above them
#: (ranks/: the dataset the rank made at its exit, in a job without MPI)
SUBDIRS = ("raw", "hang", "ranks")
_FIELDS: Any = F.HEADER_DTYPE.fields or {}
_STATE = int(_FIELDS["state"][1])
_SELF_CONVERTS = int(_FIELDS["self_converts"][1])
_IDENTITY = ("pid", "cal0_ticks", "cal0_realtime_ns")


# ---------------------------------------------------------------------------
# what landed: trace.json's "gathered" block
# ---------------------------------------------------------------------------

def job_block(profile_dir: Path, ranks: Iterable[int]) -> dict[str, Any] | None:
    """{"over", "ranks", "hosts", "files", "bytes", "seconds"} of the ranks whose
    files were gathered into this directory, or None when none were."""
    got: list[dict[str, Any]] = []
    for r in sorted(ranks):
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            got.append(orjson.loads(gathered_path(raw_path(profile_dir, r)).read_bytes()))
    if not got:
        return None
    whole: dict[str, Any] = {}
    with contextlib.suppress(OSError, orjson.JSONDecodeError):
        whole = orjson.loads((Path(profile_dir) / RAW_DIR / GATHER_FILE).read_bytes())
    return {"over": str(got[0].get("over", whole.get("over", "?"))),
            "ranks": sorted(int(g["rank"]) for g in got),
            "hosts": sorted({str(g.get("host", "")) for g in got}),
            "files": sum(int(g.get("files", 0)) for g in got),
            "bytes": sum(int(g.get("bytes", 0)) for g in got),
            "seconds": whole.get("seconds")}


# ---------------------------------------------------------------------------
# the rendezvous server's key-value store: the receiver's address only
# ---------------------------------------------------------------------------

def rendezvous() -> tuple[str, int] | None:
    """Horovod's rendezvous server (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT), or None."""
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "").strip()
    port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "").strip()
    if not addr or not port.isdigit():
        return None
    return addr, int(port)


def _kv(method: str, server: tuple[str, int], key: str, body: bytes | None = None,
        timeout: float = 5.0) -> bytes | None:
    conn = http.client.HTTPConnection(server[0], server[1], timeout=timeout)
    try:
        conn.request(method, f"/{SCOPE}/{key}", body=body,
                     headers={"Content-Length": str(len(body or b""))})
        resp = conn.getresponse()
        data = resp.read()
        return data if resp.status == 200 else None
    finally:
        conn.close()


def key_of(profile_dir: str | os.PathLike[str]) -> str:
    """The key of a job's receiver: its profile directory's name (the same on
    every rank: HOROVOD_PROFILE_DIR, else the default, hooks/core_open.c)."""
    name = Path(os.path.abspath(profile_dir)).name
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "job"


# ---------------------------------------------------------------------------
# rank 0's exit merge: the receiver
# ---------------------------------------------------------------------------

def _identity(header: dict[str, Any]) -> list[int]:
    return [int(header.get(k, 0)) for k in _IDENTITY]


def _sees(profile_dir: Path, rank: int, identity: list[int]) -> bool:
    from profiler.errors import ProfilerError
    from profiler.formats.raw import read_header

    try:
        return _identity(read_header(raw_path(profile_dir, rank))) == identity
    except (ProfilerError, OSError):
        return False


def _safe_name(name: str, rank: int) -> bool:
    parts = name.split("/")
    return (len(parts) == 2 and parts[0] in SUBDIRS and parts[1].startswith(f"rank-{rank:05d}.")
            and ".." not in name and "\0" not in name)


def _readline(conn: socket.socket, limit: int = 1 << 20) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        b = conn.recv(1)
        if not b:
            raise ConnectionError("closed")
        buf += b
        if len(buf) > limit:
            raise ConnectionError("line too long")
    return bytes(buf)


class Receiver:
    """Rank 0's exit merge, in a job without MPI: accepts the other ranks'
    offers on a thread of its own until `close` (module doc).  `state(r)`:
    None (not heard from), "visible" (rank 0 sees its files), "receiving",
    "received", "failed"."""

    def __init__(self, profile_dir: str | os.PathLike[str], world: int) -> None:
        self.dir = Path(profile_dir)
        self.world = world
        self._states: dict[int, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(min(4096, max(16, world)))
        self.sock.settimeout(0.2)
        self.started = time.monotonic()
        self.bytes = 0
        self._received = 0
        self._thread = threading.Thread(target=self._serve, name="hvprof-gather", daemon=True)
        self._thread.start()

    def publish(self, server: tuple[str, int]) -> str:
        """Put this receiver's address into the rendezvous server; returns it."""
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:  # the address on the interface that reaches the rendezvous server
            probe.connect(server)
            host = probe.getsockname()[0]
        finally:
            probe.close()
        address = f"{host}:{self.sock.getsockname()[1]}"
        _kv("PUT", server, key_of(self.dir), address.encode())
        return address

    def state(self, rank: int) -> str | None:
        with self._lock:
            return self._states.get(rank)

    def _set(self, rank: int, state: str) -> None:
        with self._lock:
            self._states[rank] = state

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(60)
                    self._one(conn)
                except (OSError, ValueError, KeyError, ConnectionError,
                        orjson.JSONDecodeError):
                    pass

    def _one(self, conn: socket.socket) -> None:
        offer = orjson.loads(_readline(conn))
        rank = int(offer["rank"])
        files = [(str(n), int(s), int(t)) for n, s, t in offer["files"]]
        if not 0 < rank < 1 << 20 or any(not _safe_name(n, rank) or s < 0 for n, s, _ in files):
            conn.sendall(orjson.dumps({"send": False, "why": "bad offer"}) + b"\n")
            return
        if _sees(self.dir, rank, [int(x) for x in offer["identity"]]):
            self._set(rank, "visible")
            conn.sendall(orjson.dumps({"send": False}) + b"\n")
            return
        self._set(rank, "receiving")
        conn.sendall(orjson.dumps({"send": True}) + b"\n")
        total = 0
        # a raw file that comes without its dataset is the merge's to convert
        patch = not any(n.startswith("ranks/") for n, _, _ in files)
        for name, size, mtime_ns in files:
            self._receive_file(conn, rank, name, size, mtime_ns, patch)
            total += size
        (self.dir / RAW_DIR).mkdir(parents=True, exist_ok=True)
        gathered_path(raw_path(self.dir, rank)).write_bytes(orjson.dumps(
            {"rank": rank, "host": str(offer.get("host", "")), "files": len(files),
             "bytes": total, "over": "tcp"}))
        with self._lock:
            self.bytes += total
            self._received += 1
            doc = {"over": "tcp", "ranks": self._received, "bytes": self.bytes,
                   "seconds": round(time.monotonic() - self.started, 6), "chunk_bytes": CHUNK}
        (self.dir / RAW_DIR / GATHER_FILE).write_bytes(orjson.dumps(doc))
        self._set(rank, "received")
        conn.sendall(orjson.dumps({"ok": True}) + b"\n")

    def _receive_file(self, conn: socket.socket, rank: int, name: str, size: int,
                      mtime_ns: int, patch: bool) -> None:
        """One file, under a temporary name until whole; its sender's
        modification time kept (a dataset is up to date with its raw file
        by size, state and time: profiler.postjob.convert.is_up_to_date)."""
        final = self.dir / name
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.gather.tmp")
        left = size
        try:
            with open(tmp, "wb") as f:
                if patch and name.endswith(".hvprof") and size >= F.HEADER_BYTES:
                    f.write(_closed_copy(_recv_exact(conn, F.HEADER_BYTES)))
                    left -= F.HEADER_BYTES
                while left:
                    data = conn.recv(min(CHUNK, left))
                    if not data:
                        raise ConnectionError(f"rank {rank}: {name} cut short")
                    f.write(data)
                    left -= len(data)
            if mtime_ns > 0:
                os.utime(tmp, ns=(mtime_ns, mtime_ns))
            os.replace(tmp, final)
        except BaseException:
            self._set(rank, "failed")
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data = conn.recv(n - len(buf))
        if not data:
            raise ConnectionError("cut short")
        buf += data
    return bytes(buf)


def _closed_copy(data: bytes) -> bytes:
    """A raw file's first bytes with its header marked closed and to be
    converted by the merge (a complete copy: its process goes on elsewhere)."""
    b = bytearray(data)
    state = int.from_bytes(b[_STATE:_STATE + 4], "little") | F.STATE_CLOSED
    b[_STATE:_STATE + 4] = state.to_bytes(4, "little")
    b[_SELF_CONVERTS:_SELF_CONVERTS + 4] = (0).to_bytes(4, "little")
    return bytes(b)


def start_receiver(profile_dir: str, world: int,
                   say: Callable[[str], None]) -> Receiver | None:
    """Rank 0's exit merge in a job without MPI that has a rendezvous server
    and more than one rank: a receiver, published (None otherwise, or when it
    cannot start: said in one line, and the ranks keep their files)."""
    from profiler._env import read

    server = rendezvous()
    if server is None or world < 2 or not read("HOROVOD_PROFILE_GATHER"):
        return None
    try:
        rx = Receiver(profile_dir, world)
    except OSError as exc:
        say(f"warning: cannot receive the other hosts' files: {exc}")
        return None
    try:
        rx.publish(server)
    except OSError as exc:
        rx.close()
        say(f"warning: cannot reach the rendezvous server {server[0]}:{server[1]} to receive "
            f"the other hosts' files: {exc}")
        return None
    return rx


# ---------------------------------------------------------------------------
# every other rank, at its exit: the offer
# ---------------------------------------------------------------------------

def own_files(profile_dir: Path, rank: int) -> list[tuple[str, int, int]]:
    """This rank's files to send: raw/, hang/ and ranks/rank-R.* (temporaries
    left out), as (name relative to the directory, size, mtime in ns)."""
    out: list[tuple[str, int, int]] = []
    for sub in SUBDIRS:
        d = profile_dir / sub
        if not d.is_dir():
            continue
        # the raw file last: where it lands, the merge may take the rank as arrived
        for p in sorted(d.iterdir(), key=lambda p: (p.suffix == ".hvprof", p.name)):
            if p.name.startswith(f"rank-{rank:05d}.") and ".tmp" not in p.name and p.is_file():
                st = p.stat()
                out.append((f"{sub}/{p.name}", st.st_size, st.st_mtime_ns))
    return out


def offer(profile_dir: str | os.PathLike[str], raw: str, rank: int, *,
          timeout: float) -> str:
    """This rank's files to rank 0's exit merge (a job without MPI): "sent",
    "shared" (this rank sees rank 0's raw file: their disk is shared, and
    nothing is offered, so a job on one disk waits for nothing), "visible"
    (rank 0 sees them: nothing sent), "off" (no rendezvous server, gathering
    off), or "unreachable" (no receiver within `timeout`: the files stay
    here).  Never raises."""
    from profiler._env import read
    from profiler.formats.raw import read_header

    server = rendezvous()
    if server is None or rank <= 0 or not read("HOROVOD_PROFILE_GATHER"):
        return "off"
    d = Path(profile_dir)
    if raw_path(d, 0).is_file():
        return "shared"
    deadline = time.monotonic() + max(0.0, timeout)
    try:
        header = read_header(raw)
    except Exception:  # noqa: BLE001 - nothing to offer
        return "off"
    key = key_of(d)
    while True:
        try:
            addr = _kv("GET", server, key, timeout=2.0)
        except OSError:
            addr = None  # the launcher is gone: no receiver will come
            return "unreachable"
        if addr:
            try:
                return _send(d, rank, header, addr.decode(), deadline)
            except (OSError, ValueError, ConnectionError, orjson.JSONDecodeError):
                pass  # an old receiver, or cut: try again while there is time
        if time.monotonic() >= deadline:
            return "unreachable"
        time.sleep(0.2)


def _send(d: Path, rank: int, header: dict[str, Any], address: str, deadline: float) -> str:
    host, _, port = address.rpartition(":")
    files = own_files(d, rank)
    with socket.create_connection((host, int(port)),
                                  timeout=max(1.0, deadline - time.monotonic())) as conn:
        conn.sendall(orjson.dumps({"rank": rank, "identity": _identity(header),
                                   "host": socket.gethostname(), "files": files}) + b"\n")
        reply = orjson.loads(_readline(conn))
        if not reply.get("send"):
            return "visible"
        for name, size, _ in files:
            with open(d / name, "rb") as f:
                left = size
                while left:
                    data = f.read(min(CHUNK, left)) or b"\0" * min(CHUNK, left)  # shrank: pad
                    conn.sendall(data)
                    left -= len(data)
        done = orjson.loads(_readline(conn))
        return "sent" if done.get("ok") else "unreachable"
