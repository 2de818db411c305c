"""The mesh's timers, all scaled by one factor (``TORCHRAS_TIMEOUT_FACTOR``, like ``NCCL_RAS_TIMEOUT_FACTOR``).

The ladder of a link, from NCCL (reference 3.4): a keepalive every second on an idle link; 5 s of silence and the
peer is UNRESPONSIVE (routed around, skipped by gathers); 20 s and the socket is reset; 60 s and the peer is DEAD.
Ours on top: a peer silent for the hang limit is HUNG (a verdict for ``inprocess``), and a peer whose connection
closed and whose reconnect is refused, or whose pid vanished on this host, is DEAD at once (``fast_death``).
"""

from __future__ import annotations

import os
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
    stuck: float = 20.0  # a communicator whose counters disagree and have not moved this long is COMM_STUCK
    sweep: float = 5.0  # how often the sweeper gathers every process's counters to look for stuck communicators
    tick: float = 0.25  # how often the runtime calls ``Node.tick``
    fast_death: bool = True

    def scaled(self, factor: float) -> "Timers":
        if factor <= 0:
            raise ValueError(f"timeout factor must be positive, got {factor}")
        return replace(
            self,
            keepalive=self.keepalive * factor, unresponsive=self.unresponsive * factor, reset=self.reset * factor,
            dead=self.dead * factor, hang=self.hang * factor, connect_retry=self.connect_retry * factor,
            connect_warn=self.connect_warn * factor, handshake=self.handshake * factor, idle=self.idle * factor,
            leg_timeout=self.leg_timeout * factor, gather_extra=self.gather_extra * factor,
            stuck=self.stuck * factor, sweep=self.sweep * factor, in_flight=self.in_flight * factor,
            tick=min(self.tick, self.keepalive * factor / 4),
        )

    @classmethod
    def from_env(cls, environ: "os._Environ[str] | dict[str, str]" = os.environ) -> "Timers":
        """``TORCHRAS_TIMEOUT_FACTOR`` (float, default 1), ``TORCHRAS_HANG_LIMIT`` and ``TORCHRAS_STUCK_LIMIT``
        (seconds before scaling), ``TORCHRAS_FAST_DEATH`` (0 turns the at-once death rule off)."""
        base = cls()
        hang = environ.get("TORCHRAS_HANG_LIMIT")
        if hang:
            base = replace(base, hang=float(hang))
        stuck = environ.get("TORCHRAS_STUCK_LIMIT")
        if stuck:
            base = replace(base, stuck=float(stuck))
        fast = environ.get("TORCHRAS_FAST_DEATH", "1").strip().lower() not in ("0", "false", "no", "off")
        base = replace(base, fast_death=fast)
        return base.scaled(float(environ.get("TORCHRAS_TIMEOUT_FACTOR", "1") or "1"))
