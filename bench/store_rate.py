"""What joining the mesh costs the job's one store: operations and bytes per process, and a real store's rate.

Every process of a job runs ``rasd.net.bootstrap.StoreBootstrap(store).secret()`` then ``.seeds(me)`` at start-up,
all through ONE store. To model the start of a 16,384- or 100,000-process job (bench/scale.py imports ``measure``)
this measures, on this machine:

1. **Operations and bytes per process.** The REAL bootstrap calls, run by 8 processes one after another (join
   indices 1..8) through ``CountingStore``, which counts each store call by kind and its payload bytes (keys and
   values as passed, 8 bytes per integer). Each process gets its own client connection through a loopback relay
   that counts the bytes really sent and received on the wire (TCPStore's binary protocol; etcd's HTTP/JSON
   gateway, headers included). Reported for join index 1 (``first``), 2 (``second``, one seed) and the rest
   (``other``, two seeds: every process of a large job but two), with and without ``TORCHRAS_SECRET`` set.
   THE BASELINE is the bootstrap as committed (``git show HEAD:rasd/net/bootstrap.py``), counted the same way
   (rows ``<store>@HEAD``), so a change to the bootstrap shows as a change in operations and bytes.
   ``wire_requests`` counts the requests that reach the server: a TCPStore ``get`` is two (its client sends WAIT
   then GET, inprocess/tcpstore_client.py), an EtcdStore call is one or more HTTP requests (counted).
2. **Server throughput.** A REAL ``torch.distributed.TCPStore`` master (torch's defaults: the libuv backend) in a
   child process, and a REAL etcd member (Debian's ``etcd``, one member on loopback, data in /dev/shm as
   tests/inprocess/etcd_cluster.py starts it) with ``inprocess.etcd_store.EtcdStore`` clients. P client processes
   (P = 16, 64, 128; 16 with ``--quick``) each repeat the real bootstrap for a fresh key prefix per round, all P
   joining each round as one job would, for a fixed time. Figures: store operations per second, all clients
   together (``ops_per_s``, API calls as counted by ``CountingStore``), and the server process's CPU seconds per
   operation (psutil on its pid). ``cpu_s_per_op`` is taken at the largest P, the most contention: for etcd it
   grows with P, because EtcdStore's ``add`` is a compare-and-swap retried on conflict (every process adds to the
   same ``joined`` counter) and a ``wait`` for a record not yet written becomes a watch (``requests/s`` counts
   those HTTP requests too).
3. **Round-trip time.** One client, one operation at a time, against the idle server: the median per kind, and
   the median time of one whole bootstrap (secret and seeds of a process with two seeds).

Baseline and caveats. THIS MACHINE HAS FEW CORES (2 when written) AND THE P CLIENTS SHARE THEM WITH THE SERVER:
``ops_per_s`` is then bounded by the clients' Python, not by the server; ``service_time_s`` = 1 / the best
``ops_per_s`` is that pessimistic figure. ``cpu_s_per_op`` (server CPU per operation) is the figure that
transfers to a dedicated store host: the TCPStore server is one libuv thread, so one core serves about
1 / ``cpu_s_per_op`` operations per second; etcd is multi-threaded Go, and its CPU includes the JSON gateway
(a gRPC client would cost it less) but no disk (a real member fsyncs each write batch to its disk).

    python bench/store_rate.py            # the full run (a few minutes): the table, then one JSON line
    python bench/store_rate.py --quick    # under a minute: P = 16 only, shorter windows

The JSON object (``measure()`` returns the same dict): ``ops_per_process[store][role]`` with ``ops``, ``by_op``,
``wire_requests``, ``payload_sent``/``payload_received``, ``wire_sent``/``wire_received`` (bytes; also for stores
``tcpstore@HEAD`` and ``etcd@HEAD``, the baseline), for roles
``first``, ``second``, ``other``, ``first_env``, ``other_env``; and per store (``tcpstore``, ``etcd``):
``ops_per_s``, ``service_time_s``, ``cpu_s_per_op``, ``rtt_s``, ``bootstrap_s``, ``by_clients`` (per P:
``ops_per_s``, ``cpu_s_per_op``, ``cpu_s_per_request``, ``wire_requests_per_s``), ``rtt_by_op_s``,
``ops_per_process`` (an ``other`` process), ``wire_requests_per_process`` and ``wire_bytes_per_process``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import logging
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

import psutil

from rasd.core.peers import Addr, PeerInfo
from rasd.net.bootstrap import StoreBootstrap

log = logging.getLogger("store_rate")

KINDS = ("compare_set", "add", "set", "wait", "get", "check", "multi_get")
INT = 8  # bytes of an integer on the wire (TCPStore's int64); a payload convention for add's amount and result


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size(item) for item in value)
    return INT if isinstance(value, int) else 0


def _payload(kind: str, args: tuple[Any, ...], result: Any) -> tuple[int, int]:
    """(sent, received) payload bytes of one call: keys and values as passed, INT per integer."""
    if kind == "wait" or kind == "check":
        return _size(args[0]), 1 if kind == "check" else 0
    if kind == "add":
        return _size(args[0]) + INT, INT
    if kind in ("get", "multi_get"):
        return _size(args[0]), _size(result)
    return sum(_size(a) for a in args), _size(result)  # set (no result), compare_set


class CountingStore:
    """Forwards every call to ``inner``; counts the store operations by kind and their payload bytes.

    Only what ``inner`` has is offered (``getattr`` fails alike), so the bootstrap takes the same path through
    the wrapper as through the store itself.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ops: collections.Counter[str] = collections.Counter()
        self.sent = 0
        self.received = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)
        if name not in KINDS:
            return fn

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.ops[name] += 1
            result = fn(*args, **kwargs)
            sent, received = _payload(name, args, result)
            with self._lock:
                self.sent += sent
                self.received += received
            return result

        return counted

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "ops": sum(self.ops.values()),
                "by_op": dict(sorted(self.ops.items())),
                "payload_sent": self.sent,
                "payload_received": self.received,
            }


