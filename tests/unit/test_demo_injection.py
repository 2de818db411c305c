"""``rasd demo``'s fault injection and progress lines, without starting the demo.

A stall is what a wedged data loader does: one blocking call for the whole stall (no short sleeps a restart could
slip between), made before the forward pass. A progress line leaves a worker in one ``write``, so the lines of
workers sharing a pipe never interleave mid-line.
"""

from __future__ import annotations

import argparse
import datetime
import socket

import pytest

from rasd.torch import demo


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

    def build_and_watch():
        module, optimizer = build()
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
