"""The JSON report: NCCL's document (docs/protocol.md §4), made valid and extended.

NCCL prints its JSON with printf: 2-space indents, one key per line, empty arrays as ``[`` newline blank line
``]``, and strings unescaped. We keep the layout and escape every string, so the document always parses. Our
additions (an NCCL client ignores unknown keys; none is removed or renamed):

- top level: ``torchras_version`` and ``torch_version`` after NCCL's version keys;
- ``collective_counts`` lists all 12 op types, NCCL's five first;
- per rank: ``hostname``, ``incarnation`` (null when the process is unknown) and ``completed_counts``;
- per missing rank: ``hostname``, ``incarnation`` and ``status.left`` (its process left the job cleanly);
- in ``ras``: ``dead_count``, ``left_count``, ``waiting_count`` (processes that joined and wait to be admitted)
  and ``missing_processes_count``;
- top level, before ``ras``: ``restarts``, the job's in-process restarts (``null`` until a process restarted):
  ``iteration``, ``restarts_count``, ``last_cause``, ``last_terminated_ranks``, ``last_seconds_lost`` and
  ``processes_behind`` (host, pid and iteration of each known process at an older iteration).

Communicators come in merged-id order (hash, then size), ranks in communicator-rank order. We merge by hash and
size, so there is no secondary id: ``secondary_hash`` is always ``"0x0:0x0"``. A rank on the CPU has
``cuda_dev`` and ``nvml_dev`` -1; a missing rank shows its process's device when the process has exactly one.
"""

from __future__ import annotations

import json

from rasd.core.comms import N_OPS, OP_TYPES
from rasd.core.peers import PeerInfo
from rasd.core.stuck_verdict import StuckVerdict

from .model import HASH_MASK, Communicator, MissingRank, MissingReason, PresentRank, Report
from .restarts import RestartSummary
from .timestamps import format_timestamp

_SECONDARY_HASH = "0x0:0x0"


def _str(value: str) -> str:
    return json.dumps(value, ensure_ascii=True)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _array(items: list[str], indent: str) -> str:
    """NCCL's array layout: ``[``, the items joined by ``,\\n``, then a newline and the closing bracket. An empty
    array leaves a blank line."""
    return "[\n" + ",\n".join(items) + f"\n{indent}]"


#: Each op type's key, quoted once (a report prints them twice per rank of the job).
_OP_KEYS = tuple(_str(op) for op in OP_TYPES)


def _counts(counts: tuple[int, ...], indent: str) -> str:
    """Counts of every op type (``PresentRank.launched``: a type a record lacks counts 0)."""
    padded = (*counts[:N_OPS], *(0,) * (N_OPS - len(counts)))
    lines = [f"{indent}  {key}: {int(count)}" for key, count in zip(_OP_KEYS, padded, strict=True)]
    return "{\n" + ",\n".join(lines) + f"\n{indent}}}"


def _quoted(quote: dict[str, str], value: str) -> str:
    """``_str(value)``, each distinct value quoted once per document (``quote``: what has been)."""
    text = quote.get(value)
    if text is None:
        text = quote[value] = _str(value)
    return text


def _process_fields(process: PeerInfo | None) -> tuple[str, int, str, str]:
    """host, pid, hostname and incarnation of a rank's process, with NCCL's values for an unknown one."""
    if process is None:
        return "unknown", -1, "", "null"
    return process.host, process.pid, process.hostname, str(process.incarnation)


def _rank(rank: PresentRank, quote: dict[str, str]) -> str:
    host, pid, hostname, incarnation = _process_fields(rank.process)
    record = rank.record
    i = " " * 10
    return (
        "        {\n"
        f'{i}"rank": {rank.comm_rank},\n'
        f'{i}"host": {_quoted(quote, host)},\n'
        f'{i}"pid": {pid},\n'
        f'{i}"cuda_dev": {record.device},\n'
        f'{i}"nvml_dev": {record.device},\n'
        f'{i}"status": {{\n'
        f'{i}  "init_state": {record.init_state},\n'
        f'{i}  "async_error": {record.async_error},\n'
        f'{i}  "finalize_called": {_bool(record.finalize_called)},\n'
        f'{i}  "destroy_flag": {_bool(record.destroy_flag)},\n'
        f'{i}  "abort_flag": {_bool(record.abort_flag)}\n'
        f"{i}}},\n"
        f'{i}"collective_counts": {_counts(record.launched, i)},\n'
        f'{i}"hostname": {_quoted(quote, hostname)},\n'
        f'{i}"incarnation": {incarnation},\n'
        f'{i}"completed_counts": {_counts(record.completed, i)}\n'
        "        }"
    )


def _missing_rank(rank: MissingRank) -> str:
    host, pid, hostname, incarnation = _process_fields(rank.process)
    devices = rank.process.devices if rank.process is not None else ()
    device = devices[0] if len(devices) == 1 else -1
    i = " " * 10
    return (
        "        {\n"
        f'{i}"rank": {rank.comm_rank},\n'
        f'{i}"host": {_str(host)},\n'
        f'{i}"pid": {pid},\n'
        f'{i}"cuda_dev": {device},\n'
        f'{i}"nvml_dev": {device},\n'
        f'{i}"status": {{\n'
        f'{i}  "unresponsive": {_bool(rank.reason is MissingReason.INCOMPLETE)},\n'
        f'{i}  "considered_dead": {_bool(rank.dead)},\n'
        f'{i}  "left": {_bool(rank.left)}\n'
        f"{i}}},\n"
        f'{i}"hostname": {_str(hostname)},\n'
        f'{i}"incarnation": {incarnation}\n'
        "        }"
    )


