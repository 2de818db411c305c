"""``rasd launch``'s pure parts: its command line against torchrun's own parser, the workers' environment, where
output goes, the respawn rules, the job's status. No process is started.
"""

from __future__ import annotations

import os
import signal
import string

import pytest

from torchras.launch import args as launch_args, environment, output, startup, status, workers

torch_run = pytest.importorskip("torch.distributed.run")

#: Command lines as users type them for torchrun (the options issue 25 lists, in both spellings).
COMMAND_LINES = [
    ["train.py"],
    ["--nproc-per-node", "4", "train.py", "--lr", "0.1"],
    [
        "--nproc_per_node=2",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29600",
        "t.py",
    ],
    ["--nnodes=1:4", "--rdzv-backend=c10d", "--rdzv-endpoint=host:29400", "--rdzv-id=job7", "t.py"],
    ["--standalone", "--nproc-per-node=3", "-m", "my.module", "--flag"],
    ["--no-python", "--nproc-per-node", "2", "/bin/echo", "hello", "--nproc-per-node", "9"],
    ["--log-dir", "/tmp/logs", "--redirects", "3", "--tee", "0:1,1:2", "--local-ranks-filter", "0,1", "t.py"],
    ["-r", "1", "-t", "2", "--local_ranks_filter=1", "--log_dir=/x", "--master_addr=h", "--master_port=1", "t.py"],
    ["--max-restarts", "3", "--monitor-interval", "1", "--role", "trainer", "--rdzv-conf", "timeout=60", "t.py"],
    ["--node_rank=0", "--rdzv_endpoint=[::1]:29400", "--run-path", "/abs/t.py", "a", "b"],
    ["--shutdown-timeout", "5", "--signals-to-handle", "SIGTERM,SIGUSR1", "--virtual-local-rank", "t.py"],
]
#: Every option both parsers share, by its destination name.
SHARED = [
    "nnodes",
    "nproc_per_node",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "standalone",
    "max_restarts",
    "monitor_interval",
    "start_method",
    "role",
    "module",
    "no_python",
    "run_path",
    "log_dir",
    "redirects",
    "tee",
    "local_ranks_filter",
    "node_rank",
    "master_addr",
    "master_port",
    "local_addr",
    "signals_to_handle",
    "shutdown_timeout",
    "virtual_local_rank",
    "training_script",
    "training_script_args",
]


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=lambda argv: " ".join(argv)[:60])
def test_every_option_parses_as_torchrun_parses_it(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)
    ours = launch_args.parser().parse_args(argv)
    theirs = torch_run.get_args_parser().parse_args(argv)
    assert {name: getattr(ours, name) for name in SHARED} == {name: getattr(theirs, name) for name in SHARED}


def test_every_torchrun_option_is_accepted() -> None:
    """A command line written for torchrun never fails here for an option rasd launch lacks."""
    ours = {option for action in launch_args.parser()._actions for option in action.option_strings}
    theirs = {option for action in torch_run.get_args_parser()._actions for option in action.option_strings}
    assert theirs <= ours, theirs - ours


