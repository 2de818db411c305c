"""One client of the text port, as a state machine: bytes in, replies and requests out (docs/protocol.md §1-2).

Rules, from NCCL's RAS protocol 2:

* one command per line; ``\\n`` ends a line and a ``\\r`` just before it is dropped, so telnet works;
* a line must fit in 1024 bytes with its newline: a longer one closes the connection, silently;
* keywords, and the arguments of ``SET FORMAT`` and ``MONITOR``, match case-insensitively; spacing is exact;
* accepted commands answer ``OK``, rejected ones a line that starts ``ERROR: ``; the connection stays open;
* ``STATUS`` / ``VERBOSE STATUS`` start a report, after which the connection closes; nothing more is read.

The table below is the whole command set; ``feed`` looks a line up in it and runs the handler.

    line (case-insensitive)        reply                      effect
    CLIENT PROTOCOL <anything>     SERVER PROTOCOL 2
    TIMEOUT <int>=0..              OK | ERROR: Invalid ...    this client's gather timeout (seconds, unscaled)
    SET FORMAT text|json           OK | ERROR: Invalid ...    format of reports and events
    STATUS | VERBOSE STATUS        (the report)               then the connection ends
    MONITOR [g1,g2,...]            OK | ERROR: Invalid ...    push events of groups lifecycle|trace|all
    anything else                  ERROR: Unknown command <line>
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from .events import Group

LINE_LIMIT = 1024
SERVER_PROTOCOL = 2
GROUP_NAMES = {"lifecycle": Group.LIFECYCLE, "trace": Group.TRACE, "all": Group.ALL}


class Format(enum.Enum):
    TEXT = "text"
    JSON = "json"


@dataclass(frozen=True)
class Reply:
    text: str


@dataclass(frozen=True)
class StartStatus:
    verbose: bool
    timeout: float | None  # seconds; None: the node's default; float('inf'): no collective timeout
    format: Format


@dataclass(frozen=True)
class CloseClient:
    reason: str


Output = Reply | StartStatus | CloseClient


class ClientSession:
    def __init__(self) -> None:
        self._buf = bytearray()
        self.timeout: float | None = None
        self.format = Format.TEXT
        self.monitor: Group = Group(0)
        self.reporting = False
        self.closed = False

    @property
    def monitoring(self) -> bool:
        """Whether events should be pushed to this client now."""
        return bool(self.monitor) and not self.reporting and not self.closed

    def feed(self, data: bytes) -> list[Output]:
        out: list[Output] = []
        if self.closed or self.reporting:
            return out
        self._buf += data
        while not self.reporting and not self.closed:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) >= LINE_LIMIT:
                    self.closed = True
                    out.append(CloseClient("excessively long input line"))
                break
            if nl + 1 > LINE_LIMIT:
                self.closed = True
                out.append(CloseClient("excessively long input line"))
                break
            raw = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            out.extend(self._command(raw.decode("utf-8", errors="replace")))
        return out

    # ------------------------------------------------------------------------------------------------------------

    def _command(self, line: str) -> list[Output]:
        upper = line.upper()
        for prefix, exact, handler in _COMMANDS:
            if (upper == prefix) if exact else upper.startswith(prefix):
                return handler(self, line[len(prefix) :])
        return [Reply(f"ERROR: Unknown command {line}\n")]

    def _client_protocol(self, rest: str) -> list[Output]:
        return [Reply(f"SERVER PROTOCOL {SERVER_PROTOCOL}\n")]

    def _timeout(self, rest: str) -> list[Output]:
        # As C's strtol with nothing trailing: leading blanks and a '+' are fine, an empty value reads as 0.
        digits = rest.lstrip(" \t")
        digits = digits[1:] if digits.startswith("+") else digits
        if rest == "":
            seconds = 0
        elif digits.isascii() and digits.isdigit() and len(digits) <= 18:
            seconds = int(digits)  # at most 18 digits: strtol's range (ERANGE beyond it), and a float holds it
        else:
            return [Reply(f"ERROR: Invalid timeout value {rest}\n")]
        self.timeout = float("inf") if seconds == 0 else float(seconds)
        return [Reply("OK\n")]

    def _set_format(self, rest: str) -> list[Output]:
        try:
            self.format = Format(rest.lower())
        except ValueError:
            return [Reply(f"ERROR: Invalid format {rest}\n")]
        return [Reply("OK\n")]

    def _status(self, rest: str) -> list[Output]:
        return self._start_status(verbose=False)

    def _verbose_status(self, rest: str) -> list[Output]:
        return self._start_status(verbose=True)

    def _start_status(self, verbose: bool) -> list[Output]:
        self.reporting = True
        return [StartStatus(verbose=verbose, timeout=self.timeout, format=self.format)]

    def _monitor(self, rest: str) -> list[Output]:
        if rest and not rest.startswith(" "):
            return [Reply(f"ERROR: Unknown command MONITOR{rest}\n")]
        mask = Group(0)
        for token in rest[1:].split(","):
            if not token:
                continue
            group = GROUP_NAMES.get(token.lower())
            if group is None:
                return [Reply(f"ERROR: Invalid event group '{token}'\n")]
            mask |= group
        self.monitor = mask or Group.LIFECYCLE
        return [Reply("OK\n")]


# Order matters: exact matches before prefixes that contain them.
_COMMANDS: list[tuple[str, bool, Callable[[ClientSession, str], list[Output]]]] = [
    ("CLIENT PROTOCOL", True, ClientSession._client_protocol),
    ("CLIENT PROTOCOL ", False, ClientSession._client_protocol),
    ("TIMEOUT ", False, ClientSession._timeout),
    ("SET FORMAT ", False, ClientSession._set_format),
    ("STATUS", True, ClientSession._status),
    ("VERBOSE STATUS", True, ClientSession._verbose_status),
    ("MONITOR", False, ClientSession._monitor),
]
