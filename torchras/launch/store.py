"""The store torchrun's agent serves on ``MASTER_PORT``, and what the launchers of one job agree on through it.

Why the launcher serves a store. Under torchrun the workers get ``TORCHELASTIC_USE_AGENT_STORE=True``: a script's
``init_process_group("env://")`` (or ``TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)``) connects as a client
to a TCPStore that the agent of node 0 hosts, and no worker hosts it. A script written for torchrun must run here
unchanged, so node 0's launcher hosts the same store (multi-tenant, as torchrun's), on ``--master-port`` (static
rendezvous) or on a free port (``--standalone``).

The workers start at once, while the launcher is still importing torch: the launcher binds and listens on the port
with the standard library first, starts the workers, and hands the listening socket to torch's TCPStore
(``master_listen_fd``) from a thread. A worker that connects meanwhile waits in the socket's backlog.

A free port for ``--standalone`` is one whose next two ports are free too: the inprocess Wrapper's examples (and
nvidia-resiliency-ext's) put the Wrapper's store on ``MASTER_PORT + 1`` and an application store on
``MASTER_PORT + 2``.

What the launchers agree on (keys under ``torchras/launch/<run id>/``):

* ``node/<rank>/starts``: how many launchers have started the workers of that node rank. More than one: this
  launcher replaces one that was lost (a host that came back), so its workers are newcomers that join the running
  job instead of starting it (static rendezvous, where a node keeps its ``--node-rank``).
* ``nodes``: c10d rendezvous: a launcher's node rank is its order of arrival.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import logging
import random
import socket
import threading
import time
from typing import Any

from torchras_formats import ports

from .args import Plan, this_host

log = logging.getLogger(__name__)

#: How long the launcher tries to bind its store's port again for a restarted group (``LaunchStore.renew``).
RENEW_S = 10.0


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """What this launcher's workers are told, and how they start."""

    master_addr: str
    master_port: int
    node_rank: int
    relaunched: bool  # this node's workers ran before in this job: the new ones join it as newcomers


class LaunchError(RuntimeError):
    """The launchers could not meet (the port is taken, node 0's store never answered)."""


#: The lowest port a standalone store takes.
STANDALONE_LOW = 20000
#: Ports other processes bind later, which a standalone store and its two neighbours keep clear of: torch's debug
#: server (25999) and the RAS client ports, ours and NCCL's (28028 and the ports jobs move on to, 28128 and after).
LATER_BOUND = (range(25990, 26010), range(28000, 28200))


def _free_base_port(host: str) -> socket.socket:
    """A socket listening on a free port p of ``host`` with p + 1 and p + 2 free as well, below the ports the
    kernel hands out to outgoing connections: p + 1 is bound seconds later, by the first Wrapper to import torch,
    and a port in that range can be taken meanwhile by any connection of any process on the host (then every
    Wrapper finds it taken, nobody serves the store, and every rank waits for it: chaos matrix pass 3)."""
    low = ports.ephemeral_low()
    if low - 3 > STANDALONE_LOW:
        for _ in range(200):
            port = random.randrange(STANDALONE_LOW, low - 3)
            if any(port + step in later for later in LATER_BOUND for step in (0, 1, 2)):
                continue
            try:
                sock = _listen(host, port)
            except OSError:
                continue
            if all(_bindable(host, port + step) for step in (1, 2)):
                return sock
            sock.close()
    for _ in range(200):  # no room below that range: the kernel's choice, checked as well as it can be
        sock = _listen(host, 0)
        port = sock.getsockname()[1]
        if port + 2 < 65536 and all(_bindable(host, port + step) for step in (1, 2)):
            return sock
        sock.close()
    return _listen(host, 0)


