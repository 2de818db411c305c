"""One client of the text port, as a state machine: bytes in, replies and requests out (docs/protocol.md §1-2).

Rules, from NCCL's RAS protocol 2:

* one command per line; ``\\n`` ends a line and a ``\\r`` just before it is dropped, so telnet works;
* a line must fit in 1024 bytes with its newline: a longer one closes the connection, silently;
* keywords, and the arguments of ``SET FORMAT`` and ``MONITOR``, match case-insensitively; spacing is exact;
* accepted commands answer ``OK``, rejected ones a line that starts ``ERROR: ``; the connection stays open;
* ``STATUS`` / ``VERBOSE STATUS`` start a report, after which the connection closes; nothing more is read;
* the client's end of input closes the connection, unless a report is running (``end_of_input``);
* from NCCL 2.31 (reference §9): ``DIAGNOSTICS`` compares every process's configuration, then the connection
  closes; ``CONTROL PROFILER_MASK`` is parsed as NCCL parses it and refused, as the client port never changes
  training state; ``TIMEOUT`` takes a fraction of a second.

The table below is the whole command set; ``feed`` looks a line up in it and runs the handler.

    line (case-insensitive)        reply                      effect
    CLIENT PROTOCOL <anything>     SERVER PROTOCOL 2
    TIMEOUT <seconds>=0..          OK | ERROR: Invalid ...    this client's gather timeout (seconds, unscaled)
    SET FORMAT text|json           OK | ERROR: Invalid ...    format of reports and events
    STATUS | VERBOSE STATUS        (the report)               then the connection ends
    MONITOR [g1,g2,...]            OK | ERROR: Invalid ...    push events of groups lifecycle|trace|all
    DIAGNOSTICS                    (the diagnostics report)   then the connection ends
    CONTROL PROFILER_MASK <mask>   ERROR: ...                 nothing (an invalid mask: NCCL's ERROR line)
    STACKS [ALL] [RANKS <list>]    (the stacks report)        ours: then the connection ends
    anything else                  ERROR: Unknown command <line>
"""

from __future__ import annotations

import enum
import math
import re
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
class StartDiagnostics:
    timeout: float | None  # as StartStatus's
    format: Format


@dataclass(frozen=True)
class StartStacks:
    all_threads: bool
    ranks: frozenset[int] | None  # None: every rank
    timeout: float | None  # as StartStatus's
    format: Format


@dataclass(frozen=True)
class CloseClient:
    reason: str


Output = Reply | StartStatus | StartDiagnostics | StartStacks | CloseClient
#: ``STACKS RANKS`` names at most this many ranks (a range counts its ranks).
MAX_STACK_RANKS = 1 << 20

#: ``CONTROL PROFILER_MASK``'s event names and bits (NCCL's profiler header; reference §9.2).
PROFILER_EVENTS = (
    "group",
    "coll",
    "p2p",
    "proxyop",
    "proxystep",
    "proxyctrl",
    "kernelch",
    "netplugin",
    "groupapi",
    "collapi",
    "p2papi",
    "kernellaunch",
    "cecoll",
    "cesync",
    "cebatch",
)
#: A TIMEOUT value as C's strtod reads a decimal number, with nothing trailing (NCCL 2.31, reference §9.4).
_SECONDS = re.compile(r"[ \t\n\v\f\r]*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _ascii_upper(text: str) -> str:
    """ASCII letters upper-cased, nothing else: C's strcasecmp matches so, where ``str.upper`` would make
    ``ſtatus`` a STATUS."""
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in text)


