"""A fake RAS status port for the rascli tests: a threaded TCP server on 127.0.0.1 (a free port) that records
every byte it receives and answers from a ``Script``.

It speaks just enough of the protocol (docs/protocol.md §1-2) to be a faithful peer for the client, and its
script can make it misbehave the ways a real port can: silent, cut off mid-report, stalled mid-report, foreign.
Run as a program (``python rascli_fake_server.py SCRIPT.json``) it serves in its own process, so a test can kill -9 it.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Script:
    #: The whole report a STATUS gets (its first line and its remainder are sent as two chunks, as rasd does); a
    #: DIAGNOSTICS or STACKS gets it too: each is a report, after which the server closes (docs/protocol.md §2).
    report: bytes = b""
    #: Reply to CLIENT PROTOCOL; ``None``: never answer anything.
    handshake: bytes | None = b"SERVER PROTOCOL 2\n"
    #: Sent as soon as a client connects (a foreign service's banner).
    greeting: bytes = b""
    #: Replies for commands, by their upper-cased line, instead of the protocol's own.
    replies: dict[str, bytes] = field(default_factory=dict)
    #: Send only this many bytes of the report, then: "close" the connection, or "stall" (send nothing more).
    cut_at: int | None = None
    cut: str = "close"
    #: Events sent after MONITOR's OK (each one a complete line or object), ``event_gap`` seconds apart.
    events: list[bytes] = field(default_factory=list)
    event_gap: float = 0.0
    #: Close a monitor connection after its events (as a job that ends does).
    close_after_events: bool = True
    #: "connect": close each connection as soon as it is accepted; "reply": close it after the first reply.
    hangup: str = ""
    #: The first this many connections are never answered, as those the kernel gives a stopped job process.
    silent_connections: int = 0


class FakeServer:
    def __init__(self, script: Script, host: str = "127.0.0.1") -> None:
        self.script = script
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, 0), family=family)
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        #: Bytes received, one entry per connection, in order of arrival.
        self.received: list[bytearray] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clients: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    # -- what the client sent ----------------------------------------------------------------------------------
    def lines(self, connection: int = -1) -> list[str]:
        with self._lock:
            data = bytes(self.received[connection]) if self.received else b""
        return data.decode().split("\n")[:-1] if data else []

    # -- serving -----------------------------------------------------------------------------------------------
    def __enter__(self) -> FakeServer:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self.listener.close()
        with self._lock:
            for client in self._clients:
                client.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self.received.append(bytearray())
                index = len(self.received) - 1
                self._clients.append(client)
                self.connections += 1
            thread = threading.Thread(target=self._serve, args=(client, index), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, client: socket.socket, index: int) -> None:
        client.settimeout(0.05)
        buffer = b""
        try:
            if self.script.greeting:
                client.sendall(self.script.greeting)
            if self.script.hangup == "connect":
                return
            while not self._stop.is_set():
                try:
                    data = client.recv(4096)
                except TimeoutError:
                    continue
                if not data:
                    return
                with self._lock:
                    self.received[index] += data
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not self._command(client, line.rstrip(b"\r").decode(), index):
                        return
        except OSError:
            pass
        finally:
            client.close()

    def _command(self, client: socket.socket, line: str, index: int) -> bool:
        """Answer one command; ``False`` when the connection is to end."""
        script, upper = self.script, line.upper()
        if script.handshake is None or index < script.silent_connections:
            return True
        if upper in script.replies:
            client.sendall(script.replies[upper])
            return script.hangup != "reply"
        if upper.startswith("CLIENT PROTOCOL "):
            client.sendall(script.handshake)
        elif upper.startswith("TIMEOUT "):
            ok = re.fullmatch(r"\d*", line[8:]) is not None
            client.sendall(b"OK\n" if ok else f"ERROR: Invalid timeout value {line[8:]}\n".encode())
        elif upper.startswith("SET FORMAT "):
            ok = line[11:].lower() in ("text", "json")
            client.sendall(b"OK\n" if ok else f"ERROR: Invalid format {line[11:]}\n".encode())
        elif upper in ("STATUS", "VERBOSE STATUS", "DIAGNOSTICS", "STACKS") or upper.startswith("STACKS "):
            self._report(client)
            return False
        elif upper == "MONITOR" or upper.startswith("MONITOR "):
            client.sendall(b"OK\n")
            for event in script.events:
                time.sleep(script.event_gap)
                client.sendall(event)
            if script.close_after_events:
                return False
            self._stop.wait()
            return False
        else:
            client.sendall(f"ERROR: Unknown command {line}\n".encode())
        return True

    def _report(self, client: socket.socket) -> None:
        report = self.script.report
        if self.script.cut_at is not None:
            report = report[: self.script.cut_at]
        head, _, rest = report.partition(b"\n")
        client.sendall(head + b"\n" if _ or rest else head)
        if rest:
            time.sleep(0.02)
            client.sendall(rest)
        if self.script.cut_at is not None and self.script.cut == "stall":
            self._stop.wait()


def main() -> None:
    """Serve the script in ``argv[1]`` (JSON: Script's fields, bytes as latin-1 strings); print the port."""
    raw = json.loads(Path(sys.argv[1]).read_text())
    for key in ("report", "handshake", "greeting"):
        if isinstance(raw.get(key), str):
            raw[key] = raw[key].encode("latin-1")
    raw["events"] = [event.encode("latin-1") for event in raw.get("events", [])]
    server = FakeServer(Script(**raw))
    with server:
        print(server.port, flush=True)
        time.sleep(120)  # the test kills this process long before


if __name__ == "__main__":
    main()
