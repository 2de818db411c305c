"""Helpers for the rascli tests: the fake server, the sample reports, and running rascli in-process or as a
real process, always with deadlines."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from rascli.main import run
from rascli.output import Streams
from rascli.protocol import Timeouts
from rascli_fake_server import FakeServer

HERE = Path(__file__).parent
REPO = HERE.parent.parent
REPORTS = HERE / "reports"
#: Short waits, for the tests of a silent or stalled server (the behaviour is the same as with the defaults).
FAST = Timeouts(connect=2.0, reply=0.5, retry_for=1.0, report_extra=0.5)
#: Generous waits for every other test, so that a loaded machine never fails them.
PATIENT = Timeouts(connect=10.0, reply=10.0, retry_for=20.0, report_extra=10.0)


def sample(name: str) -> bytes:
    return (REPORTS / name).read_bytes()


@dataclass
class Result:
    code: int
    out: bytes
    err: str
    #: What a terminal would show (plain text), when run with ``tty=True``.
    screen: str = ""
    console: Console | None = None


def make_console(width: int = 100) -> Console:
    return Console(
        file=io.StringIO(), width=width, record=True, force_terminal=True, color_system="truecolor", highlight=False
    )


def run_cli(
    argv: list[str],
    *,
    tty: bool = False,
    width: int = 100,
    environ: dict[str, str] | None = None,
    timeouts: Timeouts = PATIENT,
) -> Result:
    out, err = io.BytesIO(), io.StringIO()
    console = make_console(width) if tty else None
    code = run(argv, Streams(out, err, console), environ or {}, timeouts)
    screen = console.export_text(clear=False, styles=False) if console else ""
    return Result(int(code), out.getvalue(), err.getvalue(), screen, console)


def addr(server: FakeServer) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(server.port)]


def closed_port() -> int:
    """A port that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def rascli_process(argv: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """rascli as a user runs it, in a pipe. The caller bounds every wait on it; whatever happens, it is killed
    at the end of the block (so a failing test never leaves it running or waits on it forever)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("TORCHRAS_ADDR", "NO_COLOR")}
    environment.update(env or {})
    environment["PYTHONPATH"] = str(REPO) + os.pathsep + environment.get("PYTHONPATH", "")
    # Ctrl+C reaches rascli as it does from a terminal even when the suite itself was started in the background,
    # where the shell sets SIGINT to ignored and every child would inherit that.
    process = subprocess.Popen(
        [sys.executable, "-m", "rascli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
        cwd=REPO,
        preexec_fn=_default_sigint,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def finish(process: subprocess.Popen, timeout: float = 15.0) -> tuple[bytes, bytes]:
    """Wait (bounded) for a process to end; returns its stdout and stderr."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"the process did not end within {timeout} s: {err.decode(errors='replace')}") from None


def rascli_run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    with rascli_process(argv, env) as process:
        out, err = finish(process, timeout)
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def read_until(stream: object, needle: bytes, deadline: float = 15.0) -> bytes:
    """Read a subprocess pipe until ``needle`` has arrived (or EOF, or the deadline); returns what was read."""
    import select
    import time

    fd = stream.fileno()  # type: ignore[attr-defined]
    data = b""
    end = time.monotonic() + deadline
    while needle not in data and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def fake_server_process(tmp_path: Path, **script: object) -> tuple[subprocess.Popen, int]:
    """The fake server in a process of its own, so that a test can kill -9 it; returns it and its port."""
    import json

    for key, value in list(script.items()):
        if isinstance(value, bytes):
            script[key] = value.decode("latin-1")
        elif key == "events":
            script[key] = [event.decode("latin-1") for event in value]  # type: ignore[union-attr]
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    process = subprocess.Popen(
        [sys.executable, str(HERE / "rascli_fake_server.py"), str(path)], stdout=subprocess.PIPE, cwd=HERE
    )
    line = read_until(process.stdout, b"\n", deadline=15.0)
    if not line.strip().isdigit():
        process.kill()
        process.wait(5)
        raise AssertionError(f"the fake server did not start: {line!r}")
    return process, int(line)


class RecordingProxy:
    """A TCP relay in front of a real server that records both directions of every connection, so a test sees
    the exact bytes rascli sent and the exact bytes the server answered."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        import socket
        import threading

        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        #: (client -> server, server -> client) per connection.
        self.sent: list[bytearray] = []
        self.answered: list[bytearray] = []
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            server = socket.create_connection(self.upstream, timeout=5)
            self._sockets += [client, server]
            sent, answered = bytearray(), bytearray()
            self.sent.append(sent)
            self.answered.append(answered)
            for source, sink, record in ((client, server, sent), (server, client, answered)):
                thread = threading.Thread(target=self._pump, args=(source, sink, record), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, source: object, sink: object, record: bytearray) -> None:
        import socket

        source.settimeout(0.05)  # type: ignore[attr-defined]
        try:
            while not self._stop.is_set():
                try:
                    data = source.recv(65536)  # type: ignore[attr-defined]
                except TimeoutError:
                    continue
                if not data:
                    break
                record += data
                sink.sendall(data)  # type: ignore[attr-defined]
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)  # type: ignore[attr-defined]

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self.listener.close()
        for sock in self._sockets:
            sock.close()
