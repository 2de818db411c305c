"""The Wrapper's store server on one host: torch's TCPStore server in a small process of its own.

Why a process of its own (docs/inprocess.md, "Where the store lives"). In nvidia-resiliency-ext the store server
lives inside initial rank 0's training process, so kill -9, a hang or an exception of rank 0 ends the job. Here
no training process hosts it: the first Wrapper on the host of ``MASTER_ADDR`` *binds* the store's port (binding
is the mutex: whoever binds first starts the server, everybody else finds the port taken and is a client) and
hands the listening socket to a detached server process, a fresh interpreter that runs no user code. Every rank,
the one that started it included, is a client; clients that connect before the server has imported torch wait
in the socket's backlog, so nobody polls for it.

Life of the server. It is detached (its own session, reparented to init by a double fork), so it outlives the
trainer that started it and ignores the terminal's Ctrl-C. It ends itself once no client has been connected for
``linger`` seconds (default 10 s, ``INPROCESS_STORE_LINGER``): the job is over, or between two wrapped calls
that are further apart than that (the next call then starts a new server). It ends at once on SIGTERM.

Consecutive calls of a wrapped function share the server: ``inprocess.store.open_base_store`` gives every call
a namespace of its own, so they never mix.

Start-up hand-shake: the trainer passes the write end of a pipe; the server writes ``ready <pid>`` once it
serves, or ``error <text>`` if it cannot, so a broken installation is reported at once rather than after the
clients' connection timeout.

The trainer side (``serve``) imports only the standard library; the server side imports torch (the TCPStore
server needs it: about 2 s of CPU and 200 MB, once per host and job).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as a script: keep this package's folder off sys.path (its module names are generic)
    import os as _os
    import sys as _sys

    if _sys.path and _os.path.abspath(_sys.path[0]) == _os.path.dirname(_os.path.abspath(__file__)):
        _sys.path.pop(0)

import argparse
import errno
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time

from torchras_formats import ports

log = logging.getLogger("inprocess.store_server")

DEFAULT_LINGER = 10.0
LINGER_ENVIRONMENT = "INPROCESS_STORE_LINGER"
LOG_ENVIRONMENT = "INPROCESS_STORE_SERVER_LOG"
SERVER_KEY = "_inprocess_store_server"  # "<pid> <host>:<port>", written by the server when it serves
_CHECK_INTERVAL = 0.5
STARTUP_TIMEOUT = 120.0
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ServerStartError(RuntimeError):
    """The store server process could not start serving."""


# ==== trainer side ==============================================================================================


def _listening_socket(host: str, port: int) -> tuple[socket.socket | None, bool]:
    """A socket listening on (host, port), or None when the port is taken here or the address is not ours; and
    whether the port was found taken here."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return None, False
    taken = False
    for family, kind, protocol, _, address in infos:
        sock = socket.socket(family, kind, protocol)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of an earlier server is fine
            sock.bind(address)
            sock.listen(1024)
            return sock, False
        except OSError as error:
            sock.close()
            if error.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                taken = taken or error.errno == errno.EADDRINUSE
                continue
            raise
    return None, taken


#: How long a port taken here must refuse connections before nobody is taken to serve it. A server of this job
#: listens from the moment it binds (``_listening_socket`` binds and listens at once, before the server process
#: starts): refusals for this long mean a socket that serves nothing holds the port.
REFUSED_FOR = 1.0


def nobody_serves(host: str, port: int) -> bool:
    """Whether (host, port), a port taken on this host, refuses every connection for ``REFUSED_FOR`` seconds: held
    by a socket that does not listen (most often another program's outgoing connection, on a port of the range the
    kernel hands out to them), so that no store server of this job will ever answer there."""
    deadline = time.monotonic() + REFUSED_FOR
    while True:
        try:
            with socket.create_connection((host, port), timeout=REFUSED_FOR):
                return False
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.1)
        except OSError:  # anything else (a timeout, an unreachable address): not a proof that nobody serves
            return False


