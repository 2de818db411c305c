"""Several "hosts" on one machine: network namespaces on a private bridge, with real network faults.

Multi-host tests (tests/reliability/, docs/reliability.md) need what a cluster has and one loopback interface
does not: an address per host, links that can be cut, packets that can be lost, delayed or refused. This module
builds that from Linux network namespaces and iptables, as root, and removes all of it afterwards. It uses only
the standard library, so any test (or a benchmark) can import it with ``tests/`` on ``sys.path``.

Topology. ``Network(n)`` creates n+1 namespaces named ``trns<pid>-h0 .. h<n-1>`` and ``trns<pid>-sw`` (``<pid>``
is the creating process, so leftovers of a crashed run can be told from a live one). The switch namespace holds a
bridge ``br0``; each host namespace holds ``lo`` and ``eth0``, one end of a veth pair whose other end
(``h<i>``) is a port of the bridge. Host *i* has the address ``10.213.0.<i+1>/24``. Nothing is created in the
machine's own namespace: no interface, no route, no rule; the test subnet exists only inside our namespaces.

API::

    from netns import Network, require_namespaces

    require_namespaces()                  # pytest.skip, with the reason, where namespaces are forbidden
    with Network(3) as net:               # or net = Network(3); ...; net.close()
        a, b, c = net.hosts               # Host objects: .name ("h0"), .index, .ns, .ip
        p = a.popen([sys.executable, "-c", "..."], env=env)   # subprocess.Popen inside host a
        a.run(["ip", "addr"])             # subprocess.run inside host a (check=True, text output)
        cut = net.partition([a], [b, c])  # silent partition: DROP on INPUT between the groups
        cut.heal()                        # every fault returns a Fault; heal() removes it (idempotent)
        net.reject([a], [b])              # refused: REJECT --reject-with tcp-reset between the groups
        net.loss(0.1)                     # every host drops 10 % of the packets it receives from the subnet
        net.loss(0.2, [b])                # ... or only the given hosts
        net.link_down(b)                  # b's cable pulled (switch side of its veth down); heal() = up
        net.delay(b, 0.05, jitter=0.02)   # userspace proxy: b's TCP connections to and from other hosts
        net.heal()                        # heal every fault still in place
    # leaving the block kills every process started in a host and deletes every namespace

Faults, precisely:

- ``partition(*groups)``: for every pair of hosts in different groups, each drops on INPUT whatever the other
  sends. Both directions are silent: no RST, no ICMP, a connect times out, an established connection just stops
  delivering. DROP is on INPUT only, because a DROP on OUTPUT makes the sender's own ``send``/``connect`` fail at
  once with EPERM, which no real switch does. Hosts named in no group keep talking to everyone.
- ``isolate(host)``: ``partition([host], every other host)``.
- ``reject(*groups)``: like ``partition`` but TCP segments are answered with a reset: a connect is refused
  (ECONNREFUSED), an established connection is reset on its next segment.
- ``loss(p, hosts=None)``: each given host (default all) drops a fraction ``p`` of the packets it receives from
  other hosts (``-m statistic --mode random``). Loss on the receive side of every host gives loss ``p`` on each
  one-way path between two lossy hosts.
- ``link_down(host)``: the switch-side end of the host's veth goes down: the host's ``eth0`` loses carrier, every
  frame to and from it is lost, its sockets see silence (like a pulled cable or a dead switch port).
- ``delay(host, seconds, jitter=0.0)``: the kernel here has no netem, so latency is a userspace TCP proxy in the
  host's namespace (``python netns.py delay-proxy``). iptables ``REDIRECT`` sends to it every *new* TCP
  connection from the host to another host (nat OUTPUT) and from another host to it (nat PREROUTING); it reads
  the original destination (``SO_ORIGINAL_DST``), connects there with a firewall mark that exempts it from the
  redirect, and relays each chunk of each direction after ``seconds ± jitter`` (uniform), never reordering a
  stream. Connections that existed before the call are not delayed. Healing removes the redirect for new
  connections and sets the delay of the proxied ones to zero. A limitation: a connect through the proxy to a
  port nobody listens on succeeds and is then reset, where a direct one would be refused.

Clean-up. ``close()`` (also run by ``__exit__``, by ``atexit`` and on a failed construction) kills every process
it started and every process left in its namespaces (``ip netns pids``), then deletes the namespaces; deleting a
namespace deletes its interfaces and rules. A new ``Network`` first removes the namespaces of earlier runs whose
creating process no longer exists (``clean_leftovers``), so a crash (kill -9 of pytest) leaks nothing for long.

Requirements: root (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2, iptables (``./bootstrap`` installs it).
``namespaces_unavailable()`` returns the reason they cannot be used here, or None; ``require_namespaces()`` turns
that reason into a pytest skip. A missing iptables is not a reason to skip: it is an error that says to run
./bootstrap.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PREFIX = "trns"
SUBNET = "10.213.0"  # a /24 that exists only inside the namespaces this module creates
PROXY_MARK = 0x7A11  # the delay proxy's own connections carry this mark and are never redirected
PROXY_PORT = 29999  # below 32768, where Linux's ephemeral ports start: no collision with them
COMMAND_TIMEOUT_S = 30.0


class NetnsError(RuntimeError):
    """A namespace or firewall command failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _sh(["ip", *args], check=check)


