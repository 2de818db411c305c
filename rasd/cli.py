"""``rasd swarm``: a local job of lightweight RAS processes (no torch) to try the mesh with.

    rasd swarm --peers 8          a local job of 8 lightweight RAS processes, serving localhost:28028

The ``rasd`` console script is ``torchras.cli``: it adds ``rasd demo`` and ``rasd launch``, which run training
under ``inprocess`` and so live in the app layer above rasd (docs/architecture.md section 1, "The direction of
imports"); ``rasd swarm`` is rasd's own.

While a swarm runs, type commands on its standard input (``help`` lists them), or use signals on the pids it
prints; query it from another terminal with ``rascli -v`` or ``echo verbose status | nc localhost 28028``.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time

SWARM_HELP = """commands (member numbers as listed above):
  kill I        kill -9 member I                stop I / cont I   SIGSTOP / SIGCONT member I
  exit I        member I exits cleanly (LEFT)   crash I           member I exits without a goodbye
  raise I       member I dies of an uncaught exception (DEAD)
  lag I K       member I falls K operations behind on the world communicator
  freeze I      member I stops counting         stuck I           member I is stuck inside an operation
  leave-comm I world|pair                       heal I            undo lag, freeze and stuck
  restart I N [RANKS [SECONDS [CAUSE...]]]      member I restarted in place to iteration N (as inprocess.Wrapper
                reports it): RANKS terminated (e.g. 2,3 or -), SECONDS lost
  list          show the members                quit              every member leaves (LEFT), then the swarm ends"""


def swarm_main(args: argparse.Namespace) -> int:
    from rasd.swarm import Swarm

    env = {"TORCHRAS_SWARM_STEP_S": str(args.step)}
    if args.timeout_factor:
        env["TORCHRAS_TIMEOUT_FACTOR"] = str(args.timeout_factor)
    if args.addr:
        env["TORCHRAS_ADDR"] = args.addr
    print(f"starting a swarm of {args.peers} RAS processes...", flush=True)
    sw = Swarm(args.peers, env=env)
    try:
        sw.start()
    except (RuntimeError, TimeoutError) as e:
        print(f"rasd swarm: {e}", file=sys.stderr)
        sw.close()
        return 1
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    addr = args.addr or os.environ.get("TORCHRAS_ADDR") or "localhost:28028"
    host, _, port = addr.rpartition(":")
    served = sorted({m.client_port for m in sw.members if m.client_port})
    if served:
        port = str(served[0])  # the port the members really serve (a later job moves to the next free one)
    _print_members(sw)
    print(f"\nthe job serves its status on {host}:{port}:")
    print(f"  rascli -v -p {port}        echo verbose status | nc {host.strip('[]')} {port}        rascli -m -p {port}")
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        print("\n" + SWARM_HELP)
    deadline = time.monotonic() + args.duration if args.duration else None
    lines = _Lines(sys.stdin.fileno() if sys.stdin is not None else None)
    try:
        while deadline is None or time.monotonic() < deadline:
            sw.reap()  # a member that was killed or exited is collected at once, not left a zombie
            if interactive and not lines.pending:
                print("swarm> ", end="", flush=True)
            line = lines.next(deadline)
            if line is None:
                continue
            if not _obey(sw, line.split()):
                break
    except KeyboardInterrupt:
        pass
    finally:
        print("\nstopping the swarm: each member leaves the job (LEFT)", flush=True)
        try:
            sw.leave()
        except KeyboardInterrupt:  # a second Ctrl+C: no more goodbyes
            pass
        sw.close()
    return 0


class _Lines:
    """Lines from a file descriptor without Python's buffering, so ``select`` sees every line that arrived (several
    commands piped in one write are all run). After EOF it just waits."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.buf = b""
        self.pending: list[str] = []

    def next(self, deadline: float | None) -> str | None:
        if self.pending:
            return self.pending.pop(0)
        timeout = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        if self.fd is None:
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(self.fd, 4096)
        if not data:  # EOF: keep running until Ctrl+C or the duration
            self.fd = None
            data = b"\n" if self.buf else b""
        self.buf += data
        *complete, self.buf = self.buf.split(b"\n")
        self.pending.extend(line.decode(errors="replace") for line in complete)
        return self.pending.pop(0) if self.pending else None


def _print_members(sw) -> None:
    print(f"\n{'member':>6}  {'pid':>7}  mesh address")
    for m in sw.members:
        state = "" if sw.alive(m.index) else "  (exited)"
        print(f"{m.index:>6}  {m.pid:>7}  {m.addr}{state}")


def _obey(sw, words: list[str]) -> bool:
    if not words:
        return True
    cmd, args = words[0], words[1:]
    if cmd in ("quit", "exit") and not args:
        return False
    if cmd == "help":
        print(SWARM_HELP)
        return True
    if cmd == "list":
        _print_members(sw)
        return True
    try:
        i = int(args[0])
        if not 0 <= i < sw.n:
            raise ValueError
    except (IndexError, ValueError):
        print(f"unknown command or member: {' '.join(words)} (try help)")
        return True
    signals = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT, "term": signal.SIGTERM}
    try:
        if cmd in signals:
            sw.kill(i, signals[cmd])
        elif cmd in (
            "exit",
            "crash",
            "raise",
            "lag",
            "freeze",
            "stuck",
            "heal",
            "leave-comm",
            "error",
            "abort",
            "finalize",
            "restart",
        ):
            sw.command(i, cmd, *args[1:])
        else:
            print(f"unknown command: {cmd} (try help)")
            return True
    except ProcessLookupError:
        print(f"member {i} is gone")
    else:
        print(f"member {i}: {cmd} {' '.join(args[1:])}".rstrip())
    return True


def add_swarm_parser(subcommands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``rasd swarm`` on a ``rasd`` command's parser (this module's, and the console script's in ``torchras.cli``)."""
    sp = subcommands.add_parser("swarm", help="a local job of lightweight RAS processes (no torch)")
    sp.add_argument("--peers", "-n", type=int, default=8, help="number of processes (default 8)")
    sp.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (default: never)")
    sp.add_argument(
        "--step", type=float, default=1.0, help="seconds per synthetic collective (0 freezes the counts; default 1)"
    )
    sp.add_argument(
        "--timeout-factor", type=float, default=0.0, help="scale every mesh timer (TORCHRAS_TIMEOUT_FACTOR)"
    )
    sp.add_argument("--addr", default="", help="client port address (TORCHRAS_ADDR; default localhost:28028)")
    return sp


def run_swarm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.peers < 1:
        parser.error("--peers must be at least 1")
    return swarm_main(args)


def main(argv: list[str] | None = None) -> int:
    """``python -m rasd.cli swarm ...`` (the ``rasd`` script is ``torchras.cli``, which has demo and launch too)."""
    parser = argparse.ArgumentParser(prog="rasd", description="torchras RAS node: local jobs to try it with")
    add_swarm_parser(parser.add_subparsers(dest="command", required=True))
    return run_swarm(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(main())