def profiler_mask(value: str) -> int | None:
    """``CONTROL PROFILER_MASK``'s value as NCCL reads it (reference §9.2), or None when NCCL would refuse it:
    ``none``, ``all``, a number as strtol with base 0 reads it (``0x`` hex, a leading ``0`` octal), or event names
    joined by commas, without blanks."""
    lowered = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in value)  # ASCII only, as _ascii_upper
    if lowered == "none":
        return 0
    if lowered == "all":
        return (1 << len(PROFILER_EVENTS)) - 1
    if value[:1].isdigit():
        digits, base = value, 10
        if lowered.startswith("0x"):
            digits, base = value[2:], 16
        elif value.startswith("0") and len(value) > 1:
            digits, base = value[1:], 8
        valid = "0123456789abcdef"[:base]
        if not digits or any(c not in valid for c in digits.lower()):
            return None
        return int(digits, base)
    mask = 0
    for name in lowered.split(","):
        if name not in PROFILER_EVENTS:
            return None
        mask |= 1 << PROFILER_EVENTS.index(name)
    return mask


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

    def end_of_input(self) -> list[Output]:
        """The client shut down its sending side (``echo monitor | nc`` does once stdin ends).

        As NCCL (rasClientEventLoop: recv() returning 0 terminates the client): a client whose report is running
        is not read, so its EOF goes unseen and the report still goes out (``echo status | nc`` works); any other
        client is closed, a monitoring one included, and a partial line is dropped."""
        if self.reporting or self.closed:
            return []
        self.closed = True
        return [CloseClient("end of input")]

    # ------------------------------------------------------------------------------------------------------------

    def _command(self, line: str) -> list[Output]:
        upper = _ascii_upper(line)
        for prefix, exact, handler in _COMMANDS:
            if (upper == prefix) if exact else upper.startswith(prefix):
                return handler(self, line[len(prefix) :])
        return [Reply(f"ERROR: Unknown command {line}\n")]

    def _client_protocol(self, rest: str) -> list[Output]:
        return [Reply(f"SERVER PROTOCOL {SERVER_PROTOCOL}\n")]

    def _timeout(self, rest: str) -> list[Output]:
        # As NCCL 2.31's strtod with nothing trailing (reference §9.4): leading blanks, a sign, a fraction and an
        # exponent are fine; a negative, infinite or out-of-range value is not; an empty value reads as 0.
        seconds = 0.0
        if rest != "":
            if not rest.isascii() or _SECONDS.fullmatch(rest) is None:
                return [Reply(f"ERROR: Invalid timeout value {rest}\n")]
            seconds = float(rest)
            underflow = seconds == 0 and re.search(r"[1-9]", rest.lower().partition("e")[0]) is not None
            if not math.isfinite(seconds) or seconds < 0 or underflow:  # strtod's ERANGE, both ways
                return [Reply(f"ERROR: Invalid timeout value {rest}\n")]
        self.timeout = float("inf") if seconds == 0 else seconds
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

    def _diagnostics(self, rest: str) -> list[Output]:
        # NCCL answers SET FORMAT json with an ERROR here; ours gives JSON, an addition (docs/protocol.md).
        self.reporting = True
        return [StartDiagnostics(timeout=self.timeout, format=self.format)]

    def _stacks(self, rest: str) -> list[Output]:
        """``STACKS``: the main threads of every rank (ours, docs/protocol.md §2.6); a report, then the end."""
        return self._start_stacks(False, None)

    def _stacks_of(self, rest: str) -> list[Output]:
        """``STACKS ALL``, ``STACKS RANKS <r>[,<r>|<a>-<b>...]``, ``STACKS ALL RANKS ...``."""
        words = rest.split(" ")
        all_threads = _ascii_upper(words[0]) == "ALL"
        words = words[1:] if all_threads else words
        ranks: frozenset[int] | None = None
        if words:
            ranks = _rank_list(words[1]) if len(words) == 2 and _ascii_upper(words[0]) == "RANKS" else None
            if ranks is None:
                return [Reply(f"ERROR: Invalid STACKS arguments '{rest}'\n")]
        return self._start_stacks(all_threads, ranks)

    def _start_stacks(self, all_threads: bool, ranks: frozenset[int] | None) -> list[Output]:
        self.reporting = True
        return [StartStacks(all_threads=all_threads, ranks=ranks, timeout=self.timeout, format=self.format)]

    def _control(self, rest: str) -> list[Output]:
        sub = rest.lstrip(" ")
        if not _ascii_upper(sub).startswith("PROFILER_MASK "):
            return [Reply(f"ERROR: Unknown CONTROL subcommand '{sub}'\n")]
        value = sub[len("PROFILER_MASK ") :].lstrip(" ")
        mask = profiler_mask(value)
        if mask is None:
            return [Reply(f"ERROR: Invalid profiler mask value '{value}'\n")]
        # A valid mask NCCL would broadcast and apply job-wide. Ours never changes training state from the client
        # port, and the profiler mask is NCCL's own (its RAS serves CONTROL at NCCL_RAS_ADDR).
        return [
            Reply(
                f"ERROR: CONTROL PROFILER_MASK {value} (0x{mask:x}) not applied: torchras never changes training "
                "state from its client port; NCCL's own RAS takes it at NCCL_RAS_ADDR\n"
            )
        ]

    def _monitor(self, rest: str) -> list[Output]:
        # As NCCL's parser (client_support.cc, rasClientEventLoop): every blank after MONITOR is skipped, so
        # "MONITOR  trace" is trace; then the groups are split on ',' and empty tokens dropped (strtok_r). Only
        # the leading blanks go: "MONITOR trace, all" is an error for ' all', and a tab is not a blank there.
        mask = Group(0)
        for token in rest.lstrip(" ").split(","):
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
    # NCCL matches "client protocol " with its blank: a bare CLIENT PROTOCOL is an unknown command there too.
    ("CLIENT PROTOCOL ", False, ClientSession._client_protocol),
    ("TIMEOUT ", False, ClientSession._timeout),
    ("SET FORMAT ", False, ClientSession._set_format),
    ("STATUS", True, ClientSession._status),
    ("VERBOSE STATUS", True, ClientSession._verbose_status),
    ("MONITOR", True, ClientSession._monitor),
    ("MONITOR ", False, ClientSession._monitor),
    ("DIAGNOSTICS", True, ClientSession._diagnostics),
    ("CONTROL ", False, ClientSession._control),
    ("STACKS", True, ClientSession._stacks),
    ("STACKS ", False, ClientSession._stacks_of),
]


def _rank_list(text: str) -> frozenset[int] | None:
    """``0,2,5-7`` as a set of ranks, or None when it is not one (or names more than ``MAX_STACK_RANKS``)."""
    ranks: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not first.isdigit() or not first.isascii() or (dash and not (last.isdigit() and last.isascii())):
            return None
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo or len(ranks) + hi - lo + 1 > MAX_STACK_RANKS:
            return None
        ranks.update(range(lo, hi + 1))
    return frozenset(ranks)
