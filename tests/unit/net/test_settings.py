"""Every TORCHRAS_* setting, given a value that cannot be used: never an exception into training, one WARNING line
that says what was wrong and what rasd does instead (docs/operations.md §1)."""

from __future__ import annotations

import logging
import os
import socket

import pytest

import rasd
from rasd.core.config import MIN_FACTOR, Timers
from rasd.net.runtime import mesh_host, mesh_port
from rasd.services import client_port
from rasd.services.client_port import client_address_setting, move_nccl_ras_port
from rasd.swarm import configure_logging
from rasd.swarm_services import member_services


class Warnings(list):
    def __call__(self, problem: str) -> None:
        self.append(problem)


@pytest.mark.parametrize(
    "name",
    [
        "TORCHRAS_TIMEOUT_FACTOR",
        "TORCHRAS_HANG_LIMIT",
        "TORCHRAS_STUCK_LIMIT",
        "TORCHRAS_STUCK_LIMIT_MAX",
        "TORCHRAS_BUSY_LIMIT",
    ],
)
@pytest.mark.parametrize("value", ["banana", "0", "-2", "nan", "inf", "1e999", "3 s"])
def test_a_timer_setting_that_is_not_a_usable_number_is_its_default(name, value):
    warnings = Warnings()
    assert Timers.from_env({name: value}, warn=warnings) == Timers()
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{name}={value!r} is not a number") and "using the default" in warnings[0]


def test_a_factor_too_small_to_run_is_the_default():
    warnings = Warnings()
    assert Timers.from_env({"TORCHRAS_TIMEOUT_FACTOR": str(MIN_FACTOR / 10)}, warn=warnings) == Timers()
    assert warnings == [
        f"TORCHRAS_TIMEOUT_FACTOR='{MIN_FACTOR / 10}' is not a number at least {MIN_FACTOR:g}; using the default, 1"
    ]
    assert Timers.from_env({"TORCHRAS_TIMEOUT_FACTOR": str(MIN_FACTOR)}).dead == pytest.approx(60 * MIN_FACTOR)


def test_a_fast_death_switch_that_is_neither_on_nor_off_is_on():
    warnings = Warnings()
    assert Timers.from_env({"TORCHRAS_FAST_DEATH": "maybe"}, warn=warnings).fast_death is True
    assert warnings == [
        "TORCHRAS_FAST_DEATH='maybe' is not a switch (1/true/yes/on or 0/false/no/off); using the default, on"
    ]


def test_one_bad_setting_leaves_the_good_ones_in_force():
    warnings = Warnings()
    t = Timers.from_env(
        {
            "TORCHRAS_TIMEOUT_FACTOR": "0.5",
            "TORCHRAS_HANG_LIMIT": "soon",
            "TORCHRAS_STUCK_LIMIT": "8",
            "TORCHRAS_FAST_DEATH": "0",
        },
        warn=warnings,
    )
    assert (t.hang, t.stuck, t.dead, t.fast_death) == (5.0, 4.0, 30.0, False)
    assert len(warnings) == 1 and "TORCHRAS_HANG_LIMIT" in warnings[0]


def test_good_values_say_nothing():
    warnings = Warnings()
    Timers.from_env(
        {
            "TORCHRAS_TIMEOUT_FACTOR": " 2 ",
            "TORCHRAS_HANG_LIMIT": "12.5",
            "TORCHRAS_STUCK_LIMIT": "",
            "TORCHRAS_FAST_DEATH": "Yes",
        },
        warn=warnings,
    )
    assert warnings == []


@pytest.mark.parametrize(
    "value, on",
    [("0", False), ("off", False), ("False", False), (" no ", False), ("1", True), ("", True), ("on", True)],
)
def test_enable_is_a_switch(value, on, caplog):
    with caplog.at_level(logging.WARNING, logger="rasd"):
        assert rasd.enabled({"TORCHRAS_ENABLE": value}) is on
    assert caplog.records == []


def test_an_enable_that_is_not_a_switch_leaves_rasd_on_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="rasd"):
        assert rasd.enabled({"TORCHRAS_ENABLE": "perhaps"}) is True
    assert [r.getMessage() for r in caplog.records] == [
        "rasd: TORCHRAS_ENABLE='perhaps' is not a switch (1/true/yes/on or 0/false/no/off); using the default, on"
    ]


@pytest.mark.parametrize("value", ["banana", "-1", "70000", "1.5"])
def test_a_mesh_port_that_is_not_a_port_is_the_kernels_choice(value, monkeypatch, caplog):
    monkeypatch.setenv("TORCHRAS_MESH_PORT", value)
    with caplog.at_level(logging.WARNING, logger="rasd"):
        assert mesh_port() == 0
    assert len(caplog.records) == 1 and "the kernel picks one" in caplog.records[0].getMessage()