def _sh(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


# ----------------------------------------------------------------------------------------------------------------
# Can we, and clean-up of earlier runs


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be used on this machine, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"this machine forbids network namespaces: ip netns add: {done.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def require_namespaces() -> None:
    """Skip the calling test, saying why, where namespaces are forbidden; fail where only iptables is missing."""
    import pytest

    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    if shutil.which("iptables") is None:
        pytest.fail("iptables is not installed: run ./bootstrap (apt-get install -y iptables)")


def _owner_pid(ns: str) -> int | None:
    if not ns.startswith(PREFIX):
        return None
    head = ns[len(PREFIX) :].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _list_namespaces() -> list[str]:
    done = _ip("netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def destroy_namespace(ns: str) -> None:
    """Kill every process inside ``ns`` and delete it (with its interfaces and rules). Never raises."""
    for _ in range(3):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
        if not pids:
            break
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        time.sleep(0.05)
    _ip("netns", "del", ns, check=False)


def clean_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose creating process is gone; returns their names."""
    removed = []
    for ns in _list_namespaces():
        owner = _owner_pid(ns)
        if owner is not None and owner != os.getpid() and not _pid_exists(owner):
            destroy_namespace(ns)
            removed.append(ns)
    return removed


# ----------------------------------------------------------------------------------------------------------------
# Hosts and faults


@dataclass
class Host:
    """One host: a namespace with ``lo`` and ``eth0`` at ``ip``."""

    name: str
    index: int
    ns: str
    ip: str
    network: Network = field(repr=False)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this host."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside this host (``subprocess.Popen`` keyword arguments); killed by ``close()``."""
        proc = subprocess.Popen(self.command(argv), **kwargs)
        self.network.processes.append(proc)
        return proc

    def run(
        self, argv: Sequence[str], check: bool = True, timeout: float = COMMAND_TIMEOUT_S, **kwargs
    ) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(argv), check=check, timeout=timeout, **kwargs)

    def iptables(self, *args: str, table: str = "filter") -> None:
        _sh(["ip", "netns", "exec", self.ns, "iptables", "-w", "-t", table, *args])

    def iptables_restore(self, rules: Sequence[Sequence[str]], table: str = "filter") -> None:
        """Insert ``rules`` (each a chain and its match and target) in one transaction: all or none, at once."""
        text = f"*{table}\n" + "".join(f"-I {' '.join(rule)}\n" for rule in rules) + "COMMIT\n"
        argv = ["ip", "netns", "exec", self.ns, "iptables-restore", "--noflush"]
        try:
            done = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NetnsError(f"{' '.join(argv)}: {exc}") from exc
        if done.returncode != 0:
            raise NetnsError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")


class Fault:
    """One injected fault; ``heal()`` undoes it (idempotent). Usable as a context manager."""

    def __init__(self, network: Network, what: str, undo: list) -> None:
        self.network = network
        self.what = what
        self._undo = undo  # callables, run in reverse order
        self.healed = False
        self.started = time.monotonic()
        network.faults.append(self)

    def heal(self) -> None:
        if self.healed:
            return
        self.healed = True
        errors = []
        for undo in reversed(self._undo):
            try:
                undo()
            except NetnsError as exc:
                errors.append(str(exc))
        if errors:
            raise NetnsError(f"healing {self.what}: {'; '.join(errors)}")

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()

    def __repr__(self) -> str:
        return f"Fault({self.what}{', healed' if self.healed else ''})"


class Network:
    """``n`` hosts on one bridge (see the module docstring). Use as a context manager."""

    def __init__(self, n: int, subnet: str = SUBNET) -> None:
        if not 1 <= n <= 250:
            raise ValueError("1 to 250 hosts")
        if shutil.which("iptables") is None:
            raise NetnsError("iptables is not installed: run ./bootstrap (apt-get install -y iptables)")
        self.subnet = subnet
        self.tag = f"{PREFIX}{os.getpid()}-{os.urandom(2).hex()}"
        self.switch = f"{self.tag}-sw"
        self.hosts: list[Host] = []
        self.processes: list[subprocess.Popen] = []
        self.faults: list[Fault] = []
        self._closed = False
        clean_leftovers()
        atexit.register(self.close)
        try:
            self._build(n)
        except BaseException:
            self.close()
            raise

    def _build(self, n: int) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(n):
            host = Host(f"h{i}", i, f"{self.tag}-h{i}", f"{self.subnet}.{i + 1}", self)
            _ip("netns", "add", host.ns)
            self.hosts.append(host)
            _ip(
                "link", "add", "eth0", "netns", host.ns, "type", "veth", "peer", "name", host.name, "netns", self.switch
            )
            _ip("-n", self.switch, "link", "set", host.name, "master", "br0")
            _ip("-n", self.switch, "link", "set", host.name, "up")
            _ip("-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _ip("-n", host.ns, "link", "set", "eth0", "up")
            _ip("-n", host.ns, "link", "set", "lo", "up")

    # -- faults ----------------------------------------------------------------------------------------------

    def _between(self, groups: Sequence[Iterable[Host]], target: list[str], what: str) -> Fault:
        sets = [list(g) for g in groups]
        if len(sets) < 2:
            raise ValueError("at least two groups")
        rules: list[tuple[Host, list[str]]] = []
        fault = Fault(self, what, [])
        for gi, group in enumerate(sets):
            for host in group:
                for gj, other in enumerate(sets):
                    if gj == gi:
                        continue
                    for peer in other:
                        spec = ["INPUT", "-s", peer.ip, "-d", host.ip, *target]
                        host.iptables("-I", *spec)
                        rules.append((host, spec))
                        fault._undo.append(lambda h=host, s=spec: h.iptables("-D", *s))
        return fault

    def partition(self, *groups: Iterable[Host]) -> Fault:
        """Silent partition between the groups (DROP on INPUT both ways)."""
        names = " | ".join(",".join(h.name for h in g) for g in (list(x) for x in groups))
        return self._between(groups, ["-j", "DROP"], f"partition {names}")

    def isolate(self, host: Host) -> Fault:
        return self.partition([host], [h for h in self.hosts if h is not host])

    def reject(self, *groups: Iterable[Host]) -> Fault:
        """Refused connections between the groups (TCP answered with a reset).

        Each host of the first group cuts both directions in one transaction (``iptables-restore``), before the
        other hosts' rules go in, so the cut is whole at one instant. Cut host by host, it would leave for a moment
        links that still carry what one side concluded from the other's refusals (a DEAD verdict about a process
        the other side can still reach) across the cut."""
        sets = [list(g) for g in groups]
        names = " | ".join(",".join(h.name for h in g) for g in sets)
        # A reset from the far side must get through: only segments without RST are rejected.
        target = ["-p", "tcp", "--tcp-flags", "RST", "NONE", "-j", "REJECT", "--reject-with", "tcp-reset"]
        others = [peer for group in sets[1:] for peer in group]
        cuts = []
        for host in sets[0]:
            rules = [["INPUT", "-s", peer.ip, "-d", host.ip, *target] for peer in others]
            rules += [["OUTPUT", "-s", host.ip, "-d", peer.ip, *target] for peer in others]
            host.iptables_restore(rules)
            cuts += [(host, rule) for rule in rules]
        fault = self._between(sets, target, f"reject {names}")
        fault._undo[:0] = [lambda h=host, r=rule: h.iptables("-D", *r) for host, rule in cuts]  # undone last
        return fault

    def loss(self, probability: float, hosts: Iterable[Host] | None = None) -> Fault:
        """Each given host (default: all) drops ``probability`` of the packets it receives from the subnet."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError("probability in [0, 1]")
        chosen = list(hosts) if hosts is not None else list(self.hosts)
        fault = Fault(self, f"loss {probability:g} on {','.join(h.name for h in chosen)}", [])
        for host in chosen:
            spec = [
                "INPUT",
                "-s",
                f"{self.subnet}.0/24",
                "!",
                "-i",
                "lo",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                f"{probability:.6f}",
                "-j",
                "DROP",
            ]
            host.iptables("-A", *spec)
            fault._undo.append(lambda h=host, s=spec: h.iptables("-D", *s))
        return fault

    def link_down(self, host: Host) -> Fault:
        """The host's cable is pulled: the switch side of its veth goes down until healed."""
        _ip("-n", self.switch, "link", "set", host.name, "down")
        return Fault(self, f"link down {host.name}", [lambda: _ip("-n", self.switch, "link", "set", host.name, "up")])

    def delay(self, host: Host, seconds: float, jitter: float = 0.0) -> Fault:
        """Latency ``seconds ± jitter`` on every new TCP connection between ``host`` and another host."""
        proc = host.popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "delay-proxy",
                "--port",
                str(PROXY_PORT),
                "--delay",
                repr(seconds),
                "--jitter",
                repr(jitter),
                "--mark",
                str(PROXY_MARK),
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        line = proc.stdout.readline() if proc.stdout else ""
        if line.strip() != "ready":
            proc.kill()
            raise NetnsError(f"the delay proxy in {host.name} did not start: {line!r}")
        fault = Fault(self, f"delay {seconds:g}±{jitter:g}s on {host.name}", [])
        # Healing: first no new connection is redirected, then the proxied ones lose their delay (SIGUSR1).
        fault._undo.append(lambda: proc.poll() is None and proc.send_signal(signal.SIGUSR1))
        rules = [
            (
                "nat",
                [
                    "OUTPUT",
                    "-p",
                    "tcp",
                    "-o",
                    "eth0",
                    "-d",
                    f"{self.subnet}.0/24",
                    "-m",
                    "mark",
                    "!",
                    "--mark",
                    str(PROXY_MARK),
                    "-j",
                    "REDIRECT",
                    "--to-ports",
                    str(PROXY_PORT),
                ],
            ),
            ("nat", ["PREROUTING", "-p", "tcp", "-d", host.ip, "-j", "REDIRECT", "--to-ports", str(PROXY_PORT)]),
        ]
        for table, spec in rules:
            host.iptables("-A", *spec, table=table)
            fault._undo.append(lambda t=table, s=spec: host.iptables("-D", *s, table=t))
        return fault

    def heal(self) -> None:
        """Heal every fault still in place."""
        for fault in reversed(self.faults):
            fault.heal()

    # -- clean-up --------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self.processes:
            if proc.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        proc.send_signal(sig)
                    except (ProcessLookupError, OSError):
                        pass
        for proc in self.processes:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for host in self.hosts:
            destroy_namespace(host.ns)
        destroy_namespace(self.switch)
        atexit.unregister(self.close)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------------------------
# The delay proxy (runs inside a host namespace: ``python netns.py delay-proxy ...``)


def _delay_proxy(port: int, delay: float, jitter: float, mark: int) -> None:
    import asyncio
    import socket
    import struct

    state = {"delay": delay, "jitter": jitter}
    rng = random.Random()

    def original_destination(sock: socket.socket) -> tuple[str, int]:
        raw = sock.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST: a sockaddr_in
        (dst_port,) = struct.unpack_from("!H", raw, 2)
        return socket.inet_ntoa(raw[4:8]), dst_port

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay one direction: each chunk leaves ``delay ± jitter`` after it arrived, in order."""
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def release() -> None:
            try:
                while True:
                    due, data = await queue.get()
                    if data is None:
                        break
                    wait = due - loop.time()
                    if wait > 0 and state["delay"] > 0:
                        await asyncio.sleep(wait)
                    writer.write(data)
                    await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()  # a half-close travels on, after the delayed data
            except (ConnectionError, OSError):
                writer.transport.abort()

        sender = asyncio.create_task(release())
        last_due = 0.0
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                due = loop.time() + max(0.0, state["delay"] + rng.uniform(-state["jitter"], state["jitter"]))
                last_due = max(last_due, due)  # a stream is never reordered
                queue.put_nowait((last_due, data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((0.0, None))
        await sender

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        sock = client_writer.get_extra_info("socket")
        try:
            host, dst_port = original_destination(sock)
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
            upstream.setblocking(False)
            await asyncio.get_running_loop().sock_connect(upstream, (host, dst_port))
            up_reader, up_writer = await asyncio.open_connection(sock=upstream)
        except (OSError, asyncio.TimeoutError):
            client_writer.transport.abort()
            return
        await asyncio.gather(pump(client_reader, up_writer), pump(up_reader, client_writer))
        client_writer.close()
        up_writer.close()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, lambda: state.update(delay=0.0, jitter=0.0))
        server = await asyncio.start_server(handle, "0.0.0.0", port, reuse_address=True)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="netns.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    proxy = sub.add_parser("delay-proxy", help="the userspace delay proxy (run inside a host namespace)")
    proxy.add_argument("--port", type=int, default=PROXY_PORT)
    proxy.add_argument("--delay", type=float, required=True)
    proxy.add_argument("--jitter", type=float, default=0.0)
    proxy.add_argument("--mark", type=int, default=PROXY_MARK)
    sub.add_parser("clean", help="delete the namespaces of earlier runs whose creator is gone")
    args = parser.parse_args(argv)
    if args.cmd == "delay-proxy":
        _delay_proxy(args.port, args.delay, args.jitter, args.mark)
    else:
        print("\n".join(clean_leftovers()))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