def test_options_left_out_come_from_pet_variables_as_in_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MASTER_PORT", "31000")
    monkeypatch.setenv("PET_STANDALONE", "1")
    ours = launch_args.parser().parse_args(["t.py"])
    theirs = torch_run.get_args_parser().parse_args(["t.py"])
    for name in ("nproc_per_node", "master_port", "standalone"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert (ours.nproc_per_node, ours.standalone) == ("3", True)


@pytest.mark.parametrize("value", ["1", "4", "cpu", "auto"])
def test_nproc_per_node_resolves_as_torchrun_resolves_it(value: str) -> None:
    assert launch_args.local_world_size(value) == torch_run.determine_local_world_size(value)


@pytest.mark.parametrize("value", ["1", "1:1", "2:4", "3"])
def test_nnodes_parse_as_torchrun_parses_them(value: str) -> None:
    assert launch_args.parse_nnodes(value) == torch_run.parse_min_max_nnodes(value)


@pytest.mark.parametrize("value", ["0", "1", "2", "3", "0:1,1:2", "1:3", "0:3,2:1,3:2"])
def test_redirects_and_tee_map_as_torchrun_maps_them(value: str) -> None:
    from torch.distributed.elastic.multiprocessing.api import Std, to_map

    theirs = {rank: int(std) for rank, std in to_map(Std.from_str(value), 4).items()}
    assert launch_args.parse_std(value, 4) == theirs


@pytest.mark.parametrize("endpoint", ["", "host", "host:1234", "[::1]:29400", "10.0.0.1:5", "[fe80::1]"])
def test_endpoints_parse_as_torchrun_parses_them(endpoint: str) -> None:
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    assert launch_args.parse_endpoint(endpoint, 29400) == parse_rendezvous_endpoint(endpoint, 29400)


def _plan(*argv: str) -> launch_args.Plan:
    return launch_args.resolve(launch_args.parser().parse_args(list(argv)))


def test_the_rendezvous_is_decided_as_torchrun_decides_it() -> None:
    standalone = _plan("--standalone", "--rdzv-id", "mine", "t.py")
    assert (standalone.backend, standalone.store_port, standalone.node_rank) == ("c10d", 0, 0)
    assert standalone.run_id != "mine"  # torchrun: a fresh uuid, whatever was given
    one_node = _plan("t.py")  # no --master-port on one node: torchrun goes standalone too
    assert (one_node.backend, one_node.store_port) == ("c10d", 0)
    static = _plan("--master-addr", "10.1.1.1", "--master-port", "29601", "--nproc-per-node", "2", "t.py")
    assert (static.backend, static.store_host, static.store_port, static.run_id) == (
        "static",
        "10.1.1.1",
        29601,
        "none",
    )
    two = _plan("--nnodes", "2", "--node-rank", "1", "t.py")
    assert (two.backend, two.store_port, two.node_rank, two.world_size) == ("static", 29500, 1, 2)
    c10d = _plan("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h", "--rdzv-id", "j", "t.py")
    assert (c10d.store_host, c10d.store_port, c10d.node_rank, c10d.run_id) == ("h", 29400, None, "j")


def test_the_worker_command_is_torchruns() -> None:
    import sys

    assert _plan("t.py", "--a", "1").command == (sys.executable, "-u", "t.py", "--a", "1")
    assert _plan("-m", "pkg.mod", "x").command == (sys.executable, "-u", "-m", "pkg.mod", "x")
    assert _plan("--no-python", "/bin/echo", "hi").command == ("/bin/echo", "hi")
    with pytest.raises(ValueError, match="--no-python"):
        _plan("--no-python", "-m", "pkg")


def test_what_torchrun_refuses_is_refused() -> None:
    for argv in (["--nnodes", "3:2", "t.py"], ["--redirects", "7", "t.py"], ["--local-ranks-filter", "a", "t.py"]):
        with pytest.raises(ValueError):
            _plan(*argv)
    with pytest.raises(ValueError, match="node-rank"):
        _plan("--nnodes", "2", "--node-rank", "2", "t.py")


def test_options_rasd_launch_does_not_use_are_named_once() -> None:
    plan = _plan("--max-restarts", "2", "--start-method", "fork", "t.py")
    assert plan.ignored == ("--start-method",) and plan.max_restarts == 2  # one node: torchrun's group restarts
    several = _plan("--nnodes", "2", "--master-port", "29500", "--max-restarts", "2", "t.py")
    assert several.ignored == ("--max-restarts",) and several.max_restarts == 0
    assert _plan("t.py").ignored == ()


# ---- the environment ----------------------------------------------------------------------------------------


def _environment(plan: launch_args.Plan, base: dict[str, str], **overrides: object) -> dict[str, str]:
    fields: dict = dict(
        local_rank=1,
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=29500,
        run_id="job",
        error_file="/e.json",
        events_file="/ev.jsonl",
        newcomer=False,
    )
    fields.update(overrides)
    return environment.worker_environment(plan, base, **fields)


def test_a_worker_gets_torchruns_variables() -> None:
    plan = _plan("--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "4", "--role", "trainer", "t.py")
    env = _environment(plan, {"PATH": "/bin"})
    assert {name: env[name] for name in env if name != "PATH"} == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "ROLE_RANK": "5",
        "ROLE_NAME": "trainer",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "job",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": "/e.json",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
        "TORCHRAS_LAUNCH_EVENTS": "/ev.jsonl",
        "INPROCESS_JOINING": environment.JOINING_DEFAULT,
    }


def test_a_replacement_joins_and_keeps_everything_the_wrapper_finds_the_job_by() -> None:
    plan = _plan("--nproc-per-node", "2", "--master-port", "29500", "t.py")
    first = _environment(plan, {"INPROCESS_JOIN": "1"})
    again = _environment(plan, {}, newcomer=True)
    assert "INPROCESS_JOIN" not in first  # an inherited one is not for the initial workers
    assert again["INPROCESS_JOIN"] == "1"
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "RANK"):
        assert again[name] == first[name], name


