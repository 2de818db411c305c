"""The report's work grows with the job linearly (issue 30), checked by counting, never by timing.

What used to make it grow faster, or slowly with a large constant, is counted here: parsing an IP for every
process (instead of once per host), reading the process-order key of every rank of a communicator (instead of the
first process's ranks), and keeping every process's copy of a communicator's rank map (a missing rank's lookup read
them all). bench/report_cost.py measures the times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from rasd.core import snapshot as core_snapshot
from rasd.core.peers import Addr
from rasd.core.snapshot import JobSnapshot, merge_communicators
from rasd.report import model, ordering
from rasd.report.json_format import render_json
from rasd.report.summary import build_job_summary
from rasd.report.text import render_head, render_tail
from report_builders import comm_records, make_peers, make_snapshot

HOSTS = 4


def _job(per_host: int, silent: tuple[int, ...] = ()) -> JobSnapshot:
    """A DDP + TP job: a world group, a tensor-parallel group per host, a data-parallel group per local index.
    The processes ``silent`` (indices) do not answer."""
    peers = make_peers([per_host] * HOSTS)
    n = len(peers)
    comms = [comm_records(peers, 0xA11)]
    comms += [comm_records(peers, 0x7000 + h, list(range(h * per_host, (h + 1) * per_host))) for h in range(HOSTS)]
    comms += [comm_records(peers, 0xD000 + j, list(range(j, n, per_host))) for j in range(per_host)]
    return make_snapshot(peers, *comms, silent=list(silent))


def _report_everything(snap: JobSnapshot) -> None:
    report = model.build_report(snap)
    for verbose in (False, True):
        render_head(build_job_summary(snap.peers, snap.left), version_line="v", runtime_line="r", verbose=verbose)
        render_tail(report, verbose=verbose)
    render_json(report, timestamp=0.0, torchras_version="0", torch_version="0")


@contextmanager
def _counting(module: Any, name: str) -> Iterator[list[int]]:
    """Count the calls of ``module.name`` (a function the report looks up by its module-level name)."""
    calls = [0]
    original: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return original(*args)

    setattr(module, name, counted)
    try:
        yield calls
    finally:
        setattr(module, name, original)


def _host_parses(snap: JobSnapshot) -> int:
    with _counting(core_snapshot, "host_order") as table, _counting(ordering, "host_key") as listings:
        _report_everything(snap)
    return table[0] + listings[0]


@pytest.mark.parametrize("silent_hosts", [(), (0, 3)])
def test_hosts_are_parsed_once_per_sort_not_once_per_process(silent_hosts: tuple[int, ...]) -> None:
    def job(per_host: int) -> JobSnapshot:  # the second process of each silent host does not answer
        return _job(per_host, tuple(h * per_host + 1 for h in silent_hosts))

    few, many = _host_parses(job(2)), _host_parses(job(16))
    assert few == many  # as many processes per host as you like: the same parsing
    assert many <= 8 * HOSTS  # a handful of sorts, each parsing every host once


def test_the_reference_rank_reads_the_process_order_of_the_first_process_only() -> None:
    keys = [0]
    original = model.process_order

    def counting_order(snap: JobSnapshot) -> Callable[[Addr], core_snapshot.ProcessOrder]:
        key = original(snap)

        def counted(addr: Addr) -> core_snapshot.ProcessOrder:
            keys[0] += 1
            return key(addr)

        return counted

    snap = _job(16)
    comms = len(merge_communicators(snap))
    model.process_order = counting_order  # type: ignore[assignment]
    try:
        report = model.build_report(snap)
    finally:
        model.process_order = original
    # Each communicator reads its first process's key and the next one's (which ends the scan): 64 processes of
    # 21 communicators, and no key per rank.
    assert keys[0] <= 2 * comms
    world = next(c for c in report.communicators if c.size == 16 * HOSTS)
    assert world.reference.comm_rank == 0


def test_a_communicator_keeps_one_copy_of_each_rank_map() -> None:
    snap = _job(16, silent=(5, 40))
    world = next(c for c in merge_communicators(snap) if c.size == 16 * HOSTS)
    assert len(world.ranks) == 16 * HOSTS - 2
    assert len(world.mapped) == 1  # 62 processes reported the same map
    assert world.global_rank(5) == 5 and world.global_rank(40) == 40


def test_the_merge_takes_processes_in_process_order_without_sorting_them() -> None:
    snap = _job(2)
    stranger = Addr("10.9.9.9", 1)
    responses = {stranger: snap.responses[snap.peers[0].addr], **dict(reversed(snap.responses.items()))}
    odd = JobSnapshot(peers=tuple(reversed(snap.peers)), responses=responses)
    assert core_snapshot.in_process_order(odd) == sorted(responses, key=core_snapshot.process_order(odd))
    assert core_snapshot.in_process_order(odd)[-1] == stranger