def peer(i: int) -> PeerInfo:
    """A plausible GPU process: 8 per host, one device each, a start-time incarnation."""
    host = i // 8
    return PeerInfo(
        Addr(f"10.{host >> 16 & 255}.{host >> 8 & 255}.{host & 255}", 29600 + i % 8),
        pid=100000 + i,
        hostname=f"gpu-node-{host:05d}",
        incarnation=(1_750_000_000_000 << 20) + i,
        devices=(i % 8,),
        rank=i,
    )


@contextmanager
def secret_env(value: str | None) -> Iterator[None]:
    old = os.environ.get("TORCHRAS_SECRET")
    if value is None:
        os.environ.pop("TORCHRAS_SECRET", None)
    else:
        os.environ["TORCHRAS_SECRET"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCHRAS_SECRET", None)
        else:
            os.environ["TORCHRAS_SECRET"] = old


def join(store: Any, prefix: str, me: PeerInfo, timeout: float = 60.0, cls: type = StoreBootstrap) -> None:
    """One process's whole start-up through the store: the real bootstrap calls (of ``cls``)."""
    bootstrap = cls(store, prefix, timeout)
    bootstrap.secret()
    bootstrap.seeds(me)


def head_bootstrap() -> type | None:
    """``StoreBootstrap`` as committed (``git show HEAD:rasd/net/bootstrap.py``): the baseline; None without git."""
    try:
        source = subprocess.run(
            ["git", "show", "HEAD:rasd/net/bootstrap.py"],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    namespace: dict[str, Any] = {"__name__": "bootstrap_at_head"}
    exec(compile(source, "HEAD:rasd/net/bootstrap.py", "exec"), namespace)
    cls = namespace.get("StoreBootstrap")
    return cls if isinstance(cls, type) else None


# ---- a byte-counting relay -------------------------------------------------------------------------------------


class Relay:
    """A TCP relay on loopback to ``port`` that counts the bytes each way: the store's real traffic."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.sent = 0  # client to server
        self.received = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, up: bool) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    if up:
                        self.sent += len(data)
                    else:
                        self.received += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def counts(self) -> tuple[int, int]:
        """The counts once the traffic has settled (a TCPStore ``set`` has no reply to wait for)."""
        last = (-1, -1)
        while True:
            with self._lock:
                now = (self.sent, self.received)
            if now == last:
                return now
            last = now
            time.sleep(0.02)

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()


# ---- the two stores --------------------------------------------------------------------------------------------


def _tcp_server(pipe: Connection) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pipe.send((store.port, bool(getattr(store, "libuvBackend", False))))
    pipe.recv()  # until told to stop; the server runs on its own thread


class TCPServer:
    """A torch TCPStore master with torch's default settings, alone in a child process (its CPU is the server's)."""

    name = "tcpstore"

    def __init__(self) -> None:
        ours, theirs = multiprocessing.get_context("fork").Pipe()
        self._pipe = ours
        self._process = multiprocessing.get_context("fork").Process(target=_tcp_server, args=(theirs,), daemon=True)
        self._process.start()
        self.port, self.libuv = ours.recv()
        assert self._process.pid is not None
        self.pid = self._process.pid

    def client(self, port: int | None = None) -> Any:
        import torch.distributed as dist

        return dist.TCPStore("127.0.0.1", port or self.port, is_master=False, timeout=datetime.timedelta(seconds=60))

    @staticmethod
    def wire_requests(by_op: dict[str, int], store: Any) -> int:
        return sum(count * (2 if kind in ("get", "multi_get") else 1) for kind, count in by_op.items())

    def close(self) -> None:
        self._pipe.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def _free_ports(n: int) -> list[int]:
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class EtcdServer:
    """One etcd member on loopback, data in /dev/shm (as tests/inprocess/etcd_cluster.py starts one)."""

    name = "etcd"

    def __init__(self, timeout: float = 30.0) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: run ./bootstrap (apt-get install -y etcd-server)")
        self.data = tempfile.mkdtemp(prefix="store-rate-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.port, peer_port = _free_ports(2)
        client_url, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer_port}"
        arguments = ["--name", "solo", "--data-dir", os.path.join(self.data, "solo")]
        arguments += ["--listen-client-urls", client_url, "--advertise-client-urls", client_url]
        arguments += ["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url]
        arguments += ["--initial-cluster", f"solo={peer_url}", "--initial-cluster-state", "new"]
        arguments += ["--heartbeat-interval", "100", "--election-timeout", "1000"]
        with open(os.path.join(self.data, "etcd.log"), "w") as out:
            self._process = subprocess.Popen(
                [binary, *arguments], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        self.pid = self._process.pid
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=2) as reply:
                    if b'"true"' in reply.read():
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self._process.poll() is not None:
                self.close()
                raise RuntimeError(f"etcd did not become healthy (log in {self.data})")
            time.sleep(0.1)

    def client(self, port: int | None = None) -> Any:
        from inprocess.etcd_store import EtcdStore

        return EtcdStore(f"127.0.0.1:{port or self.port}", prefix="/store-rate", timeout=60.0, request_timeout=10.0)

    @staticmethod
    def wire_requests(by_op: dict[str, int], store: Any) -> int:
        return int(getattr(store, "requests", 0))

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait(10)
        shutil.rmtree(self.data, ignore_errors=True)


Server = TCPServer | EtcdServer


def _count_requests(store: Any) -> None:
    """Count an EtcdStore's HTTP requests (its ``_request`` and its watches) on the instance."""
    if not hasattr(store, "_request"):
        return
    store.requests = 0
    for name in ("_request", "_watch"):
        fn = getattr(store, name)

        def counted(*args: Any, _fn: Callable[..., Any] = fn, **kwargs: Any) -> Any:
            store.requests += 1
            return _fn(*args, **kwargs)

        setattr(store, name, counted)


# ---- 1. operations and bytes per process ---------------------------------------------------------------------


def ops_per_process(server: Server, processes: int = 8, cls: type = StoreBootstrap) -> dict[str, dict[str, Any]]:
    """The real bootstrap of ``processes`` processes in turn, each on its own connection through a relay."""
    relay = Relay(server.port)
    out: dict[str, dict[str, Any]] = {}
    try:
        for env in (None, "a-secret-from-the-environment"):
            prefix = f"count/{uuid.uuid4().hex}"
            rows = []
            with secret_env(env):
                for i in range(1, processes + 1):
                    inner = server.client(relay.port)
                    _count_requests(inner)
                    before = relay.counts()
                    counting = CountingStore(inner)
                    join(counting, prefix, peer(i), cls=cls)
                    after = relay.counts()
                    row = counting.snapshot()
                    row["wire_requests"] = server.wire_requests(row["by_op"], inner)
                    row["wire_sent"], row["wire_received"] = after[0] - before[0], after[1] - before[1]
                    rows.append(row)
                    del inner, counting
            suffix = "" if env is None else "_env"
            out["first" + suffix] = rows[0]
            if env is None:
                out["second"] = rows[1]
            others = rows[2:]
            typical = dict(others[len(others) // 2])
            for field in ("wire_sent", "wire_received", "payload_sent", "payload_received"):
                typical[field] = round(statistics.mean(r[field] for r in others))
            out["other" + suffix] = typical
    finally:
        relay.close()
    return out


# ---- 2. throughput under P clients -----------------------------------------------------------------------------


def _client(server: Server, index: int, run: str, go: Any, stop_at: Any, results: Any) -> None:
    logging.disable(logging.WARNING)
    store = CountingStore(server.client())
    _count_requests(store.inner)
    go.wait()
    start = time.monotonic()
    rounds = 0
    while time.monotonic() < stop_at.value:
        join(store, f"{run}/{rounds}", peer(index))
        rounds += 1
    snap = store.snapshot()
    snap["rounds"] = rounds
    snap["start"], snap["end"] = start, time.monotonic()
    snap["wire_requests"] = server.wire_requests(snap["by_op"], store.inner)
    results.put(snap)


def throughput(server: Server, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` processes repeat the real bootstrap, all joining each round, for ``seconds``; the rates."""
    ctx = multiprocessing.get_context("fork")
    go, results = ctx.Event(), ctx.Queue()
    stop_at = ctx.Value("d", float("inf"))
    run = f"rate/{uuid.uuid4().hex}"
    workers = [
        ctx.Process(target=_client, args=(server, i, run, go, stop_at, results), daemon=True) for i in range(clients)
    ]
    for w in workers:
        w.start()
    time.sleep(min(5.0, 0.5 + clients * 0.02))  # let them connect before the clock starts
    proc = psutil.Process(server.pid)
    cpu0 = sum(proc.cpu_times()[:2])
    stop_at.value = time.monotonic() + seconds
    began = time.monotonic()
    go.set()
    snaps = [results.get(timeout=seconds + 120) for _ in workers]
    ended = max(s["end"] for s in snaps)
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    for w in workers:
        w.join(10)
    ops = sum(s["ops"] for s in snaps)
    elapsed = ended - began
    return {
        "clients": clients,
        "ops_per_s": ops / elapsed,
        "wire_requests_per_s": sum(s["wire_requests"] for s in snaps) / elapsed,
        "cpu_s_per_op": cpu / ops,
        "cpu_s_per_request": cpu / max(1, sum(s["wire_requests"] for s in snaps)),
        "server_cpu_share": cpu / elapsed,  # of one core
        "joins_per_s": sum(s["rounds"] for s in snaps) / elapsed,
    }


# ---- 3. round-trip times ---------------------------------------------------------------------------------------


def round_trips(server: Server, reps: int) -> dict[str, Any]:
    store = server.client()
    prefix = f"rtt/{uuid.uuid4().hex}"
    store.set(f"{prefix}/there", b"x" * 64)
    calls: dict[str, Callable[[int], Any]] = {
        "compare_set": lambda i: store.compare_set(f"{prefix}/there", b"", b"y" * 64),
        "add": lambda i: store.add(f"{prefix}/counter", 1),
        "set": lambda i: store.set(f"{prefix}/peer/{i}", b"p" * 60),
        "wait": lambda i: store.wait([f"{prefix}/there"], datetime.timedelta(seconds=10)),
        "get": lambda i: store.get(f"{prefix}/there"),
    }
    samples: dict[str, list[float]] = {kind: [] for kind in calls}
    for i in range(reps):
        for kind, call in calls.items():
            t = time.perf_counter()
            call(i)
            samples[kind].append(time.perf_counter() - t)
    joins = []
    with secret_env(None):
        for r in range(max(5, reps // 10)):
            job = f"{prefix}/job{r}"
            join(store, job, peer(1))
            join(store, job, peer(2))
            t = time.perf_counter()
            join(store, job, peer(3))  # join index 3: two seeds, the most operations
            joins.append(time.perf_counter() - t)
    return {
        "rtt_s": statistics.median(x for values in samples.values() for x in values),
        "rtt_by_op_s": {kind: statistics.median(values) for kind, values in samples.items()},
        "bootstrap_s": statistics.median(joins),
    }


# ---- together --------------------------------------------------------------------------------------------------


def measure(quick: bool = False) -> dict[str, Any]:
    """All the figures (see the module docstring for the keys); ``quick``: P = 16 only, shorter windows."""
    levels = (16,) if quick else (16, 64, 128)
    seconds = 3.0 if quick else 8.0
    reps = 50 if quick else 300
    figures: dict[str, Any] = {
        "quick": quick,
        "cpus": os.cpu_count(),
        "note": "clients and server share this machine's CPUs: ops_per_s is client-bound; cpu_s_per_op transfers",
        "ops_per_process": {},
    }
    servers: tuple[Callable[[], Server], ...] = (TCPServer, EtcdServer)
    baseline = head_bootstrap()
    for make in servers:
        server = make()
        try:
            counts = ops_per_process(server, 6 if quick else 8)
            figures["ops_per_process"][server.name] = counts
            if baseline is not None:
                head = ops_per_process(server, 6 if quick else 8, baseline)
                figures["ops_per_process"][f"{server.name}@HEAD"] = head
            rtt = round_trips(server, reps)
            by_clients = {str(p): throughput(server, p, seconds) for p in levels}
        finally:
            server.close()
        best = max(by_clients.values(), key=lambda row: row["ops_per_s"])
        other = counts["other"]
        store: dict[str, Any] = {
            "ops_per_s": best["ops_per_s"],
            "service_time_s": 1.0 / best["ops_per_s"],
            "cpu_s_per_op": by_clients[str(levels[-1])]["cpu_s_per_op"],
            **rtt,
            "by_clients": by_clients,
            "ops_per_process": other["ops"],
            "wire_requests_per_process": other["wire_requests"],
            "wire_bytes_per_process": other["wire_sent"] + other["wire_received"],
        }
        if isinstance(server, TCPServer):
            store["libuv"] = server.libuv
        figures[server.name] = store
    return figures


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="store_rate.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="P = 16 only and shorter windows (under a minute)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    began = time.monotonic()
    figures = _round(measure(args.quick))
    print(f"store operations of one process's bootstrap ({figures['cpus']} CPUs; one row per process role)")
    print(f"{'store':<14} {'role':<10} {'ops':>4} {'requests':>9} {'payload B':>10} {'wire B':>8}  by operation")
    for name, roles in figures["ops_per_process"].items():
        for role, row in roles.items():
            payload = row["payload_sent"] + row["payload_received"]
            wire = row["wire_sent"] + row["wire_received"]
            ops = " ".join(f"{kind}={n}" for kind, n in row["by_op"].items())
            print(f"{name:<14} {role:<10} {row['ops']:>4} {row['wire_requests']:>9} {payload:>10} {wire:>8}  {ops}")
    print()
    print("server rate under P concurrent clients (the clients share the CPUs with the server: see cpu_s_per_op)")
    print(f"{'store':<9} {'P':>4} {'ops/s':>8} {'requests/s':>11} {'joins/s':>8} {'server CPU s/op':>16} {'CPU':>5}")
    for name in ("tcpstore", "etcd"):
        for p, row in figures[name]["by_clients"].items():
            print(
                f"{name:<9} {p:>4} {row['ops_per_s']:>8.0f} {row['wire_requests_per_s']:>11.0f} "
                f"{row['joins_per_s']:>8.0f} {row['cpu_s_per_op'] * 1e6:>13.1f} us {row['server_cpu_share']:>5.2f}"
            )
    print()
    print(f"{'store':<9} {'service s/op':>13} {'CPU s/op':>10} {'RTT median':>11} {'one join':>9}  RTT by operation")
    for name in ("tcpstore", "etcd"):
        s = figures[name]
        by_op = " ".join(f"{k}={v * 1e6:.0f}us" for k, v in s["rtt_by_op_s"].items())
        print(
            f"{name:<9} {s['service_time_s']:>13.3g} {s['cpu_s_per_op']:>10.3g} {s['rtt_s'] * 1e6:>8.0f} us "
            f"{s['bootstrap_s'] * 1e3:>6.2f} ms  {by_op}"
        )
    print(f"({time.monotonic() - began:.0f} s)")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
