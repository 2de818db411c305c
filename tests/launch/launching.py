"""Run ``rasd launch`` as a user does, from a test: its lines, its workers' pids, its status; cleaned up after."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from polling import wait_until

REPOSITORY = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_base_port() -> int:
    """A port p with p + 1 and p + 2 free too (the Wrapper's store, a script's own store)."""
    for _ in range(100):
        base = free_port()
        try:
            for port in (base + 1, base + 2):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no three consecutive free ports")


class Launch:
    """``python -m torchras.cli launch ARGV`` (what the ``rasd`` script runs), its output in files."""

    def __init__(
        self, folder: Path, *argv: str, env: dict[str, str] | None = None, name: str = "launch", spawn=subprocess.Popen
    ) -> None:
        """``spawn``: how to start it (``netns.Host.popen`` starts it inside a network namespace)."""
        self.folder = folder
        self.stdout_path = folder / f"{name}.out"
        self.stderr_path = folder / f"{name}.err"
        environ = dict(os.environ, TORCHRAS_ADDR=f"127.0.0.1:{free_port()}", TORCH_CPP_LOG_LEVEL="ERROR")
        environ["TMPDIR"] = str(folder)  # the launcher's log folder without --log-dir (torchrun's: never removed)
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), environ.get("PYTHONPATH")]))
        environ.update(env or {})
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = spawn(
                [sys.executable, "-m", "torchras.cli", "launch", *argv],
                stdout=out,
                stderr=err,
                env=environ,
                cwd=folder,
                start_new_session=True,
            )

    def out(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def err(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def lines(self) -> list[str]:
        """The launcher's own lines (``rasd launch: ...``)."""
        return [line for line in self.err().splitlines() if line.startswith("rasd launch: ")]

    def wait_for(self, pattern: str, timeout: float, count: int = 1) -> list[str]:
        """The launcher's lines matching ``pattern``, once there are ``count`` of them (fails at once if the
        launcher ended without them)."""

        def found() -> list[str] | None:
            ended = self.process.poll() is not None  # before reading: its last lines are in the file by then
            lines = [line for line in self.lines() if re.search(pattern, line)]
            if len(lines) >= count:
                return lines
            assert not ended, f"rasd launch ended without {count} line(s) matching {pattern!r}:\n{self.tail()}"
            return None

        return wait_until(found, timeout, 0.2, what=lambda: f"{count} line(s) matching {pattern!r}:\n{self.tail()}")

    def wait_for_records(self, folder: Path, predicate, count: int, timeout: float) -> list[dict]:
        """The JSON records of the job (``folder/*.jsonl``) that satisfy ``predicate``, once there are ``count``;
        fails at once if the launcher ends first."""

        def found() -> list[dict] | None:
            assert self.process.poll() is None, self.tail()
            matching = [item for item in records(folder) if predicate(item)]
            return matching if len(matching) >= count else None

        return wait_until(found, timeout, 0.5, what=lambda: f"{count} record(s):\n{self.tail()}")

    def pids(self) -> list[int]:
        """Every worker pid the launcher has named."""
        return [int(pid) for line in self.lines() for pid in re.findall(r"pid (\d+)", line)]

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired as error:
            raise AssertionError(f"rasd launch still runs after {timeout} s:\n{self.tail()}") from error

    def run_id(self) -> str:
        """``TORCHELASTIC_RUN_ID`` of the job, from the launcher's first line."""
        found = re.search(r"TORCHELASTIC_RUN_ID=(\S+);", self.err())
        assert found, self.tail()
        return found.group(1)

    def assert_nothing_left(self, timeout: float = 30) -> None:
        """No process of the job runs ``timeout`` s after the launcher ended: no worker, no monitor process, no
        store server (each inherits ``TORCHELASTIC_RUN_ID``; the store server's linger is 10 s)."""
        assert self.process.poll() is not None, "the launcher still runs"
        run_id = self.run_id()
        wait_until(
            lambda: not job_processes(run_id),
            timeout,
            0.5,
            what=lambda: f"every process of job {run_id} to end; left: {job_processes(run_id)}\n{self.tail()}",
        )

    def tail(self) -> str:
        return f"--- stderr ---\n{self.err()[-6000:]}\n--- stdout ---\n{self.out()[-3000:]}"

    def close(self) -> None:
        """Stop it if it still runs (SIGTERM, then SIGKILL), and any worker it left."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        for pid in self.pids():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def records(folder: Path) -> list[dict]:
    """The JSON lines every worker of a job wrote to ``folder/<pid>.jsonl`` (tests/launch/heal_job.py), by time; a
    line being written is left out."""
    found = []
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return sorted(found, key=lambda item: item["time"])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def job_processes(run_id: str) -> list[str]:
    """The living processes (not zombies) whose environment has ``TORCHELASTIC_RUN_ID=run_id``: ``pid command``."""
    marker = f"TORCHELASTIC_RUN_ID={run_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as file:
                if marker not in file.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if alive(int(name)):
            found.append(f"{name} {command[:200]}")
    return found