def test_the_users_settings_win_and_no_respawns_means_no_joining() -> None:
    plan = _plan("--nproc-per-node", "2", "t.py")
    env = _environment(plan, {"OMP_NUM_THREADS": "8", "INPROCESS_JOINING": "0"})
    assert (env["OMP_NUM_THREADS"], env["INPROCESS_JOINING"]) == ("8", "0")
    assert "INPROCESS_JOINING" not in _environment(_plan("--max-respawns", "0", "t.py"), {})


def test_virtual_local_rank_gives_each_worker_one_device() -> None:
    plan = _plan("--virtual-local-rank", "--nproc-per-node", "2", "t.py")
    env = _environment(plan, {"CUDA_VISIBLE_DEVICES": "4,6"}, local_rank=1, node_rank=0)
    assert (env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "6")


def test_the_joining_a_launcher_asks_for_is_read_by_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    from inprocess.elastic import Joining

    monkeypatch.setenv("INPROCESS_JOINING", environment.JOINING_DEFAULT)
    assert Joining.from_environment() == Joining(last_call=0.2)
    monkeypatch.setenv("INPROCESS_JOINING", "1")
    assert Joining.from_environment() == Joining()
    for off in ("0", "", "nonsense=3", "last_call=-1"):
        monkeypatch.setenv("INPROCESS_JOINING", off)
        assert Joining.from_environment() is None


# ---- output ---------------------------------------------------------------------------------------------------


def test_streams_go_where_torchrun_sends_them() -> None:
    redirects, tee = launch_args.parse_std("0:1", 3), launch_args.parse_std("1:3", 3)
    rank0 = output.destinations(0, redirects, tee, None, "/d")
    assert rank0[1] == output.Destination(console=False, file="/d/stdout.log", pipe=False)
    assert rank0[2] == output.Destination(console=True, file=None, pipe=True)
    rank1 = output.destinations(1, redirects, tee, None, "/d")
    assert rank1[1] == output.Destination(console=True, file="/d/stdout.log", pipe=True)
    hidden = output.destinations(1, redirects, tee, frozenset({0}), "/d")  # filtered: the file only
    assert hidden[1] == output.Destination(console=False, file="/d/stdout.log", pipe=False)
    assert output.destinations(2, redirects, tee, frozenset({0}), "/d")[1] == output.Destination(False, None, False)


def test_the_prefix_is_torchruns_or_its_template() -> None:
    assert output.prefix("default", 5, 1, template="") == b"[default1]:"
    template = "[${role_name} ${rank}/${local_rank}] "
    assert (
        output.prefix("t", 5, 1, template=template)
        == string.Template(template).substitute(role_name="t", rank=5, local_rank=1).encode()
    )


class _Recorder(output.Console):
    def __init__(self) -> None:
        self.lines: list[tuple[int, bytes]] = []

    def line(self, stream: int, data: bytes) -> None:
        self.lines.append((stream, data))


def test_a_stream_shows_whole_lines_and_holds_a_partial_one() -> None:
    console = _Recorder()
    stream = output.Stream(console, 1, b"[p]:", None)
    stream.feed(b"one\ntw", 10.0)
    stream.feed(b"o\nthr", 10.5)
    assert console.lines == [(1, b"[p]:one"), (1, b"[p]:two")]
    assert stream.due() == 10.5 + output.PARTIAL_LINE_S
    stream.flush()
    assert console.lines[-1] == (1, b"[p]:thr") and stream.due() is None
    stream.feed(b"x" * output.MAX_LINE, 11.0)  # too long to hold
    assert console.lines[-1] == (1, b"[p]:" + b"x" * output.MAX_LINE)


# ---- respawns and status ---------------------------------------------------------------------------------------


def _decide(returncode: int = -9, **overrides: object) -> workers.Decision:
    fields: dict = dict(
        respawns_done=0,
        max_respawns=3,
        respawn_backoff=1.0,
        stopping=False,
        refused=False,
        completed=False,
        heals=True,
        gave_up=False,
        job_gave_up=False,
    )
    fields.update(overrides)
    return workers.decide(returncode, **fields)