@pytest.mark.parametrize("value", ["banana", "node17.example", "10.0.0", "::1::2"])
def test_a_mesh_host_that_is_not_an_ip_address_is_chosen_by_rasd(value, monkeypatch, caplog):
    monkeypatch.setenv("TORCHRAS_MESH_HOST", value)
    with caplog.at_level(logging.WARNING, logger="rasd"):
        assert mesh_host("127.0.0.1") == "127.0.0.1"  # the address this host uses to reach the store's
    assert [r.getMessage() for r in caplog.records] == [
        f"rasd: TORCHRAS_MESH_HOST={value!r} is not an IP address; the mesh listens on the address this host uses "
        "to reach the store"
    ]


@pytest.mark.parametrize("value, expected", [("10.1.2.3", "10.1.2.3"), (" ::1 ", "::1"), ("[fe80::1]", "fe80::1")])
def test_a_mesh_host_that_is_an_ip_address_is_used(value, expected, monkeypatch):
    monkeypatch.setenv("TORCHRAS_MESH_HOST", value)
    assert mesh_host("127.0.0.1") == expected


@pytest.mark.parametrize("addr", ["banana", "localhost", "localhost:0", "host:99999", "[::1"])
def test_a_client_address_that_is_not_one_is_the_default(addr):
    warnings = Warnings()
    assert client_address_setting(addr, {}, warnings) == (False, "localhost", 28028)
    assert len(warnings) == 1 and warnings[0].startswith("TORCHRAS_ADDR: bad address")
    assert warnings[0].endswith("serving on the default, localhost:28028")
    warnings.clear()
    assert client_address_setting("", {"TORCHRAS_DEFAULT_ADDR": addr}, warnings) == (False, "localhost", 28028)
    assert len(warnings) == 1 and warnings[0].startswith("TORCHRAS_DEFAULT_ADDR: bad address")


def test_good_client_addresses_and_off():
    warnings = Warnings()
    assert client_address_setting("[::1]:30000", {}, warnings) == (True, "::1", 30000)
    assert client_address_setting("", {"TORCHRAS_DEFAULT_ADDR": "127.0.0.1:29000"}, warnings) == (
        False,
        "127.0.0.1",
        29000,
    )
    assert client_address_setting("off", {"TORCHRAS_DEFAULT_ADDR": "junk"}, warnings) is None
    assert warnings == []


def test_nccl_ras_moves_off_the_port_we_fall_back_to():
    env = {"TORCHRAS_ADDR": "nonsense"}
    assert move_nccl_ras_port(env) == "localhost:28128"  # our client port falls back to 28028: NCCL's moves off


def test_swarm_settings_that_cannot_be_used_are_their_defaults(monkeypatch, caplog):
    monkeypatch.setenv("TORCHRAS_SWARM_SIZE", "many")
    monkeypatch.setenv("TORCHRAS_SWARM_EPOCH", "yesterday")
    monkeypatch.setenv("TORCHRAS_SWARM_STEP_S", "-1")
    with caplog.at_level(logging.WARNING, logger="rasd"):
        services = member_services(2)
    assert len(caplog.records) == 3
    assert {r.getMessage().split("=")[0] for r in caplog.records} == {
        "rasd swarm: TORCHRAS_SWARM_SIZE",
        "rasd swarm: TORCHRAS_SWARM_EPOCH",
        "rasd swarm: TORCHRAS_SWARM_STEP_S",
    }
    snapshot = services["local_data"]()  # a member of a job of 3 (its own index + 1), counting one step a second
    assert snapshot is not None


def test_a_log_level_that_is_not_one_is_warning(monkeypatch):
    monkeypatch.setenv("TORCHRAS_LOG_LEVEL", "basic_format")  # an attribute of logging, but no level
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        for handler in handlers:
            root.removeHandler(handler)
        configure_logging(0)
        assert root.level == logging.WARNING
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


# ---- starting the node: real sockets, no exception, one line, and the job goes on -------------------------------


@pytest.fixture
def fresh(monkeypatch):
    """No node runs before or after; every setting of the test is the environment's."""
    rasd.stop(goodbye=False)  # one node per process: none left by an earlier test of the suite
    monkeypatch.setenv("TORCHRAS_SECRET", "test-secret")
    monkeypatch.setenv("TORCHRAS_MESH_HOST", "127.0.0.1")
    yield
    rasd.stop(goodbye=False)


def rasd_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rasd" and r.levelno >= logging.WARNING]


def test_an_address_that_is_not_this_hosts_runs_without_ras(fresh, monkeypatch, caplog):
    monkeypatch.setenv("TORCHRAS_MESH_HOST", "203.0.113.7")  # TEST-NET-3: on no interface of this machine
    with caplog.at_level(logging.WARNING, logger="rasd"):
        assert rasd.start() is None
    assert rasd_warnings(caplog) == [
        "rasd: cannot listen for the mesh on 203.0.113.7:0, set by TORCHRAS_MESH_HOST "
        "(Cannot assign requested address); this process runs without RAS"
    ]
    assert rasd.node() is None


