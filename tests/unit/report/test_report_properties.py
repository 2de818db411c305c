"""Properties of the report over arbitrary snapshots: it never raises, the JSON always parses, the text and the
JSON agree, and the model accounts for every rank."""

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from rasd.core.comms import N_OPS, CommRecord, ProcessData, RankRecord
from rasd.core.events import Event, Kind
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.report import (
    CommErrors,
    build_report,
    format_event_json,
    format_event_text,
    render_json,
    render_text,
)

HOSTS = ["10.0.0.1", "10.0.0.2", "10.0.0.10", "::1", "fe80::2", "not-an-ip", 'we"ird\n']
counts = st.lists(st.integers(0, 3), min_size=0, max_size=N_OPS + 2).map(tuple)
rank_records = st.builds(
    RankRecord,
    comm_rank=st.integers(-1, 6),
    init_state=st.sampled_from([0, 0, 0, 1, 3, 7, 8, 42]),
    async_error=st.sampled_from([0, 0, 0, 2, 6, 7, 8]),
    finalize_called=st.booleans(),
    destroy_flag=st.booleans(),
    abort_flag=st.booleans(),
    device=st.integers(-1, 3),
    launched=counts,
    completed=counts,
)
comm_records = st.builds(
    CommRecord,
    comm_hash=st.sampled_from([0, 1, 2, 0xFFFFFFFFFFFFFFFF, 1 << 64, -5]),
    size=st.integers(-1, 6),
    ranks=st.lists(rank_records, max_size=3).map(tuple),
    rank_map=st.lists(st.tuples(st.integers(-2, 8), st.integers(0, 4), st.integers(-1, 2)), max_size=2).map(tuple),
)


@st.composite
def snapshots(draw):
    addrs = draw(st.lists(st.builds(Addr, st.sampled_from(HOSTS), st.integers(0, 3)), max_size=8, unique=True))
    peers = tuple(
        PeerInfo(
            addr,
            pid=draw(st.integers(-1, 5)),
            hostname=draw(st.text(max_size=4)),
            incarnation=draw(st.integers(0, 2**64 - 1)),
            devices=tuple(draw(st.lists(st.integers(0, 7), max_size=3))),
            rank=draw(st.integers(-1, 8)),
        )
        for addr in addrs
    )
    strangers = draw(st.lists(st.builds(Addr, st.sampled_from(HOSTS), st.integers(4, 5)), max_size=2))
    pool = addrs + strangers
    subset = st.lists(st.sampled_from(pool), max_size=4).map(frozenset) if pool else st.just(frozenset())
    responders = draw(subset)
    return JobSnapshot(
        peers=peers,
        dead=draw(subset),
        left=draw(subset),
        responses={a: ProcessData(tuple(draw(st.lists(comm_records, max_size=3)))) for a in responders},
        timeouts=draw(st.integers(0, 3)),
        collection_time=draw(st.floats(allow_nan=True, allow_infinity=True)),
    )


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(snapshots(), st.booleans())
def test_report_never_raises_and_json_parses(snapshot, verbose):
    report = build_report(snapshot)
    text = render_text(report, version_line="v", runtime_line="r", verbose=verbose)
    assert text.endswith("\n")
    doc = json.loads(render_json(report, timestamp=0.0, torchras_version="0", torch_version="0"))
    assert doc["communicators_count"] == len(doc["communicators"]) == len(report.communicators)
    assert doc["ras"]["missing_processes_count"] == len(report.missing_processes)
    for entry in doc["communicators"]:
        assert entry["ranks_count"] + entry["missing_ranks_count"] == entry["size"]


@SETTINGS
@given(snapshots())
def test_model_accounts_for_every_rank_and_groups_are_sorted(snapshot):
    report = build_report(snapshot)
    for comm in report.communicators:
        present = [r.comm_rank for r in comm.ranks]
        missing = [m.comm_rank for m in comm.missing]
        assert sorted(present + missing) == list(range(comm.size))
        assert bool(comm.incomplete_ranks) == bool(comm.errors & CommErrors.INCOMPLETE)
        if comm.nocomm_ranks:
            assert comm.errors & CommErrors.MISMATCH
    keys = [(-g.size, -g.node_count, -int(g.status), -int(g.errors)) for g in report.groups]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    labels = {c.label for c in report.communicators}
    assert len(labels) == len(report.communicators)


@SETTINGS
@given(
    st.sampled_from(list(Kind)),
    st.one_of(
        st.none(),
        st.builds(
            PeerInfo,
            st.builds(Addr, st.sampled_from(HOSTS), st.integers(0, 9)),
            st.integers(),
            st.text(),
            st.integers(0, 2**64 - 1),
            st.lists(st.integers(0, 63), max_size=4).map(tuple),
        ),
    ),
    st.one_of(st.none(), st.builds(Addr, st.sampled_from(HOSTS), st.integers(0, 9))),
    st.text(),
    st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    st.lists(st.integers(0, 100), max_size=4).map(tuple),
)
def test_events_are_one_line_of_text_and_one_json_object(kind, peer, addr, details, comm_hash, ranks):
    event = Event(kind, at=0.0, addr=addr, peer=peer, details=details, comm_hash=comm_hash, ranks=ranks)
    line = format_event_text(event, wall_time=0.0)
    assert line.endswith("\n") and line.count("\n") == 1 and "\r" not in line
    doc = json.loads(format_event_json(event, wall_time=0.0))
    assert doc["event"] == kind.value and doc["details"] == details