def test_a_dead_worker_is_respawned_at_once_then_with_a_growing_back_off() -> None:
    assert [(d.respawn, d.delay) for d in (_decide(respawns_done=n) for n in range(4))] == [
        (True, 0.0),
        (True, 1.0),
        (True, 2.0),
        (False, 0.0),
    ]
    assert "--max-respawns 3" in _decide(respawns_done=3).reason


def test_a_worker_the_job_excluded_is_respawned_however_it_ends() -> None:
    """A hung worker the Wrapper excluded, ended by the launcher, may resume and leave cleanly (exit 0): it is
    respawned all the same, so the world grows back (the demo's ``--inject stop``)."""
    assert _decide(0, excluded=True).respawn
    assert _decide(-9, excluded=True).respawn
    assert not _decide(0, excluded=True, completed=True).respawn


@pytest.mark.parametrize(
    ("returncode", "overrides", "because"),
    [
        (0, {}, "finished"),
        (1, {"stopping": True}, "stopping"),
        (1, {"refused": True}, "completed when it asked"),
        (1, {"completed": True}, "has completed"),
        (1, {"max_respawns": 0}, "--max-respawns 0"),
        (1, {"heals": False}, "nothing could admit"),
    ],
)
def test_a_worker_is_not_respawned_when(returncode: int, overrides: dict, because: str) -> None:
    decision = _decide(returncode, **overrides)
    assert not decision.respawn and because in decision.reason


@pytest.mark.parametrize("returncode", [1, 0, -9, 3])
def test_a_worker_whose_wrapper_gave_up_is_not_respawned_whatever_its_exit(returncode: int) -> None:
    """Respawns left, a job that heals, nothing stopping: a Wrapper that gave up still ends its worker's slot."""
    decision = _decide(returncode, gave_up=True, job_gave_up=True)
    assert (decision.respawn, decision.reason) == (False, "not respawned: its Wrapper gave up")


def test_once_the_job_gave_up_no_worker_is_respawned_and_before_a_crash_is_respawned_as_ever() -> None:
    after = _decide(-9, job_gave_up=True)  # another worker's Wrapper gave up: this one's crash is not healed
    assert (after.respawn, after.reason) == (False, "not respawned: the job gave up")
    before = _decide(-9)  # no Wrapper gave up: a crash is respawned, at once, as before
    assert (before.respawn, before.delay, before.reason) == (True, 0.0, "respawning it (1 of 3)")
    assert _decide(1, respawns_done=1).respawn  # an exception the Wrapper left on, without giving up: respawned


def _exit(code: int, when: float, **fields: bool) -> status.Exit:
    return status.Exit(0, 100, code, when, **fields)


def test_the_job_status() -> None:
    done = _exit(0, 10.0, completed=True)
    assert status.job_status([done, _exit(0, 11.0, completed=True)]) == 0
    assert status.job_status([_exit(-9, 1.0), done]) == 0  # survived: the job completed after it
    # The final world is the workers whose call completed: one that never completed and failed after the end was
    # outside it (a hung worker the job excluded, a replacement still waiting), one of it that failed is the job's.
    assert status.job_status([done, _exit(3, 12.0)]) == 0
    assert status.job_status([done, _exit(3, 12.0, completed=True)]) == 3  # a rank of the final world, in teardown
    # What the launcher ended itself (a start-up restart of the group, an excluded worker) never counts...
    assert status.job_status([_exit(-9, 1.0, by_launcher=True), done]) == 0
    assert status.job_status([_exit(-9, 1.0), _exit(-9, 1.1, by_launcher=True)]) == 137
    # ... unless nothing completed and it is all there is: the job did not finish, so not 0.
    assert status.job_status([_exit(-15, 1.0, by_launcher=True), _exit(0, 2.0)]) == 143
    assert status.job_status([_exit(-9, 1.0), _exit(1, 2.0)]) == 137  # nothing completed: the first failure
    assert status.job_status([_exit(0, 1.0), _exit(-9, 2.0)]) == 137  # exit 0 without completing: left early
    assert status.job_status([_exit(1, 1.0, refused=True), done]) == 0  # a replacement that came too late
    assert status.job_status([_exit(3, 1.0), _exit(0, 2.0)], wrapped=False) == 3  # no Wrapper: as torchrun
    assert status.job_status([done], interrupted_by=signal.SIGTERM) == 143
    # The job gave up (a worker's Wrapper said so): never 0; the first code of a worker that gave up, as it exited.
    gave_up = [_exit(1, 5.0, gave_up=True), _exit(1, 5.1, gave_up=True)]
    assert status.job_status(gave_up, gave_up=True) == 1
    assert status.job_status([_exit(-9, 1.0), _exit(2, 5.0, gave_up=True)], gave_up=True) == 2  # not the kill's
    assert status.job_status([_exit(0, 5.0, gave_up=True)], gave_up=True) == 1  # it caught RestartAbort: still 1
    assert status.job_status([_exit(-9, 1.0), _exit(0, 5.0, gave_up=True)], gave_up=True) == 137
    assert status.job_status([done, _exit(1, 12.0, gave_up=True)], gave_up=True) == 1  # completed elsewhere: no 0
    assert status.job_status(gave_up, interrupted_by=signal.SIGINT, gave_up=True) == 130  # a signal still wins
    assert status.describe(-9) == "killed by SIGKILL" and status.describe(2) == "exit code 2"


