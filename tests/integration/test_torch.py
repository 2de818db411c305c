"""rasd.torch in real 4-process gloo jobs on the CPU: counts, communicators, verdicts, and an untouched job.

Importing torch costs seconds per process, so the file starts three jobs in all and each checks several things:

- one job that calls ``rasd.install()`` before ``init_process_group`` (module fixture ``job``), driven through
  ``torch_worker.py``'s commands by the tests below in file order: per-op-type counts, sub-group rows, a rank
  that skips an all_reduce (MISMATCH, then COMM_STUCK, then recovery), a failed async op, and a destroyed group
  (NOCOMM), which comes last because it leaves the job changed;
- one job that never calls rasd (untouched) next to one run unchanged under ``python -m rasd.run``.

Every worker reports on its stdout (``ACK``/``EVENT`` lines, read by a thread) and in JSON files; every wait has
a deadline, and every process is killed at teardown. Deadlines are generous: speed is measured in bench/.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ports import shifted
from ras_client import ask, connect, wait_for_json, wait_for_report
from rasd.core.comms import OP_TYPES

pytestmark = pytest.mark.slow  # every test starts torch processes

WORKER = Path(__file__).with_name("torch_worker.py")
REPOSITORY = Path(__file__).resolve().parents[2]
WORLD = 4
# Every mesh timer scaled by FACTOR (a peer silent for 2.5 s is unresponsive: with less, a loaded 2-core machine
# makes gathers skip busy processes now and then), and the stuck limit set to 10 s before scaling: 5 s.
FACTOR = 0.5
STUCK_LIMIT = 10.0 * FACTOR
SWEEP = 5.0 * FACTOR
START_DEADLINE = 90.0  # 4 processes importing torch on 2 cores (8 for the pair of jobs)

#: What one ``ops`` command issues on the world group, per rank (the pair group gets one AllReduce more).
OPS_WORLD = {
    "Broadcast": 2,
    "Reduce": 1,
    "AllGather": 2,
    "ReduceScatter": 1,
    "AllReduce": 4,
    "AllToAll": 1,
    "Gather": 1,
    "Scatter": 1,
    "Barrier": 1,
    "Send": 2,
    "Recv": 2,
    "Other": 0,
}
OPS_PAIR = {op: (1 if op == "AllReduce" else 0) for op in OP_TYPES}

_next_port = [shifted(30700)]


def client_port() -> int:
    """A free fixed port for TORCHRAS_ADDR (below Linux's ephemeral ports, 32768 on), different for every job."""
    while True:
        _next_port[0] += 1 + (os.getpid() % 7)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", _next_port[0]))
            except OSError:
                continue
        return _next_port[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------------------------
# A job of torch_worker.py processes


class TorchJob:
    def __init__(self, directory: Path, mode: str, *, run_module: bool = False, env: dict[str, str] | None = None):
        self.directory = directory
        self.out = directory / "out"
        self.out.mkdir(parents=True)
        self.port = client_port()
        self.procs: list[subprocess.Popen] = []
        self.acks: list[queue.Queue[str]] = [queue.Queue() for _ in range(WORLD)]
        self.events: list[list[dict]] = [[] for _ in range(WORLD)]
        self.event_queue: queue.Queue[tuple[int, dict]] = queue.Queue()
        master = free_port()
        launcher = [sys.executable, "-m", "rasd.run"] if run_module else [sys.executable]
        for rank in range(WORLD):
            penv = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(WORLD),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(master),
                TORCHRAS_ADDR=f"localhost:{self.port}",
                TORCHRAS_RUN_DIR=str(directory / "endpoints"),
                TORCHRAS_TIMEOUT_FACTOR=str(FACTOR),
                TORCHRAS_STUCK_LIMIT=str(STUCK_LIMIT / FACTOR),
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
                PYTHONUNBUFFERED="1",
                TORCH_CPP_LOG_LEVEL="ERROR",
                **(env or {}),
            )
            penv.pop("TORCHRAS_DEFAULT_ADDR", None)
            with open(directory / f"rank{rank}.stderr", "w") as stderr:  # the rank writes to its own copy
                proc = subprocess.Popen(
                    [*launcher, str(WORKER), str(self.out), mode],
                    env=penv,
                    cwd=REPOSITORY,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(rank, proc), daemon=True).start()

    def _read(self, rank: int, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("EVENT "):
                event = json.loads(line[6:])
                self.events[rank].append(event)
                self.event_queue.put((rank, event))
            elif line.startswith(("ACK ", "READY", "ERROR")):
                self.acks[rank].put(line)
        self.acks[rank].put("EOF")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def diagnostics(self) -> str:
        parts = [f"rank {r}: returncode {p.poll()}" for r, p in enumerate(self.procs)]
        for path in sorted(self.directory.glob("rank*.stderr")):
            parts.append(f"--- {path.name}\n{path.read_text()[-2500:]}")
        return "\n".join(parts)

    def expect(self, rank: int, line: str, timeout: float) -> None:
        try:
            got = self.acks[rank].get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"rank {rank}: no {line!r} within {timeout}s\n{self.diagnostics()}") from None
        assert got == line, f"rank {rank}: expected {line!r}, got {got!r}\n{self.diagnostics()}"

    def ready(self) -> None:
        deadline = time.monotonic() + START_DEADLINE
        for rank in range(WORLD):
            self.expect(rank, "READY", max(1.0, deadline - time.monotonic()))

    def send(self, cmd: str, ranks: list[int] | None = None) -> None:
        for rank in range(WORLD) if ranks is None else ranks:
            stdin = self.procs[rank].stdin
            assert stdin is not None
            stdin.write(cmd + "\n")
            stdin.flush()

    def acked(self, cmd: str, ranks: list[int] | None = None, timeout: float = 60.0) -> dict[int, dict]:
        """Wait for ``ACK cmd`` from ``ranks``; return what each wrote for it."""
        ranks = list(range(WORLD)) if ranks is None else ranks
        deadline = time.monotonic() + timeout
        for rank in ranks:
            self.expect(rank, f"ACK {cmd}", max(0.1, deadline - time.monotonic()))
        return {rank: json.loads((self.out / f"rank{rank}.{cmd}.json").read_text()) for rank in ranks}

    def command(self, cmd: str, ranks: list[int] | None = None, timeout: float = 60.0) -> dict[int, dict]:
        self.send(cmd, ranks)
        return self.acked(cmd, ranks, timeout)

    def wait_event(self, predicate: Callable[[int, dict], bool], timeout: float) -> tuple[int, dict]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching event within {timeout}s; seen: {self.events}")
            try:
                rank, event = self.event_queue.get(timeout=left)
            except queue.Empty:
                continue
            if predicate(rank, event):
                return rank, event

    def exit(self, timeout: float = 60.0) -> list[int | None]:
        self.command("exit", timeout=timeout)
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        p.send_signal(sig)
                    except ProcessLookupError:
                        pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (p.stdin, p.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass


# ----------------------------------------------------------------------------------------------------------------
# The client port (the handshake-retrying client is tests/integration/ras_client.py)


def by_hash(doc: dict) -> dict[int, dict]:
    return {int(c["hash"], 16): c for c in doc["communicators"]}


def comm_of(registry: list[dict], size: int) -> dict:
    found = [c for c in registry if c["size"] == size]
    assert len(found) == 1, registry
    return found[0]


def delta(after: dict, before: dict) -> dict:
    return {op: after[op] - before[op] for op in OP_TYPES}


# ----------------------------------------------------------------------------------------------------------------
# The installed job


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchJob]:
    j = TorchJob(tmp_path_factory.mktemp("installed"), "explicit")
    try:
        j.ready()
        j.command("setup")
        yield j
    finally:
        j.kill()


def test_every_op_type_is_counted_launched_and_completed_in_the_registry_and_the_report(job: TorchJob):
    before = job.command("snap")
    after = job.command("ops")
    for rank in range(WORLD):
        world_before = comm_of(before[rank]["registry"], WORLD)
        world = comm_of(after[rank]["registry"], WORLD)
        pair_before, pair = comm_of(before[rank]["registry"], 2), comm_of(after[rank]["registry"], 2)
        assert delta(world["launched"], world_before["launched"]) == OPS_WORLD, f"rank {rank}"
        assert delta(world["completed"], world_before["completed"]) == OPS_WORLD, f"rank {rank}"
        assert delta(pair["launched"], pair_before["launched"]) == OPS_PAIR, f"rank {rank}"
        assert delta(pair["completed"], pair_before["completed"]) == OPS_PAIR, f"rank {rank}"
        assert world["rank"] == rank and pair["rank"] == rank % 2
        assert world["init_state"] == pair["init_state"] == 0 and world["async_error"] == 0
        # The async all_reduce: counted completed once its wait() returned.
        at_wait = comm_of(after[rank]["after_async_wait"], WORLD)
        assert at_wait["completed"]["AllReduce"] == at_wait["launched"]["AllReduce"]
        assert at_wait["launched"]["AllReduce"] == world_before["launched"]["AllReduce"] + 4
        assert after[rank]["all_reduce_file"].endswith(os.path.join("rasd", "torch", "hooks.py"))
        assert "torchras-rasd" in after[rank]["threads"]
    # Every member computed the same hash for each group; the two pairs differ.
    worlds = {comm_of(after[r]["registry"], WORLD)["hash"] for r in range(WORLD)}
    pairs = [comm_of(after[r]["registry"], 2)["hash"] for r in range(WORLD)]
    assert len(worlds) == 1 and pairs[0] == pairs[1] and pairs[2] == pairs[3] and pairs[0] != pairs[2]

    # The JSON report: collective_counts (launched) and completed_counts of every rank, as the registries say.
    def settled(d: dict) -> bool:
        """Every rank of every group reported, with the counts its registry holds (a quiet job's records are read
        at the next gather or two), each by a process in the root's table (a process that joined last can answer
        a gather through another member before the root's table lists it: the report then names it unknown)."""
        if d["communicators_count"] != 3 or any(c["missing_ranks_count"] for c in d["communicators"]):
            return False
        got = by_hash(d)
        try:
            return all(
                (found := next(r for r in got[local["hash"]]["ranks"] if r["rank"] == local["rank"]))[
                    "collective_counts"
                ]
                == local["launched"]
                and found["pid"] == job.pids[rank]
                for rank in range(WORLD)
                for local in after[rank]["registry"]
            )
        except (KeyError, StopIteration):
            return False

    try:
        doc = wait_for_json(job.port, settled)
    except AssertionError:
        doc = wait_for_json(job.port, lambda d: d["communicators_count"] == 3)  # the asserts below say what differs
    comms = by_hash(doc)
    for rank in range(WORLD):
        for local in after[rank]["registry"]:
            reported = comms[local["hash"]]
            assert reported["size"] == local["size"] and reported["missing_ranks_count"] == 0
            entry = next(r for r in reported["ranks"] if r["rank"] == local["rank"])
            assert entry["pid"] == job.pids[rank]
            assert entry["collective_counts"] == local["launched"]
            assert entry["completed_counts"] == local["completed"]
            assert entry["status"] == {
                "init_state": 0,
                "async_error": 0,
                "finalize_called": False,
                "destroy_flag": False,
                "abort_flag": False,
            }

    # The text report: the world group, then the two 2-rank groups as one row.
    report = wait_for_report(job.port, lambda r: "INCOMPLETE" not in r)
    assert "    0         1         1         4         4         4   RUNNING      OK\n" in report
    assert "    1         2         1         2         2         4   RUNNING      OK\n" in report
    assert report.endswith("Errors\n======\n\nWarnings\n========\n\n"), report


def torch_handler(port: int, name: str) -> str:
    """One of the handlers of torch's per-rank debug server (``torch.distributed.debug``), as its frontend asks."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/handler/{name}?", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read().decode("utf-8", "replace")


def test_torchs_debug_server_and_rasd_answer_side_by_side_and_its_dumps_change_no_count(job: TorchJob):
    """torch's own debug server (issue 42, item 4: ``torch.distributed.debug``, whose frontend serves port 25999)
    beside rasd: its per-rank stacks (``dump_traceback``) and Flight Recorder dump (``fr_trace_json``), asked of
    every rank while rasd's STACKS runs, all answer; neither takes a signal, and a Flight Recorder dump only reads
    the records, so rasd counts the next collectives exactly."""
    ports = {rank: data["port"] for rank, data in job.command("debugserver").items()}
    answers: dict[str, str] = {}

    def ask_torch(rank: int, name: str) -> None:
        answers[f"{name} {rank}"] = torch_handler(ports[rank], name)

    def ask_rasd() -> None:
        answers["stacks"] = ask(job.port, b"STACKS\n")

    threads = [threading.Thread(target=ask_rasd)] + [
        threading.Thread(target=ask_torch, args=(rank, name))
        for rank in range(WORLD)
        for name in ("dump_traceback", "fr_trace_json")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert answers["stacks"].startswith(f"Stacks of {WORLD} of {WORLD} processes"), answers["stacks"][:500]
    for rank in range(WORLD):
        assert "torch_worker.py" in answers[f"dump_traceback {rank}"], answers[f"dump_traceback {rank}"][:500]
        assert json.loads(answers[f"fr_trace_json {rank}"])["entries"], rank  # the job's collectives so far
    before = job.command("snap")
    after = job.command("ops")
    for rank in range(WORLD):
        world_before, world = comm_of(before[rank]["registry"], WORLD), comm_of(after[rank]["registry"], WORLD)
        assert delta(world["launched"], world_before["launched"]) == OPS_WORLD, f"rank {rank}"
        assert delta(world["completed"], world_before["completed"]) == OPS_WORLD, f"rank {rank}"
    assert all(json.loads(torch_handler(ports[rank], "fr_trace_json"))["entries"] for rank in range(WORLD))


def test_a_rank_that_skips_an_all_reduce_is_a_mismatch_then_stuck_then_recovers(job: TorchJob):
    world_hash = comm_of(job.command("snap", [0])[0]["registry"], WORLD)["hash"]
    monitor = connect(job.port)
    try:
        monitor.sendall(b"MONITOR\n")
        assert monitor.recv(3) == b"OK\n"
        sent = time.time()
        job.send("lag")  # ranks 0, 1, 3 enter an all_reduce; rank 2 skips it and waits
        lagging = job.acked("lag", [2])[2]
        behind = comm_of(lagging["registry"], WORLD)["launched"]["AllReduce"]

        # Once ranks 0, 1 and 3 have all launched it (each of them is inside it until rank 2 comes).
        report = wait_for_report(job.port, lambda r: f"  3 ranks have launched up to operation {behind + 1}\n" in r)
        assert "Communicator ranks have different AllReduce operation counts\n" in report
        assert (
            f"  Rank 2 has launched up to operation {behind} -- CPU managed by process {job.pids[2]} on node "
            "127.0.0.1\n"
        ) in report
        assert "    0         1         1         4         4         4   RUNNING  MISMATCH\n" in report

        # The sweeper's verdict reaches every process's subscribers (and the monitor client) after the limit.
        details = (
            f"AllReduce operation {behind + 1} stuck; rank 2 behind (not launched); ranks 0,1,3 inside it "
            "(launched, not completed)"
        )
        deadline = STUCK_LIMIT + 4 * SWEEP + 30.0
        seen: dict[int, dict] = {}
        while len(seen) < WORLD:
            rank, event = job.wait_event(
                lambda r, e: e["kind"] == "COMM_STUCK" and e["comm_hash"] == world_hash and r not in seen, deadline
            )
            seen[rank] = event
        for event in seen.values():
            # ... and where rank 2 was when the sweep saw it stand: in the worker's command loop (issue 28).
            assert event["details"].startswith(f"{details}; rank 2 in "), event["details"]
            assert re.search(r"torch_worker\.py:\d+ \(main\)$", event["details"]), event["details"]
            assert sorted(event["ranks"]) == [0, 1, 2, 3] and event["ranks"][0] == 2  # behind first
            # Never before the others stood in it for half the limit: rank 2, idle in its command loop since before
            # ``lag``, may be named that early (docs/architecture.md §4.2: a wedge is named the limit after the rank
            # stopped), never earlier.
            assert event["wall"] - sent >= STUCK_LIMIT / 2 - 0.2
        text = b""
        monitor.settimeout(deadline)
        while b"COMM_STUCK" not in text or not text.endswith(b"\n"):
            chunk = monitor.recv(4096)
            assert chunk, f"monitor closed; got {text!r}"
            text += chunk
        line = next(x for x in text.decode().splitlines() if "COMM_STUCK" in x)
        assert f"] COMM_STUCK: {details}; rank 2 in " in line, line

        # Rank 2 issues it: the ranks agree again, the collective completes, and the verdict clears.
        done = job.command("catchup", [2])
        done.update(job.acked("lag", [0, 1, 3]))
        for rank, data in done.items():
            world = comm_of(data["registry"], WORLD)
            assert world["launched"]["AllReduce"] == world["completed"]["AllReduce"] == behind + 1, f"rank {rank}"
        job.wait_event(lambda r, e: e["kind"] == "COMM_RECOVERED" and e["comm_hash"] == world_hash, deadline)
        report = wait_for_report(job.port, lambda r: "MISMATCH" not in r)
        assert "    0         1         1         4         4         4   RUNNING      OK\n" in report
    finally:
        monitor.close()


def test_a_failed_async_op_is_launched_then_completed_with_an_async_error(job: TorchJob):
    known = {c["hash"] for c in job.command("snap", [0])[0]["registry"]}
    data = job.command("asyncfail")  # rank 0's all_reduce times out after 2 s: rank 1 never joins
    rank0 = data[0]
    assert "error" in rank0, rank0
    (fail_before,) = [c for c in rank0["before_wait"] if c["hash"] not in known]
    assert fail_before["size"] == 2 and fail_before["launched"]["AllReduce"] == 1
    assert fail_before["completed"]["AllReduce"] == 0 and fail_before["async_error"] == 0
    fail = next(c for c in rank0["after_wait"] if c["hash"] == fail_before["hash"])
    assert fail["completed"]["AllReduce"] == 1
    assert fail["async_error"] == 2  # a gloo timeout is a RuntimeError: NCCL's "System error"
    rank1 = next(c for c in data[1]["registry"] if c["hash"] == fail_before["hash"])
    assert rank1["launched"]["AllReduce"] == 0 and rank1["async_error"] == 0

    # A report read just after rank 0's counters moved may still take the difference for an operation in flight
    # (docs/reliability.md 2.4, decided from the gather's own timing): the reports become a MISMATCH once they
    # have been still longer than a gather takes.
    mismatch = "         1         1         2         2         2   RUNNING  ERROR,MISMATCH\n"
    report = wait_for_report(job.port, lambda r: f"({fail['hash']:016x}) ERROR\n" in r and mismatch in r)
    assert mismatch in report
    assert "  Asynchronous error on 1 rank\n" in report
    assert f"  Rank 0 reported System error -- CPU managed by process {job.pids[0]} on node 127.0.0.1\n" in report
    assert f"  Rank 0 has launched up to operation 1 -- CPU managed by process {job.pids[0]}" in report
    assert f"  Rank 1 has not launched any operations -- CPU managed by process {job.pids[1]}" in report
    reported = by_hash(wait_for_json(job.port, lambda d: by_hash(d).get(fail["hash"], {}).get("ranks_count") == 2))[
        fail["hash"]
    ]
    statuses = {r["rank"]: r["status"]["async_error"] for r in reported["ranks"]}
    assert statuses[0] == fail["async_error"] and statuses[1] == 0


def test_a_group_destroyed_on_one_rank_is_nocomm_and_a_mismatch(job: TorchJob):
    # Last: it leaves the job changed. Ranks 0 and 1 also destroy the failed group of the test above.
    pair23 = comm_of(job.command("snap", [2])[2]["registry"], 2)["hash"]
    data = job.command("destroy")
    assert all(c["hash"] != pair23 for c in data[3]["registry"])
    assert [c["size"] for c in data[0]["registry"]] == [WORLD, 2]  # the failed group is gone
    report = wait_for_report(job.port, lambda r: f"({pair23:016x}) MISMATCH\n" in r)
    assert "  Communicator ranks have different status\n" in report
    assert f"  Rank 1 has status NOCOMM -- CPU managed by process {job.pids[3]} on node 127.0.0.1\n" in report
    assert "    1         1         1         1         2         1   RUNNING  MISMATCH\n" in report  # rank 2 alone
    assert "    2         1         1         2         2         2   RUNNING      OK\n" in report  # the pair [0,1]
    assert "INCOMPLETE" not in report  # rank 3's process answered: it is no longer a member, not missing
    reported = by_hash(wait_for_json(job.port, lambda d: pair23 in by_hash(d)))[pair23]
    assert reported["ranks_count"] == 1 and [r["rank"] for r in reported["ranks"]] == [0]
    assert [(m["rank"], m["pid"], m["status"]["unresponsive"]) for m in reported["missing_ranks"]] == [
        (1, job.pids[3], False)
    ]
    assert job.exit() == [0] * WORLD


# ----------------------------------------------------------------------------------------------------------------
# Untouched, and unchanged under python -m rasd.run


def test_a_job_without_hooks_is_untouched_and_rasd_run_reports_an_unchanged_script(tmp_path: Path):
    plain = TorchJob(tmp_path / "plain", "plain")
    wrapped = TorchJob(tmp_path / "run", "plain", run_module=True)
    try:
        plain.ready()
        wrapped.ready()
        for j in (plain, wrapped):
            j.command("setup")
        untouched = plain.command("ops")
        observed = wrapped.command("ops")

        for rank, data in untouched.items():
            assert data["modules"] == [], f"rank {rank} imported {data['modules']}"
            assert not [t for t in data["threads"] if "torchras" in t], data["threads"]
            assert data["all_reduce_file"].endswith(os.path.join("torch", "distributed", "c10d_logger.py"))
            assert data["registry"] == []
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("localhost", plain.port), 2).close()

        for data in observed.values():
            assert delta(comm_of(data["registry"], WORLD)["launched"], {op: 0 for op in OP_TYPES}) == OPS_WORLD
            assert "torchras-rasd" in data["threads"]
        report = wait_for_report(wrapped.port, lambda r: "INCOMPLETE" not in r)
        assert report.startswith("torchras version "), report
        assert "    0         1         1         4         4         4   RUNNING      OK\n" in report
        assert "    1         2         1         2         2         4   RUNNING      OK\n" in report
        doc = wait_for_json(
            wrapped.port,
            lambda d: (
                [c["ranks_count"] for c in d["communicators"]] == [4, 2, 2]
                or sorted(c["ranks_count"] for c in d["communicators"]) == [2, 2, 4]
            ),
        )
        world = next(c for c in doc["communicators"] if c["size"] == WORLD)
        assert sorted(r["pid"] for r in world["ranks"]) == sorted(wrapped.pids)
        assert all(r["collective_counts"] == OPS_WORLD == r["completed_counts"] for r in world["ranks"])

        assert plain.exit() == [0] * WORLD
        assert wrapped.exit() == [0] * WORLD
    finally:
        plain.kill()
        wrapped.kill()
