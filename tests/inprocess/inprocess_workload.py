"""One rank of a test job: a gloo training loop inside ``inprocess.Wrapper``, faults injected on cue.

Configured by the JSON in ``INPROCESS_TEST_SCENARIO``; reports JSON lines to ``out`` (``{rank}`` = initial rank).
Not a test module itself: ``tests/inprocess/inprocess_jobs.py`` launches it.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the polling helper
from polling import poll

SCENARIO = json.loads(os.environ["INPROCESS_TEST_SCENARIO"])
INITIAL_RANK = int(os.environ["RANK"])
OUT = open(SCENARIO["out"].format(rank=INITIAL_RANK), "a", buffering=1)  # noqa: SIM115 - one line per event until exit


def emit(**fields: object) -> None:
    fields.setdefault("initial_rank", INITIAL_RANK)
    fields.setdefault("time", time.time())
    OUT.write(json.dumps(fields) + "\n")


if os.environ.get("INPROCESS_TEST_LOG"):
    import logging

    logging.basicConfig(level=logging.DEBUG, format="%(asctime)s.%(msecs)03d %(name)s %(message)s", datefmt="%H:%M:%S")
elif SCENARIO.get("log_levels"):  # {"logger name": "LEVEL"}: what a test reads back from the rank's stderr
    import logging

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s.%(msecs)03d %(name)s %(message)s", datefmt="%H:%M:%S"
    )
    for name, level in SCENARIO["log_levels"].items():
        logging.getLogger(name).setLevel(level)

import torch  # noqa: E402 - after the logging set-up
import torch.distributed as dist  # noqa: E402 - after the logging set-up

import inprocess  # noqa: E402 - after the logging set-up
from inprocess import rank_assignment as ra  # noqa: E402 - after the logging set-up


def wrapper_kwargs() -> dict:
    seconds = datetime.timedelta(seconds=1)
    # "wrapper_by_rank": {"<initial rank>": {...}} overrides "wrapper" on one rank (e.g. its own hard timeout).
    settings = dict(SCENARIO.get("wrapper", {}), **SCENARIO.get("wrapper_by_rank", {}).get(str(INITIAL_RANK), {}))
    kwargs: dict = dict(
        store_kwargs={"port": SCENARIO["wrapper_port"], "timeout": 60 * seconds},
        monitor_thread_interval=settings.get("monitor_thread_interval", 0.1) * seconds,
        monitor_process_interval=settings.get("monitor_process_interval", 0.1) * seconds,
        progress_watchdog_interval=settings.get("progress_watchdog_interval", 0.1) * seconds,
        heartbeat_interval=settings.get("heartbeat_interval", 0.5) * seconds,
        heartbeat_timeout=settings.get("heartbeat_timeout", 20) * seconds,
        soft_timeout=settings.get("soft_timeout", 20) * seconds,
        hard_timeout=settings.get("hard_timeout", 30) * seconds,
        barrier_timeout=settings.get("barrier_timeout", 60) * seconds,
        completion_timeout=60 * seconds,
        last_call_wait=settings.get("last_call_wait", 0.1) * seconds,
        termination_grace_time=0.5 * seconds,
        monitor_process_pidfile=SCENARIO["pidfile"],
        monitor_process_logfile=SCENARIO.get("logfile"),
    )
    if SCENARIO.get("etcd"):  # the Wrapper's store on an etcd cluster (tests/inprocess/etcd_cluster.py)
        from inprocess.etcd_store import EtcdStore

        kwargs["store_factory"] = EtcdStore
        kwargs["store_kwargs"] = dict(SCENARIO["etcd"], timeout=60 * seconds)
    if "max_iterations" in settings:
        kwargs["initialize"] = inprocess.initialize.RetryController(max_iterations=settings["max_iterations"])
    if "max_active" in settings:
        kwargs["rank_assignment"] = inprocess.Compose(ra.MaxActiveWorldSize(settings["max_active"]), ra.ShiftRanks())
    return kwargs


def faults_now(call: int, iteration: int, step: int) -> list[dict]:
    return [
        fault
        for fault in SCENARIO.get("faults", [])
        if fault["iteration"] == iteration
        and fault["rank"] == INITIAL_RANK
        and fault["step"] == step
        and fault.get("call", 0) == call
    ]


def report_verdicts(call_wrapper: inprocess.CallWrapper, fault: dict) -> None:
    from inprocess.fault_source import ExternalVerdict, report_fault

    time.sleep(fault.get("delay", 0.5))
    verdict = ExternalVerdict(
        iteration=call_wrapper.iteration,
        ranks=frozenset(fault["victims"]),
        reason="injected by the test",
        kind=fault.get("verdict_kind", "PEER_HUNG"),
    )
    first = report_fault(verdict)
    again = report_fault(verdict)  # idempotent
    emit(event="verdict", first=first, again=again, iteration=verdict.iteration)
    poll(lambda: call_wrapper.iteration != verdict.iteration, 120, 0.05)  # the restart it caused
    stale = ExternalVerdict(iteration=verdict.iteration, ranks=frozenset(fault["stale_victims"]), kind="PEER_DEAD")
    emit(event="stale_verdict", applied=report_fault(stale))
    future = ExternalVerdict(iteration=call_wrapper.iteration + 5, ranks=frozenset(fault["stale_victims"]))
    emit(event="future_verdict", applied=report_fault(future))
    time.sleep(0.3)  # time for a wrongly applied stale or future verdict to restart the job (the test says none does)
    stuck = ExternalVerdict(
        iteration=call_wrapper.iteration,
        ranks=frozenset(fault["stale_victims"]),
        kind="COMM_STUCK",
        reason="injected by the test",
    )
    emit(event="stuck_verdict", applied=report_fault(stuck), iteration=stuck.iteration)


def inject(fault: dict, call_wrapper: inprocess.CallWrapper) -> None:
    kind = fault["kind"]
    emit(event="fault", kind=kind, iteration=call_wrapper.iteration)
    if kind == "exception":
        time.sleep(fault.get("delay", 0))
        raise RuntimeError("injected fault")
    if kind == "leave":  # a BaseException: this rank leaves the wrapper, the others go on without it
        raise SystemExit(5)
    if kind == "kill_store_server":  # the Wrapper's store server process (inprocess.store_server) dies
        from inprocess.store_server import SERVER_KEY

        raw_store = call_wrapper.base_store.base_store  # the call's namespace sits on the server's root
        os.kill(int(raw_store.get(SERVER_KEY).split()[0]), signal.SIGKILL)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "node":  # the whole "node" dies: the monitor process first, then the trainer
        with open(SCENARIO["pidfile"].format(rank=INITIAL_RANK)) as pidfile:
            os.kill(int(pidfile.read()), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if kind == "livelock":
        call_wrapper.ping()
        while True:
            time.sleep(0.01)
    if kind == "quiet_sleep":  # longer than the soft timeout, but hang protection is off
        with call_wrapper.disable_hang_protection():
            time.sleep(fault["seconds"])
        emit(event="quiet_sleep_end", iteration=call_wrapper.iteration)
    if kind == "gil":
        sum(range(10**12))  # one C call that never releases the GIL
    if kind == "atomic":
        with call_wrapper.atomic():
            emit(event="atomic_start", iteration=call_wrapper.iteration)
            time.sleep(fault.get("hold", 1.5))
            emit(event="atomic_end", iteration=call_wrapper.iteration)
    if kind == "verdict":
        threading.Thread(target=report_verdicts, args=(call_wrapper, fault), daemon=True).start()
    if kind == "stall":  # stuck before the next collective, in short sleeps: alive (not hung), counters frozen
        while True:
            time.sleep(0.05)
    if kind == "kill_with":  # SIGKILL other ranks, then this one `gap` seconds later: near-simultaneous deaths
        for victim in fault["victims"]:
            os.kill(pid_of(victim), signal.SIGKILL)
        time.sleep(fault.get("gap", 0.08))
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "kill_in_restart":  # this rank dies in the middle of the next restart (after its abort)

        def die() -> None:
            emit(event="dying_in_restart", iteration=call_wrapper.iteration)
            os.kill(os.getpid(), signal.SIGKILL)

        call_wrapper.restart_hooks.append(die)
    if kind == "cont":  # resume a stopped rank
        os.kill(pid_of(fault["target"]), signal.SIGCONT)
    if kind == "exit":  # leave the mesh as a clean process exit does (rasd's atexit hook), then finish training
        import rasd

        rasd.stop()
        emit(event="left_mesh", iteration=call_wrapper.iteration)
        time.sleep(fault.get("linger", 1.0))
    if kind == "await":  # until rank `target` reports `what` (every rank waiting at one step: nothing is stuck)
        seen = poll(lambda: reported(fault["target"], fault["what"]), fault.get("timeout", 20), 0.05)
        emit(event="awaited", what=fault["what"], seen=seen, iteration=call_wrapper.iteration)
    if kind == "late_verdicts":
        replay_late_verdicts(call_wrapper, fault.get("expect", 1))
    if kind == "block":  # one long blocking C call (a wedged data loader): only the wake signal reaches it
        block(fault["how"], fault.get("seconds", 300), call_wrapper.iteration)
    if kind == "report_stuck":  # in `delay` s, COMM_STUCK naming `behind`, as the rasd mesh reports it
        threading.Thread(target=report_stuck, args=(call_wrapper.iteration, fault), daemon=True).start()
    if kind == "ras_silent":  # this process's RAS thread blocks for `seconds` while its training goes on
        import rasd.api

        runtime = rasd.api._runtime
        assert runtime is not None, "no RAS node to silence"
        runtime.call(lambda: time.sleep(fault["seconds"]))
    if kind == "user_signals":  # the user's SIGTERM and SIGINT handlers (scenario "user_handlers") still run
        send_user_signals("during")


def block(how: str, seconds: float, iteration: int) -> None:
    """Block in one C call (``how``: sleep, queue, recv, lock, subprocess); report when and how it was left."""
    emit(event="blocked", how=how, iteration=iteration)
    ours, theirs = socket.socketpair()
    lock = threading.Lock()
    lock.acquire()
    child = None
    try:
        if how == "sleep":
            time.sleep(seconds)
        elif how == "queue":
            queue.Queue().get()
        elif how == "recv":
            ours.recv(1)
        elif how == "lock":
            lock.acquire()
        elif how == "subprocess":
            child = subprocess.Popen(["sleep", str(seconds)])
            child.wait()
        else:
            raise ValueError(f"no blocking call {how!r}")
    except BaseException as error:
        emit(event="unblocked", how=how, error=type(error).__name__, iteration=iteration)
        raise
    finally:
        ours.close()
        theirs.close()
        if child is not None:
            child.kill()
            child.wait()
    emit(event="unblocked", how=how, error=None, iteration=iteration)


def report_stuck(iteration: int, fault: dict) -> None:
    from inprocess.fault_source import ExternalVerdict, report_fault

    time.sleep(fault.get("delay", 1.0))
    verdict = ExternalVerdict(
        iteration=iteration, ranks=frozenset(fault["behind"]), kind="COMM_STUCK", reason="injected by the test"
    )
    emit(event="stuck_reported", applied=report_fault(verdict), iteration=iteration)


USER_SIGNALS: list[str] = []  # what the user's handlers saw, in order


def install_user_handlers() -> None:
    def handler(signum: int, frame: object) -> None:
        USER_SIGNALS.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def send_user_signals(phase: str) -> None:
    """SIGTERM and SIGINT to this process; report whether the user's handlers saw each (and the wake handler)."""
    import inprocess.wake

    for sig in (signal.SIGTERM, signal.SIGINT):
        before = len(USER_SIGNALS)
        os.kill(os.getpid(), sig)
        poll(lambda before=before: len(USER_SIGNALS) > before, 10, 0.01)
        emit(
            event="user_signal",
            phase=phase,
            signal=sig.name,
            seen=USER_SIGNALS[before:] == [sig.name],
            wake_installed=signal.getsignal(inprocess.wake.DEFAULT) is inprocess.wake._handle,
        )


