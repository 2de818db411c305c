"""rasd: the RAS node that runs inside every process of a torchras job (see rasd.api)."""

from rasd.api import on_event, runtime, start, stop, subscribe
from rasd.core.events import Event, Kind

__version__ = "0.1.0"

__all__ = ["Event", "Kind", "on_event", "runtime", "start", "stop", "subscribe", "__version__"]