def test_a_wrapper_that_gave_up_ends_the_job_for_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the launcher does with ``gave_up`` (no process: the workers are stand-ins): the pending respawns are
    cancelled, a replacement still waiting to be admitted is asked to leave, the others are left alone, and the
    reason is kept for the last line."""
    import types

    from torchras.launch import main as launch_main

    _, plan = launch_args.parse(["--nproc-per-node", "4", "--shutdown-timeout", "7", "train.py"])
    launcher = launch_main.Launcher(plan)
    signals: list[tuple[int, int]] = []

    def worker(pid: int, newcomer: bool) -> workers.Worker:
        process = types.SimpleNamespace(pid=pid, poll=lambda: None)
        made = workers.Worker(process, {}, newcomer, 0.0)  # type: ignore[arg-type]
        monkeypatch.setattr(made, "signal_group", lambda signum: signals.append((pid, signum)))
        return made

    first, waiting, admitted = worker(101, False), worker(102, True), worker(103, True)
    launcher.slots = [
        workers.Slot(0, 0, first),
        workers.Slot(1, 1, None, respawns=1, respawn_at=1e12),  # a replacement due later: never started now
        workers.Slot(2, 2, waiting),
        workers.Slot(3, 3, admitted),
    ]
    try:
        launcher._announced(launcher.slots[3], {"event": "joined", "pid": 103, "rank": 1, "world_size": 3})
        reason = "RestartAbort: state.iteration=2 self.max_iterations=2\nmore"
        launcher._announced(launcher.slots[0], {"event": "gave_up", "pid": 101, "reason": reason})
        launcher._announced(launcher.slots[3], {"event": "gave_up", "pid": 103, "reason": "another"})
        launcher._stop_waiting_replacements()
    finally:
        os.close(launcher._wake_read)
        os.close(launcher._wake_write)
    assert first.gave_up and admitted.gave_up and not waiting.gave_up
    assert (
        launcher.gave_up
        == "worker 0's inprocess.Wrapper, pid 101: RestartAbort: state.iteration=2 self.max_iterations=2"
    )
    assert launcher.slots[1].respawn_at is None
    assert signals == [(102, signal.SIGTERM), (102, signal.SIGCONT)]  # only the one nothing will admit
    assert waiting.kill_at is not None and first.kill_at is None and admitted.kill_at is None


# ---- the worker's side, and the layers -------------------------------------------------------------------------


def test_a_worker_announces_whole_lines_and_never_raises(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from inprocess import launch_events
    from torchras_formats.launch_events import Completed, Iteration, Joined, Wrapper

    monkeypatch.delenv(launch_events.ENVIRONMENT, raising=False)
    # No launcher: nothing written, nothing raised.
    launch_events.announce(Wrapper(joining=True, newcomer=False, initial_rank=0))
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv(launch_events.ENVIRONMENT, str(path))
    launch_events.announce(Joined(rank=3, world_size=4, iteration=1))
    launch_events.announce(Completed(iteration=2))
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert (first["event"], first["rank"], first["world_size"], first["pid"]) == ("joined", 3, 4, os.getpid())
    assert second["event"] == "completed"
    monkeypatch.setenv(launch_events.ENVIRONMENT, str(tmp_path))  # a folder: the write fails, training does not
    launch_events.announce(Iteration(iteration=1, rank=0, world_size=1))


def test_a_worker_lost_before_the_first_round_restarts_the_group_only_under_the_wrapper() -> None:
    """``torchras.launch.startup``: the group restarts for a job of Wrapper workers; without a word from them yet
    the verdict waits (bounded), and a job nobody said runs the Wrapper keeps the usual rules (a plain script)."""
    base = dict(started=False, nnodes=1, max_respawns=3, newcomer=False, ending=False)
    assert startup.eligible(**base)
    for change in ({"started": True}, {"nnodes": 2}, {"max_respawns": 0}, {"newcomer": True}, {"ending": True}):
        assert not startup.eligible(**{**base, **change}), change
    verdict = startup.Verdict
    assert startup.classify(wrapper_built=True, others_alive=True, deadline_passed=False) is verdict.RESTART
    assert startup.classify(wrapper_built=True, others_alive=False, deadline_passed=True) is verdict.RESTART
    assert startup.classify(wrapper_built=False, others_alive=True, deadline_passed=False) is verdict.WAIT
    assert startup.classify(wrapper_built=False, others_alive=True, deadline_passed=True) is verdict.PLAIN
    assert startup.classify(wrapper_built=False, others_alive=False, deadline_passed=False) is verdict.PLAIN


def test_a_worker_stuck_before_the_start_up_barrier_is_stopped_long_enough_or_idle_while_others_wait() -> None:
    """``startup.stuck``: stopped (SIGSTOP) for STOPPED_S whatever the others do; idle (no CPU, no byte) for IDLE_S
    only while another worker already waits in the start-up barrier (before that, everyone may still import)."""
    assert startup.stuck(stopped_for=startup.STOPPED_S, idle_for=0.0, others_wait=False) == (
        "has been stopped (SIGSTOP) for 10 s"
    )
    assert startup.stuck(stopped_for=startup.STOPPED_S - 0.1, idle_for=0.0, others_wait=True) is None
    assert startup.stuck(stopped_for=0.0, idle_for=startup.IDLE_S, others_wait=False) is None
    idle = startup.stuck(stopped_for=0.0, idle_for=startup.IDLE_S, others_wait=True)
    assert idle is not None and idle.startswith("has used no CPU and read or written nothing for 30 s"), idle
    assert startup.stuck(stopped_for=0.0, idle_for=startup.IDLE_S - 0.1, others_wait=True) is None


def test_a_worker_is_seen_stopped_and_idle_and_a_busy_one_is_not() -> None:
    """``Worker.observe`` on real children: a stopped one is stopped and idle; a sleeping one is idle; one that
    computes or writes is active whenever it is read."""
    import subprocess
    import sys
    import time

    def child(code: str) -> workers.Worker:
        process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
        return workers.Worker(process, {}, newcomer=False, started=time.time())

    sleeper, busy = child("import time; time.sleep(60)"), child("while True: print('x', flush=True)")
    try:
        time.sleep(1.0)  # both started Python
        for worker in (sleeper, busy):
            worker.observe(0.0)
        os.kill(sleeper.pid, signal.SIGSTOP)
        time.sleep(0.5)
        for worker in (sleeper, busy):
            worker.observe(5.0)
        assert sleeper.stopped_for(15.0) == 10.0 and sleeper.idle_for(15.0) == 15.0
        assert busy.stopped_for(15.0) == 0.0 and busy.idle_for(15.0) == 10.0  # active at the last reading, t = 5
        os.kill(sleeper.pid, signal.SIGCONT)
        sleeper.observe(20.0)
        assert sleeper.stopped_for(25.0) == 0.0
    finally:
        for worker in (sleeper, busy):
            worker.process.kill()
            worker.process.wait()


def test_a_replacement_that_timed_out_waiting_to_join_is_not_respawned() -> None:
    common = dict(respawns_done=0, max_respawns=3, respawn_backoff=1.0, stopping=False, refused=False, heals=True)
    assert workers.decide(1, completed=False, **common).respawn
    decision = workers.decide(1, completed=False, join_timed_out=True, **common)
    assert not decision.respawn and "join timeout" in decision.reason