def reported(rank: int, name: str) -> bool:
    """Whether initial rank ``rank`` has written an event ``name`` to its JSON lines."""
    with open(SCENARIO["out"].format(rank=rank)) as lines:
        return any(json.loads(line).get("event") == name for line in lines if line.strip())


def pid_of(rank: int) -> int:
    """The pid of initial rank ``rank``, from the first iteration it reported starting (its JSON lines)."""
    with open(SCENARIO["out"].format(rank=rank)) as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("event") == "start":
                return int(event["pid"])
    raise LookupError(f"rank {rank} has not started")


def replay_late_verdicts(call_wrapper: inprocess.CallWrapper, expect: int) -> None:
    """Hand every verdict the mesh gave this process so far (all about earlier iterations; at least ``expect`` of
    them, waited for up to 10 s) to a fresh mesh fault source of this call, as if each arrived only now; report
    whether any was applied."""
    import rasd
    from inprocess import mesh_source

    kinds = {rasd.Kind.PEER_DEAD, rasd.Kind.PEER_HUNG, rasd.Kind.COMM_STUCK}

    verdicts: list = []

    def enough() -> bool:  # asked again: the last ones may still be on their way
        subscription = rasd.subscribe(kinds, replay=True)
        verdicts[:] = subscription.drain()
        subscription.close()
        return len(verdicts) >= expect

    poll(enough, 10)
    source = mesh_source.MeshFaultSource(call_wrapper, call_wrapper._new_connection(), INITIAL_RANK)
    for event in verdicts:
        peer = None if event.peer is None else [event.peer.addr.host, event.peer.addr.port]
        emit(
            event="late_verdict",
            kind=str(event.kind),
            peer=peer,
            comm_hash=event.comm_hash,
            applied=source.handle(event),
            iteration=call_wrapper.iteration,
        )


