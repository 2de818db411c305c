"""MONITOR mode: one event as the text line or the JSON object a monitoring client receives (docs/protocol.md §5).

Text: ``[<time>] <EVENT>: <peer> <details>\\n``, where ``<peer>`` is NCCL's process description when the process
is known, ``IP<port>`` when only its address is, and absent (with its blank) when the event has no peer. The blank
before an empty ``<details>`` is kept, as NCCL sends it. A line break inside the details would split the event in
two on the wire, so line breaks are sent as blanks.

JSON: NCCL's pretty object, with strings escaped so it always parses. Our additions: ``hostname`` and
``incarnation`` in ``peer`` (a consumer tells a stale verdict by its incarnation), and for communicator verdicts
(COMM_STUCK, COMM_RECOVERED, or any event carrying a communicator hash) ``comm_hash`` and ``ranks``
after ``details``; for RESTART ``iteration``, ``restarts_count``, ``cause``, ``terminated_ranks`` and
``seconds_lost`` after ``details``; ``positions`` last, where an event carries them (a COMM_STUCK's ranks behind, a
PEER_HUNG's last position seen: ``[{"rank", "frames": [{"file", "line", "function"}]}]``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from rasd.core.events import Event, Group, Kind
from rasd.core.frames import position_text
from rasd.core.peers import Addr, PeerInfo

from .model import HASH_MASK
from .timestamps import format_timestamp

_COMM_VERDICTS = frozenset({Kind.COMM_STUCK, Kind.COMM_RECOVERED})


def _event_peer(event: Event, peers: Mapping[Addr, PeerInfo] | None) -> PeerInfo | None:
    if event.peer is not None:
        return event.peer
    if event.addr is not None and peers is not None:
        return peers.get(event.addr)
    return None


def _kind_text(event: Event) -> str:
    return event.kind.value if isinstance(event.kind, Kind) else str(event.kind)


def _one_line(text: str) -> str:
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def format_event_text(event: Event, *, wall_time: float, peers: Mapping[Addr, PeerInfo] | None = None) -> str:
    """The text line of an event; ``peers`` resolves an event that carries only an address."""
    peer = _event_peer(event, peers)
    if peer is not None:
        who = peer.describe()
    elif event.addr is not None:
        who = str(event.addr)
    else:
        who = ""
    subject = f"{who} " if who else ""
    return _one_line(f"[{format_timestamp(wall_time)}] {_kind_text(event)}: {subject}{_details(event)}") + "\n"


def _details(event: Event) -> str:
    """The event's details; a PEER_HUNG adds where the hung process was last seen (a COMM_STUCK's details already
    say where each rank behind is)."""
    if event.kind is Kind.PEER_HUNG and event.positions:
        seen = "; ".join(position_text(frames, short=True) for _, frames in event.positions)
        return f"{event.details}; last seen in {seen}" if event.details else f"last seen in {seen}"
    return event.details


def _devices(devices: tuple[int, ...]) -> str:
    return "[" + ",".join(str(int(d)) for d in devices) + "]"


def format_event_json(event: Event, *, wall_time: float, peers: Mapping[Addr, PeerInfo] | None = None) -> str:
    """The JSON object of an event, ending with ``}\\n``."""
    group = "LIFECYCLE" if event.group == Group.LIFECYCLE else "TRACE"
    lines = [
        "{\n",
        f'  "timestamp": {json.dumps(format_timestamp(wall_time))},\n',
        f'  "group": "{group}",\n',
        f'  "event": {json.dumps(_kind_text(event))},\n',
    ]
    peer = _event_peer(event, peers)
    if peer is not None:
        lines += [
            '  "peer": {\n',
            f'    "host": {json.dumps(peer.host)},\n',
            f'    "pid": {peer.pid},\n',
            f'    "cuda_devs": {_devices(peer.devices)},\n',
            f'    "nvml_devs": {_devices(peer.devices)},\n',
            f'    "hostname": {json.dumps(peer.hostname)},\n',
            f'    "incarnation": {peer.incarnation}\n',
            "  },\n",
        ]
    elif event.addr is not None:
        lines += ['  "peer": {\n', f'    "addr": {json.dumps(str(event.addr))}\n', "  },\n"]
    fields: list[tuple[str, str]] = [("details", json.dumps(_details(event)))]
    if event.restart is not None:
        restart = event.restart
        fields += [
            ("iteration", str(restart.iteration)),
            ("restarts_count", str(restart.restarts)),
            ("cause", json.dumps(restart.cause)),
            ("terminated_ranks", _devices(restart.terminated)),
            ("seconds_lost", f"{restart.seconds_lost:.3f}"),
        ]
    elif event.kind in _COMM_VERDICTS or event.comm_hash is not None:
        comm_hash = "null" if event.comm_hash is None else f'"0x{event.comm_hash & HASH_MASK:x}"'
        fields += [("comm_hash", comm_hash), ("ranks", "[" + ",".join(str(int(r)) for r in event.ranks) + "]")]
    if event.positions:
        positions = [
            {"rank": rank, "frames": [{"file": f.file, "line": f.line, "function": f.function} for f in frames]}
            for rank, frames in event.positions
        ]
        fields.append(("positions", json.dumps(positions)))
    lines += [f'  "{key}": {value}' + (",\n" if n < len(fields) - 1 else "\n") for n, (key, value) in enumerate(fields)]
    lines.append("}\n")
    return "".join(lines)