def test_a_mesh_port_that_is_taken_runs_without_ras(fresh, monkeypatch, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("TORCHRAS_MESH_PORT", str(port))
        with caplog.at_level(logging.WARNING, logger="rasd"):
            assert rasd.start() is None
    (line,) = rasd_warnings(caplog)
    assert line.startswith(
        f"rasd: cannot listen for the mesh on 127.0.0.1:{port}, set by TORCHRAS_MESH_HOST and TORCHRAS_MESH_PORT ("
    ) and line.endswith("); this process runs without RAS")


class BrokenStore:
    """A store whose every call fails, as one whose server went away does."""

    def add(self, key: str, amount: int) -> int:
        raise RuntimeError("store server gone")

    set = get = wait = add


def test_a_store_that_fails_runs_without_ras_and_leaves_nothing_behind(fresh, monkeypatch, caplog, tmp_path):
    """The store fails after the mesh and client ports are open: both close, and the endpoint file goes."""
    monkeypatch.setenv("TORCHRAS_ADDR", f"127.0.0.1:{_free_port()}")
    monkeypatch.setenv("TORCHRAS_RUN_DIR", str(tmp_path))
    before = _open_sockets()
    with caplog.at_level(logging.WARNING, logger="rasd"):
        assert rasd.start(BrokenStore(), services=[client_port.serve]) is None
    assert rasd_warnings(caplog) == [
        "rasd: could not join the job through the store (RuntimeError: store server "
        "gone); this process runs without RAS"
    ]
    assert _open_sockets() <= before
    assert list(tmp_path.glob("*.json")) == []
    assert rasd.node() is None


def test_everything_wrong_at_once_still_starts_the_node(fresh, monkeypatch, caplog, tmp_path):
    """Every setting that has a default falls back to it, each with its own line, and the node runs."""
    bad = {
        "TORCHRAS_ENABLE": "perhaps",
        "TORCHRAS_TIMEOUT_FACTOR": "fast",
        "TORCHRAS_HANG_LIMIT": "-1",
        "TORCHRAS_STUCK_LIMIT": "inf",
        "TORCHRAS_FAST_DEATH": "2",
        "TORCHRAS_MESH_PORT": "port",
        "TORCHRAS_ADDR": "127.0.0.1",
        "TORCHRAS_DEFAULT_ADDR": f"127.0.0.1:{_free_port()}",
        "TORCHRAS_RUN_DIR": str(tmp_path / "run"),
    }
    for name, value in bad.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="rasd"):
        node = rasd.start(services=[client_port.serve])
        assert node is not None and node.running
        assert node.client_address == ("127.0.0.1", int(bad["TORCHRAS_DEFAULT_ADDR"].split(":")[1]))
    lines = rasd_warnings(caplog)
    for name in (
        "TORCHRAS_ENABLE",
        "TORCHRAS_TIMEOUT_FACTOR",
        "TORCHRAS_HANG_LIMIT",
        "TORCHRAS_STUCK_LIMIT",
        "TORCHRAS_FAST_DEATH",
        "TORCHRAS_MESH_PORT",
        "TORCHRAS_ADDR",
    ):
        assert len([line for line in lines if f"{name}" in line.split(";")[0]]) == 1, (name, lines)
    assert len(lines) == 7, lines


def test_a_run_dir_that_cannot_be_made_leaves_the_node_without_a_client_port(fresh, monkeypatch, caplog, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TORCHRAS_RUN_DIR", str(blocker / "endpoints"))  # under a regular file
    monkeypatch.setenv("TORCHRAS_ADDR", f"127.0.0.1:{_free_port()}")
    with caplog.at_level(logging.WARNING, logger="rasd"):
        node = rasd.start(services=[client_port.serve])
    assert node is not None and node.running and node.client_address is None
    (line,) = rasd_warnings(caplog)
    assert line.startswith("rasd: no client port (") and str(blocker) in line
    assert line.endswith("the RAS node runs without one")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _open_sockets() -> set[int]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                out.add(int(fd))
        except OSError:
            pass
    return out


def test_the_idle_and_busy_limits_are_read_and_scaled():
    timers = Timers.from_env(
        {
            "TORCHRAS_STUCK_LIMIT": "2",
            "TORCHRAS_STUCK_LIMIT_MAX": "30",
            "TORCHRAS_BUSY_LIMIT": "900",
            "TORCHRAS_TIMEOUT_FACTOR": "0.5",
        }
    )
    assert (timers.stuck, timers.stuck_max, timers.busy) == (1.0, 15.0, 450.0)