def serve(host: str, port: int, timeout: float, linger: float | None = None) -> tuple[int, int] | None:
    """Start the store server on (host, port) if nobody serves there yet: (its pid, its port), or None.

    None means the port is taken (a server of this job is there, or, for a client to find out, something else)
    or the address belongs to another host. Port 0 picks a free port. Raises ``ServerStartError`` if the server
    could not start.
    """
    listener, taken = _listening_socket(host, port)
    if listener is None:
        if taken and nobody_serves(host, port):
            raise ServerStartError(
                f"port {port} of {host}, the Wrapper's store, is held by a socket that serves nothing (another "
                f"program's connection, most likely: ports from {ports.ephemeral_low()} up are handed to outgoing "
                "connections); give the store a free port below that range (MASTER_PORT, or the store's port)"
            )
        return None
    port = listener.getsockname()[1]
    read_end, write_end = os.pipe()
    linger = float(os.environ.get(LINGER_ENVIRONMENT, DEFAULT_LINGER) if linger is None else linger)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    log_path = os.environ.get(LOG_ENVIRONMENT)
    log_file = open(log_path, "a") if log_path else None  # noqa: SIM115 - closed below, once the child holds its copy
    try:
        launcher = subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--fd",
                str(listener.fileno()),
                "--ready-fd",
                str(write_end),
                "--host",
                host,
                "--port",
                str(port),
                "--linger",
                repr(linger),
            ],
            pass_fds=[listener.fileno(), write_end],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file if log_file is not None else subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    finally:
        os.close(write_end)
        listener.close()  # the server holds the listening socket now
        if log_file is not None:
            log_file.close()
    # Importing torch takes seconds on a busy host: never give up on the server sooner than STARTUP_TIMEOUT.
    timeout = max(timeout, STARTUP_TIMEOUT)
    try:
        launcher.wait(timeout)  # the launcher forks the server and exits at once
        answer = _read_line(read_end, timeout)
    except subprocess.TimeoutExpired:
        answer = ""
    finally:
        os.close(read_end)
    if answer.startswith("ready "):
        pid = int(answer.split()[1])
        log.info("started the wrapper's store server on %s:%s (pid %s)", host, port, pid)
        return pid, port
    raise ServerStartError(
        f"the store server on {host}:{port} did not start: {answer or 'no answer'} "
        f"(set {LOG_ENVIRONMENT}=<file> to keep its output)"
    )


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


# ==== server side ===============================================================================================


def external_clients(port: int) -> int:
    """Connections to the server from processes other than this one (the server's own client excluded)."""
    import psutil

    served = own = 0
    for connection in psutil.Process().net_connections("tcp"):
        if connection.status != psutil.CONN_ESTABLISHED or not connection.raddr:
            continue
        if connection.laddr.port == port:
            served += 1
        elif connection.raddr.port == port:
            own += 1
    return served - own


def run_server(listen_fd: int, ready_fd: int, host: str, port: int, linger: float) -> int:
    ready = os.fdopen(ready_fd, "w", buffering=1)
    try:
        import datetime

        import torch.distributed

        server = torch.distributed.TCPStore(
            host,
            port,
            None,
            True,
            timeout=datetime.timedelta(seconds=60),
            wait_for_workers=False,
            master_listen_fd=listen_fd,
            use_libuv=True,
        )
        server.set(SERVER_KEY, f"{os.getpid()} {host}:{port}")
    except Exception as error:  # noqa: BLE001 - reported to the trainer that started us
        ready.write(f"error {error!r}\n")
        return 1
    ready.write(f"ready {os.getpid()}\n")
    ready.close()
    log.info("serving on %s:%s", host, port)
    idle_since: float | None = None
    clients = 0
    while True:
        time.sleep(_CHECK_INTERVAL)
        now = time.monotonic()
        count = external_clients(port)
        if count != clients:  # what a server that outlived its job was waiting for (INPROCESS_STORE_SERVER_LOG)
            log.info("%d client connection(s)", count)
            clients = count
        if count > 0:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= linger:
            log.info("no client for %.1f s: the job is over, stopping", linger)
            return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--linger", type=float, default=DEFAULT_LINGER)
    args = parser.parse_args(argv[1:])
    # Double fork, before any thread exists: the launcher exits at once, the server is reparented to init and
    # outlives the trainer that started it.
    if os.fork() > 0:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is the trainers' business
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s store-server[{os.getpid()}] %(message)s")
    return run_server(args.fd, args.ready_fd, args.host, args.port, args.linger)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
