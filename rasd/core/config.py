"""The mesh's timers, all scaled by one factor (``TORCHRAS_TIMEOUT_FACTOR``, like ``NCCL_RAS_TIMEOUT_FACTOR``).

The ladder of a link, from NCCL (docs/architecture.md §2.5): a keepalive every second on an idle link; 5 s of
silence and the peer is UNRESPONSIVE (routed around, skipped by gathers); 20 s and the socket is reset; 60 s and
the peer is DEAD.
Ours on top: a peer silent for the hang limit is HUNG (a verdict for ``inprocess``), and a peer whose connection
closed and whose reconnect is refused, or whose pid vanished on this host, is DEAD at once (``fast_death``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Timers:
    keepalive: float = 1.0
    unresponsive: float = 5.0
    reset: float = 20.0
    dead: float = 60.0
    hang: float = 10.0
    connect_retry: float = 1.0
    connect_warn: float = 5.0  # the higher-address side waits this long for the lower side to connect first
    handshake: float = 5.0  # a connection that has not authenticated and said hello by then is dropped
    idle: float = 60.0  # a connection no link uses is closed after this long
    leg_timeout: float = 5.0  # the default collective timeout of a status gather (clients may set their own)
    gather_extra: float = 5.0  # hard limit of a gather: timeout + this
    in_flight: float = 2.0  # launch counts one operation apart for less than this are in flight, not a MISMATCH
    #: A communicator whose counters disagree and have not moved this long, with a rank behind idle as long, is
    #: COMM_STUCK (stuck.py); the floor of the limit each communicator learns from its own cadence.
    stuck: float = 4.0
    stuck_max: float = 60.0  # the learned limit never goes past this
    busy: float = 300.0  # ranks behind that are working (a checkpoint, an evaluation) are SLOW until this long
    sweep: float = 5.0  # how often the sweeper gathers every process's counters to look for stuck communicators
    tick: float = 0.25  # how often the runtime calls ``Node.tick``
    fast_death: bool = True

    def scaled(self, factor: float) -> Timers:
        if factor <= 0:
            raise ValueError(f"timeout factor must be positive, got {factor}")
        return replace(
            self,
            keepalive=self.keepalive * factor,
            unresponsive=self.unresponsive * factor,
            reset=self.reset * factor,
            dead=self.dead * factor,
            hang=self.hang * factor,
            connect_retry=self.connect_retry * factor,
            connect_warn=self.connect_warn * factor,
            handshake=self.handshake * factor,
            idle=self.idle * factor,
            leg_timeout=self.leg_timeout * factor,
            gather_extra=self.gather_extra * factor,
            stuck=self.stuck * factor,
            stuck_max=self.stuck_max * factor,
            busy=self.busy * factor,
            sweep=self.sweep * factor,
            in_flight=self.in_flight * factor,
            tick=min(self.tick, self.keepalive * factor / 4),
        )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, warn: Callable[[str], None] = lambda problem: None
    ) -> Timers:
        """``TORCHRAS_TIMEOUT_FACTOR`` (a number, at least ``MIN_FACTOR``, default 1), ``TORCHRAS_HANG_LIMIT``,
        ``TORCHRAS_STUCK_LIMIT``, ``TORCHRAS_STUCK_LIMIT_MAX`` and ``TORCHRAS_BUSY_LIMIT`` (positive seconds before
        scaling), ``TORCHRAS_FAST_DEATH`` (a switch: 0 turns the at-once death rule off).

        Never raises: the environment belongs to the user's job, and a typo in it must not end training
        (docs/operations.md §1). A value that cannot be used is passed to ``warn`` as one sentence that says what
        was wrong and what is used instead (its default), and the rest of the settings still apply."""
        base = cls()
        base = replace(
            base,
            hang=read_seconds(environ, "TORCHRAS_HANG_LIMIT", base.hang, warn),
            stuck=read_seconds(environ, "TORCHRAS_STUCK_LIMIT", base.stuck, warn),
            stuck_max=read_seconds(environ, "TORCHRAS_STUCK_LIMIT_MAX", base.stuck_max, warn),
            busy=read_seconds(environ, "TORCHRAS_BUSY_LIMIT", base.busy, warn),
            fast_death=read_switch(environ, "TORCHRAS_FAST_DEATH", base.fast_death, warn),
        )
        return base.scaled(read_number(environ, "TORCHRAS_TIMEOUT_FACTOR", 1.0, warn, minimum=MIN_FACTOR))


#: The smallest timeout factor: a keepalive every 10 ms and a tick every 2.5 ms. Below it the RAS thread would
#: spin and take the CPU from training.
MIN_FACTOR = 0.01
SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("0", "false", "no", "off")


def read_switch(environ: Mapping[str, str], name: str, default: bool, warn: Callable[[str], None]) -> bool:
    """A yes/no setting: 1/true/yes/on or 0/false/no/off (any case, spaces ignored); unset or empty is
    ``default``, anything else is ``default`` after a ``warn``."""
    text = environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in SWITCH_ON:
        return True
    if text in SWITCH_OFF:
        return False
    warn(
        f"{name}={environ[name]!r} is not a switch (1/true/yes/on or 0/false/no/off); "
        f"using the default, {'on' if default else 'off'}"
    )
    return default


def read_number(
    environ: Mapping[str, str],
    name: str,
    default: float,
    warn: Callable[[str], None],
    minimum: float = 0.0,
    allow_minimum: bool = True,
) -> float:
    """A finite number of at least ``minimum`` (more than it when not ``allow_minimum``); unset or empty is
    ``default``, anything else is ``default`` after a ``warn``."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and (value > minimum or (allow_minimum and value == minimum)):
        return value
    bound = f"at least {minimum:g}" if allow_minimum else f"more than {minimum:g}"
    warn(f"{name}={environ[name]!r} is not a number {bound}; using the default, {default:g}")
    return default


def read_seconds(environ: Mapping[str, str], name: str, default: float, warn: Callable[[str], None]) -> float:
    """A positive, finite duration in seconds (see ``read_number``)."""
    return read_number(environ, name, default, warn, minimum=0.0, allow_minimum=False)
