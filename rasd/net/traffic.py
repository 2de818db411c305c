"""The carrier's traffic hooks: what the runtime tells a service that counts the mesh's traffic (the metrics,
``rasd.services.metrics``), without knowing the service. The runtime calls them on the RAS thread, and only while a
service has set ``Runtime.metrics``; the frame counting lives here because it reads the mesh's framing (a ``u32``
length, then that many bytes), which is the carrier's."""

from __future__ import annotations

from typing import Protocol


class TrafficHooks(Protocol):
    """What a traffic-counting service offers the runtime (and the client port, for its STATUS timings). Every call
    is on the RAS thread and must not block."""

    def sent(self, data: bytes) -> None:
        """``data`` (whole frames) went out on a mesh connection."""

    def received(self, frames: FrameCounter, data: bytes) -> None:
        """``data`` came in on the mesh connection whose stream ``frames`` counts."""

    def gather_done(self, seconds: float) -> None:
        """A gather ended, ``seconds`` after it began."""

    def status_done(self, seconds: float) -> None:
        """A client's STATUS was answered, ``seconds`` after it was asked."""


def count_frames(data: bytes) -> int:
    """Frames in ``data``, which holds whole frames (a ``Send``): ``u32 length`` then that many bytes, repeated."""
    frames = i = 0
    n = len(data)
    while i + 4 <= n:
        i += 4 + int.from_bytes(data[i : i + 4], "big")
        frames += 1
    return frames


class FrameCounter:
    """Counts the frames of one connection's incoming byte stream, which arrives in arbitrary pieces."""

    __slots__ = ("_head", "_need")

    def __init__(self) -> None:
        self._need = 0
        self._head = b""

    def feed(self, data: bytes) -> int:
        frames = i = 0
        n = len(data)
        while i < n:
            if self._need:
                take = min(self._need, n - i)
                self._need -= take
                i += take
                continue
            chunk = data[i : i + 4 - len(self._head)]
            i += len(chunk)
            self._head += chunk
            if len(self._head) == 4:
                self._need = int.from_bytes(self._head, "big")
                self._head = b""
                frames += 1
        return frames