def main() -> None:
    # "user_store": the process group's store is the Wrapper's per-iteration store (no process hosts it);
    # otherwise the classic pattern: an application TCPStore hosted by initial rank 0.
    user_store = SCENARIO.get("user_store", False)
    app_store = (
        None
        if user_store
        else dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            int(os.environ["WORLD_SIZE"]),
            INITIAL_RANK == 0,
            timeout=datetime.timedelta(seconds=60),
            wait_for_workers=False,
        )
    )
    steps = SCENARIO.get("steps", 20)
    call = 0
    if SCENARIO.get("user_handlers"):
        install_user_handlers()
        send_user_signals("before")

    @inprocess.Wrapper(**wrapper_kwargs())
    def train(call_wrapper: inprocess.CallWrapper, sizes: tuple[int, ...] = (1,), note: str = "") -> int:
        iteration = call_wrapper.iteration
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        for fault in faults_now(call, iteration, "init"):  # "step": "init": before this rank's init_process_group
            inject(fault, call_wrapper)
        dist.init_process_group(
            "gloo",
            store=call_wrapper.store if user_store else dist.PrefixStore(f"call{call}pg{iteration}", app_store),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=SCENARIO.get("pg_timeout", 120)),
        )
        restart = call_wrapper.last_restart
        emit(
            event="start",
            iteration=iteration,
            rank=rank,
            world_size=world_size,
            call=call,
            pid=os.getpid(),
            mesh=call_wrapper.mesh is not None,
            restart=None
            if restart is None
            else {
                "count": restart.count,
                "cause": "; ".join(restart.reasons),
                "terminated": list(restart.terminated_ranks),
            },
        )
        tensor = torch.ones(sizes[0])
        # "restart_steps": how many steps the iterations after a restart run (default: as many as the first).
        for step in range(steps if iteration == 0 else SCENARIO.get("restart_steps", steps)):
            tensor.fill_(1.0)
            dist.all_reduce(tensor)
            if int(tensor[0].item()) != world_size:
                raise AssertionError(f"all_reduce gave {tensor[0].item()} with world size {world_size}")
            if SCENARIO.get("step_events"):  # "step_events": each step's collective done, for a test to wait on
                emit(event="step", iteration=iteration, step=step)
            for fault in faults_now(call, iteration, step):
                inject(fault, call_wrapper)
            time.sleep(SCENARIO.get("step_sleep", 0.05))
        emit(event="done", iteration=iteration, rank=rank, world_size=world_size)
        dist.destroy_process_group()
        return rank

    for call in range(SCENARIO.get("calls", 1)):
        try:
            result = train()
            emit(
                event="return",
                value=result,
                env_rank=os.environ.get("RANK"),
                env_world=os.environ.get("WORLD_SIZE"),
                call=call,
            )
        except BaseException as error:  # reported to the test
            emit(event="raised", type=type(error).__name__, message=str(error), call=call)
            raise SystemExit(3) from error
    if SCENARIO.get("user_handlers"):
        send_user_signals("after")


def end(code: int) -> None:
    """End the process as the interpreter does, less its last step.

    The interpreter's exit waits for the non-daemon threads and runs the exit handlers (rasd says goodbye there:
    a finished rank is LEFT, not DEAD); then it tears down every module, which with torch loaded is seconds of
    garbage collection per rank on a busy machine and writes nothing a test reads. So: the first two, then
    ``os._exit`` with the code the interpreter would have given."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (OUT, sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as stop:
        end(stop.code if isinstance(stop.code, int) else 1)
    end(0)
