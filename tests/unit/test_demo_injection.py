"""``rasd demo``'s fault injection, progress lines and command line, without starting the demo.

A stall is what a wedged data loader does: one blocking call for the whole stall (no short sleeps a restart could
slip between), made before the forward pass. A progress line leaves a worker in one ``write``, so the lines of
workers sharing a pipe never interleave mid-line. The demo runs its workers (``torchras.demo_worker``) under
``rasd launch`` (``torchras.demo``); a replacement the launcher starts never makes its slot's fault again.
"""

from __future__ import annotations

import argparse
import datetime
import socket

import pytest

from torchras import demo_worker as demo


def test_a_stall_is_parsed_with_its_seconds():
    assert demo.Injection.parse("stall:rank=2,step=30,seconds=120") == demo.Injection("stall", 2, 30, 120.0)
    assert demo.Injection.parse("stall:rank=1,step=5").seconds == 60.0


def test_a_stall_is_one_blocking_call_for_all_its_seconds(monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(demo.time, "sleep", sleeps.append)
    monkeypatch.setattr(demo, "say", lambda line: None)
    skip = demo._inject(demo.Injection("stall", 2, 30, 120.0), 2)
    assert sleeps == [120.0]
    assert skip is False


def test_only_skip_asks_to_skip_the_gradient_synchronisation(monkeypatch):
    monkeypatch.setattr(demo, "say", lambda line: None)
    assert demo._inject(demo.Injection("skip", 1, 25), 1) is True
    with pytest.raises(RuntimeError, match="injected exception on rank 3 at step 15"):
        demo._inject(demo.Injection("exception", 3, 15), 3)


def test_a_progress_line_is_one_write(monkeypatch):
    writes: list[bytes] = []

    class Stdout:
        def flush(self) -> None:
            pass

        def fileno(self) -> int:
            return 1

    def write(fd: int, data: bytes) -> int:
        writes.append(data)
        return len(data)

    monkeypatch.setattr(demo.sys, "stdout", Stdout())
    monkeypatch.setattr(demo.os, "write", write)
    demo.say("step    40  pair 2-3: mean loss 0.0526")
    assert writes == [b"step    40  pair 2-3: mean loss 0.0526\n"]


@pytest.mark.slow  # a one-rank gloo group: torch.distributed and a TCP store in this process
@pytest.mark.parametrize("model", sorted(demo.MODELS))
def test_the_stall_blocks_before_the_forward_pass(monkeypatch, model):
    """What a wedged data loader blocks: the step's batch. The rank has not started the step's forward pass (so
    not its gradient collective) while it sleeps."""
    import torch.distributed as dist

    events: list[str] = []
    monkeypatch.setattr(demo.time, "sleep", lambda seconds: events.append(f"sleep {seconds}"))
    monkeypatch.setattr(demo, "say", lambda line: None)
    monkeypatch.setenv("RANK", "0")
    args = argparse.Namespace(model=model, steps=2, step_time=0.0, print_every=10, commit_every=10)
    trainer = demo.Trainer(args, [demo.Injection("stall", 0, 2, 30.0)])
    build = trainer.build

    def build_and_watch(call_wrapper):
        module, optimizer = build(call_wrapper)
        module.register_forward_pre_hook(lambda *_: events.append("forward"))
        return module, optimizer

    monkeypatch.setattr(trainer, "build", build_and_watch)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        trainer.train(None)
    finally:
        dist.destroy_process_group()
    # Step 1: forward, then the rest of its step time; step 2: the stall (one call), then the forward.
    assert [event for event in events if event != "sleep 0.0"] == ["forward", "sleep 30.0", "forward"]
    assert trainer.state.step == 2


# ---- the launching half (torchras.demo): rasd launch's command line, and what a replacement injects ---------------


def test_a_replacement_never_injects_again():
    """The faults are the initial ranks'; a replacement (INPROCESS_JOIN=1) inherits its slot's RANK but has none."""
    specs = ["kill:rank=2,step=30", "exception:rank=1,step=45"]
    assert [inj.kind for inj in demo.own_injections(specs, {"RANK": "2"})] == ["kill"]
    assert demo.own_injections(specs, {"RANK": "2", "INPROCESS_JOIN": "1"}) == []
    assert demo.own_injections(specs, {"RANK": "3"}) == []


def _demo_arguments(*argv: str) -> argparse.Namespace:
    from torchras import cli

    return cli.parser().parse_args(["demo", *argv])


def test_the_demo_runs_its_workers_under_rasd_launch():
    from torchras import demo as launching
    from torchras.launch import args as launch_args

    args = _demo_arguments("--nproc", "3", "--model", "fsdp", "--steps", "50", "--inject", "kill:rank=2,step=30")
    injections = [demo.Injection.parse(spec) for spec in args.inject]
    _, plan = launch_args.parse(launching.launch_arguments(args, injections))
    assert plan.nproc_per_node == 3 and plan.nnodes == 1 and plan.max_respawns == 3
    assert plan.store_port == 0  # --standalone: a free port, and MASTER_PORT + 1 free for the Wrapper's store
    python, unbuffered, module, worker, *rest = plan.command
    assert (unbuffered, module, worker) == ("-u", "-m", "torchras.demo_worker")
    assert rest[rest.index("--model") + 1] == "fsdp" and rest[rest.index("--steps") + 1] == "50"
    assert rest[rest.index("--inject") + 1] == "kill:rank=2,step=30,seconds=60.0"
    no_respawns = _demo_arguments("--max-respawns", "0")
    assert launch_args.parse(launching.launch_arguments(no_respawns, []))[1].max_respawns == 0


def test_join_is_a_no_op_that_says_why(capsys):
    from torchras import demo as launching

    assert launching.main(_demo_arguments("--join")) == 0
    assert "respawns a dead process by itself" in capsys.readouterr().out


def test_an_injection_outside_the_ranks_is_refused(capsys):
    from torchras import demo as launching

    assert launching.main(_demo_arguments("--nproc", "2", "--inject", "kill:rank=2,step=5")) == 2
    assert "--inject rank 2 is not in 0..1" in capsys.readouterr().err
