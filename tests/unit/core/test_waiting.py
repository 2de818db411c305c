"""A process that joined a running job and waits to be admitted (issue 13): its node says so in every gather it
answers, and the report counts and lists it as WAITING (docs/elastic.md §5, docs/protocol.md §3.2)."""

from __future__ import annotations

import json

import pytest

from rasd.core import node as core, wire
from rasd.core.comms import ProcessData
from rasd.core.peers import Addr
from rasd.report.json_format import render_json
from rasd.report.model import build_report
from rasd.report.text import render_text

from .harness import Harness, peer


def collresp(*data: ProcessData) -> wire.CollResp:
    return wire.collresp(Addr("10.0.0.1", 1), 7, 0, tuple((Addr("10.0.0.1", 2 + i), d) for i, d in enumerate(data)))


def test_the_waiting_flag_round_trips_and_a_bad_flag_is_refused():
    msg = collresp(ProcessData(waiting=True), ProcessData())
    body = wire.encode(msg)[4:]
    assert wire.decode_body(body) == msg
    # The flag is the last byte of the second process's data: anything but 0 or 1 is a protocol error.
    damaged = bytearray(wire.encode(collresp(ProcessData()))[4:])
    damaged[-1] = 2
    with pytest.raises(wire.ProtocolError):
        wire.decode_body(bytes(damaged)).entries  # noqa: B018 - decoding the entries is the point


def gather_from(h: Harness, name: str) -> core.GatherDone:
    h.call(name, lambda: h[name].node.start_gather(1, h.now))
    h.run()
    (done,) = [a for a in h[name].actions if isinstance(a, core.GatherDone)]
    return done


def test_a_waiting_process_is_counted_and_listed_until_it_is_admitted():
    h = Harness()
    for i, name in enumerate("abc"):
        h.add(name, peer(i + 1))
    h.introduce()
    h.advance(2.0, 0.5)
    h.call("c", lambda: h["c"].node.set_waiting(True, h.now))
    done = gather_from(h, "a")
    waiting = {addr.port for addr, data in done.snapshot.responses.items() if data.waiting}
    assert waiting == {30003}
    report = build_report(done.snapshot)
    assert [p.addr.port for p in report.waiting_processes] == [30003]
    assert report.summary.process_count == 3  # in the mesh, so counted
    text = render_text(report, version_line="v", runtime_line="r")
    assert "WAITING\n  1 job process joined the job and waits to be admitted at its next round\n" in text
    assert text.index("WAITING") > text.index("Warnings")
    assert (
        json.loads(render_json(report, timestamp=0.0, torchras_version="0", torch_version="0"))["ras"]["waiting_count"]
        == 1
    )

    h.call("c", lambda: h["c"].node.set_waiting(False, h.now))
    h["a"].actions.clear()
    done = gather_from(h, "a")
    report = build_report(done.snapshot)
    assert report.waiting_processes == () and "WAITING" not in render_text(report, version_line="v", runtime_line="r")
