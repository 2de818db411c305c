"""One TCP connection to a RAS status port: connect to every address of the host in turn, send lines, read lines
and chunks, each wait with a deadline.

Every socket failure leaves this module as a ``RasCliError`` that says what happened in the user's terms:
nothing listening, no answer, the connection closed early.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

from .errors import Exit, RasCliError

log = logging.getLogger(__name__)

#: The server's receive buffer: a line longer than this is not from a RAS service.
MAX_LINE = 1024
CHUNK = 65536


def _hint(default_addr: bool) -> str:
    if default_addr:
        return "Is a torchras job running on this node? 'rascli --list' shows the jobs serving here and their ports."
    return (
        "Check the host and port (-h, -p, TORCHRAS_ADDR): they must match the job's TORCHRAS_ADDR. "
        "'rascli --list' shows the jobs serving on this node."
    )


def address(host: str, port: int) -> str:
    """How messages name the port: ``localhost:28028``, ``[::1]:28028``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ConnectTimeout(RasCliError):
    """No address of the host took the connection, and at least one let it time out rather than refuse it: the
    kernel gave it to a listener that drops new connections (a stopped process whose accept queue is full). A
    fresh connection, from another port, is likely to go to another process."""


def _reason(err: OSError) -> str:
    if isinstance(err, (socket.timeout, TimeoutError)):
        return "timed out"
    return err.strerror or str(err) or type(err).__name__


class Connection:
    """A connected socket with a receive buffer. ``where`` names the peer in messages (``localhost:28028``)."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self.where = where

    @classmethod
    def open(cls, host: str, port: int, timeout: float, default_addr: bool) -> Connection:
        """Try every address of ``host`` in order (localhost may be 127.0.0.1, ::1 or both)."""
        where = address(host, port)
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except socket.gaierror as err:
            raise RasCliError(f"cannot resolve '{host}': {err.strerror}", Exit.NO_CONNECTION) from None
        except UnicodeError:
            raise RasCliError(f"cannot resolve '{host}': not a valid host name", Exit.NO_CONNECTION) from None
        failures = []
        timed_out = False
        for family, kind, proto, _, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(timeout)
            try:
                sock.connect(sockaddr)
            except OSError as err:
                sock.close()
                timed_out = timed_out or isinstance(err, TimeoutError)
                failures.append(f"{sockaddr[0]}: {_reason(err)}")
                log.debug("connecting to %s port %d: %s", sockaddr[0], port, err)
                continue
            log.debug("connected to %s port %d", sockaddr[0], port)
            return cls(sock, where)
        error = ConnectTimeout if timed_out else RasCliError
        raise error(
            f"cannot connect to the RAS status port at {where} ({'; '.join(failures)}).\n{_hint(default_addr)}",
            Exit.NO_CONNECTION,
        )

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_line(self, line: str) -> None:
        try:
            self._sock.settimeout(5.0)
            self._sock.sendall(line.encode() + b"\n")
        except OSError as err:
            raise RasCliError(
                f"the connection to {self.where} broke while sending '{line}': {_reason(err)}", Exit.CONNECTION_LOST
            ) from None

    def _recv(self, timeout: float | None) -> bytes:
        """One recv; ``b""`` at EOF. Raises ``socket.timeout`` (for the caller to word) or ``RasCliError``."""
        self._sock.settimeout(timeout)
        try:
            return self._sock.recv(CHUNK)
        except TimeoutError:
            raise
        except OSError as err:
            raise RasCliError(f"the connection to {self.where} broke: {_reason(err)}", Exit.CONNECTION_LOST) from None

    def read_line(self, timeout: float) -> str | None:
        """The next line without its newline (and ``\\r``), ``None`` at EOF before a newline.

        Raises ``socket.timeout`` when nothing completes a line within ``timeout``, and ``RasCliError`` for a
        line longer than a RAS server would ever send.
        """
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                raise RasCliError(
                    f"the service at {self.where} is not a RAS service: it answered {show_bytes(bytes(self._buffer))}",
                    Exit.PROTOCOL,
                )
            data = self._recv(timeout)
            if not data:
                return None
            self._buffer += data
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line.rstrip(b"\r").decode("utf-8", "replace")

    def take_buffered(self) -> bytes:
        data, self._buffer = bytes(self._buffer), bytearray()
        return data

    def chunks(self, timeout: float | None) -> Iterator[bytes]:
        """Everything that arrives until EOF, the buffered bytes first; ``timeout`` bounds each wait.

        Raises ``socket.timeout`` when the connection stays silent for ``timeout`` seconds.
        """
        if self._buffer:
            yield self.take_buffered()
        while True:
            data = self._recv(timeout)
            if not data:
                return
            yield data


def show_bytes(data: bytes, limit: int = 60) -> str:
    text = data.decode("utf-8", "replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")