def _stuck(verdict: StuckVerdict | None, indent: str) -> str:
    """A standing COMM_STUCK verdict as data (docs/protocol.md): the op, its operation number, and the ranks behind
    it and inside it (communicator ranks, and global ranks where the rank map tells); its state, STUCK or SLOW (the
    ranks behind work: no restart), the ranks behind that work, a declared phase, how long the counters stood and
    the idle limit in force; ``null`` when none stands."""
    if verdict is None:
        return "null"
    i = indent + "  "
    return (
        "{\n"
        f'{i}"op": {_str(OP_TYPES[verdict.op])},\n'
        f'{i}"sequence": {verdict.seq},\n'
        f'{i}"ranks_behind": {_int_list(verdict.behind)},\n'
        f'{i}"ranks_inside": {_int_list(verdict.inside)},\n'
        f'{i}"global_ranks_behind": {_int_list(verdict.global_behind)},\n'
        f'{i}"global_ranks_inside": {_int_list(verdict.global_inside)},\n'
        f'{i}"positions_behind": {_positions(verdict, i)},\n'
        f'{i}"state": {_str("SLOW" if verdict.slow else "STUCK")},\n'
        f'{i}"ranks_working": {_int_list(verdict.busy)},\n'
        f'{i}"phase": {_str(verdict.phase)},\n'
        f'{i}"seconds_without_progress": {verdict.stood_ms / 1000:.3f},\n'
        f'{i}"idle_limit_seconds": {verdict.limit_ms / 1000:.3f}\n'
        f"{indent}}}"
    )


def _positions(verdict: StuckVerdict, indent: str) -> str:
    """Where each rank behind was when the verdict was made: ``[{"rank": 2, "frames": [{"file", "line",
    "function"}, ...]}]``, outermost frame first (ours; rasd/core/frames.py)."""
    return json.dumps(
        [
            {"rank": rank, "frames": [{"file": f.file, "line": f.line, "function": f.function} for f in position]}
            for rank, position in verdict.positions
        ]
    )


def _communicator(comm: Communicator, stuck: StuckVerdict | None, quote: dict[str, str]) -> str:
    i = " " * 6
    return (
        "    {\n"
        f'{i}"hash": "0x{comm.comm_hash & HASH_MASK:x}",\n'
        f'{i}"secondary_hash": "{_SECONDARY_HASH}",\n'
        f'{i}"size": {comm.size},\n'
        f'{i}"ranks_count": {len(comm.ranks)},\n'
        f'{i}"missing_ranks_count": {len(comm.missing)},\n'
        f'{i}"ranks": {_array([_rank(r, quote) for r in comm.ranks], i)},\n'
        f'{i}"missing_ranks": {_array([_missing_rank(m) for m in comm.missing], i)},\n'
        f'{i}"stuck": {_stuck(stuck, i)}\n'
        "    }"
    )


def _int_list(values: tuple[int, ...]) -> str:
    """A list of integers on one line, as NCCL prints device lists: ``[0,2,3]``."""
    return "[" + ",".join(str(int(v)) for v in values) + "]"


def _restarts(summary: RestartSummary | None) -> str:
    if summary is None:
        return "null"
    i = " " * 4
    behind = [
        f"{i}  {{\n"
        f'{i}    "host": {_str(peer.host)},\n'
        f'{i}    "pid": {peer.pid},\n'
        f'{i}    "iteration": {iteration}\n'
        f"{i}  }}"
        for peer, iteration in summary.behind
    ]
    last = summary.last
    return (
        "{\n"
        f'{i}"iteration": {summary.iteration},\n'
        f'{i}"restarts_count": {summary.restarts},\n'
        f'{i}"last_cause": {_str(last.cause)},\n'
        f'{i}"last_terminated_ranks": {_int_list(last.terminated)},\n'
        f'{i}"last_seconds_lost": {last.seconds_lost:.3f},\n'
        f'{i}"processes_behind": {_array(behind, i)}\n'
        "  }"
    )


def render_json(
    report: Report,
    *,
    timestamp: float,
    torchras_version: str,
    torch_version: str,
    nccl_version: str = "",
    cuda_runtime_version: int = -1,
    cuda_driver_version: int = -1,
) -> str:
    """The JSON document of a finished gather. ``timestamp`` is the wall-clock time of the report."""
    quote: dict[str, str] = {}
    communicators = [_communicator(c, report.stuck.get(c.comm_hash), quote) for c in report.communicators_by_id]
    return (
        "{\n"
        f'  "nccl_version": {_str(nccl_version)},\n'
        f'  "cuda_runtime_version": {int(cuda_runtime_version)},\n'
        f'  "cuda_driver_version": {int(cuda_driver_version)},\n'
        f'  "torchras_version": {_str(torchras_version)},\n'
        f'  "torch_version": {_str(torch_version)},\n'
        f'  "timestamp": {_str(format_timestamp(timestamp))},\n'
        f'  "communicators_count": {len(communicators)},\n'
        f'  "communicators": {_array(communicators, "  ")},\n'
        f'  "restarts": {_restarts(report.restarts)},\n'
        '  "ras": {\n'
        f'    "collection_time_sec": {report.collection_seconds:.3f},\n'
        f'    "timeouts_count": {report.timeouts},\n'
        f'    "dead_count": {report.dead_count},\n'
        f'    "left_count": {report.left_count},\n'
        f'    "waiting_count": {len(report.waiting_processes)},\n'
        f'    "missing_processes_count": {len(report.missing_processes)}\n'
        "  }\n"
        "}\n"
    )