def _bindable(host: str, port: int) -> bool:
    try:
        _listen(host, port).close()
        return True
    except OSError:
        return False


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``port`` of every address (as TCPStore's server does), IPv6 where it exists."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address, port))
            sock.listen(1024)
            return sock
        except OSError as error:
            sock.close()
            if error.errno == errno.EADDRINUSE:
                raise
            continue
    raise OSError(errno.EADDRNOTAVAIL, f"cannot listen on port {port}")


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine: a name of it, or an address a socket here can bind."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except socket.gaierror:
        return False
    for family, kind, protocol, _, address in infos:
        try:
            with socket.socket(family, kind, protocol) as probe:
                probe.bind((address[0], 0))
                return True
        except OSError:
            continue
    return False


class LaunchStore:
    """The job's store as this launcher sees it: hosted here (node 0, standalone), or a client of node 0's."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.listener: socket.socket | None = None
        self.server: Any = None  # torch's TCPStore hosting the store, once the thread has made it
        self.client: Any = None
        self.ready = threading.Event()

    # ---- meeting ----------------------------------------------------------------------------------------------

    def meet(self) -> Rendezvous:
        """Bind or connect, and learn this node's rank; ``LaunchError`` when the launchers cannot meet."""
        plan = self.plan
        prefix = f"torchras/launch/{plan.run_id}"
        if plan.backend == "static":
            assert plan.node_rank is not None
            if plan.node_rank == 0:
                self._bind(plan.store_port)
                return Rendezvous(plan.store_host, plan.store_port, 0, relaunched=False)
            client = self._connect(plan.store_host, plan.store_port)
            starts = int(client.add(f"{prefix}/node/{plan.node_rank}/starts", 1))
            return Rendezvous(plan.store_host, plan.store_port, plan.node_rank, relaunched=starts > 1)
        # c10d
        if plan.nnodes == 1 and (plan.store_port == 0 or is_local(plan.store_host)):
            port = self._bind(plan.store_port)
            return Rendezvous(this_host(plan), port, 0, relaunched=False)
        if is_local(plan.store_host):
            try:
                self._bind(plan.store_port)
            except LaunchError:
                pass  # another launcher of this host serves it: be a client like the others
        client = self._connect(plan.store_host, plan.store_port)
        rank = int(client.add(f"{prefix}/nodes", 1)) - 1
        if rank >= plan.nnodes:
            raise LaunchError(f"the job {plan.run_id} already has its {plan.nnodes} node(s); this one is one too many")
        return Rendezvous(plan.store_host, plan.store_port, rank, relaunched=False)

    def _bind(self, port: int) -> int:
        try:
            self.listener = _free_base_port("") if port == 0 else _listen("", port)
        except OSError as error:
            raise LaunchError(f"cannot serve the job's store on port {port}: {error.strerror or error}") from error
        bound = int(self.listener.getsockname()[1])
        threading.Thread(target=self._serve, args=(bound,), name="rasd-launch-store", daemon=True).start()
        return bound

    def _serve(self, port: int) -> None:
        """Hand the listening socket to torch's TCPStore (the workers' connections wait in its backlog)."""
        try:
            import torch.distributed as dist

            assert self.listener is not None
            self.server = dist.TCPStore(
                "localhost",
                port,
                None,
                True,
                timeout=datetime.timedelta(seconds=self.plan.join_timeout),
                wait_for_workers=False,
                multi_tenant=True,
                master_listen_fd=self.listener.fileno(),
                use_libuv=True,
            )
        except BaseException as error:  # noqa: BLE001 - logged; the workers' env:// connections then time out
            log.error("could not serve the job's store on port %s: %s", port, error)
        finally:
            self.ready.set()

    def _connect(self, host: str, port: int) -> Any:
        import torch.distributed as dist

        try:
            self.client = dist.TCPStore(
                host,
                port,
                None,
                False,
                timeout=datetime.timedelta(seconds=self.plan.join_timeout),
                wait_for_workers=False,
            )
        except (RuntimeError, OSError) as error:
            raise LaunchError(f"could not reach the job's store on {host}:{port}: {error}") from error
        return self.client

    def renew(self) -> bool:
        """A new, empty store on the same port, for a group that starts again (every worker has ended).

        torch 2.13's env:// init under an agent's store (``TORCHELASTIC_USE_AGENT_STORE``) adds no prefix per
        attempt: it expects a new store for every attempt ("We create a new TCPStore for every retry"), and in the
        old one a restarted group would read the first attempt's gloo addresses and fail (``connectFullMesh``). So
        the launcher that hosts the store replaces it. False (one WARNING; the old store stays) where this launcher
        does not host it, or the port cannot be bound again within ``RENEW_S``."""
        if self.listener is None:
            return False
        self.ready.wait(120)
        port = int(self.listener.getsockname()[1])
        self.server = None  # torch's TCPStore stops its server (no other reference to it is kept)
        try:
            self.listener.close()
        except OSError:
            pass
        self.listener = None
        deadline = time.monotonic() + RENEW_S
        while True:
            try:
                self.listener = _listen("", port)
                break
            except OSError as error:
                if time.monotonic() >= deadline:
                    log.warning("could not serve a new store on port %s (%s): the job has no store now", port, error)
                    return False
                time.sleep(0.1)
        self.ready.clear()
        self._serve(port)  # at once, in this thread: the new group connects right after
        return self.server is not None

    def close(self) -> None:
        """Stop serving (the workers are gone): the TCPStore and the socket it was handed."""
        self.server = None
        self.client = None
        if self.listener is not None:
            try:
                self.listener.close()
            except OSError:
                pass
            self.listener = None
