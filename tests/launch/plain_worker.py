"""A worker without torch for the launcher's own tests (signals, exit status, output): ``plain_worker.py MODE``.

sleep DIR [--ignore-term]   write DIR/<local rank>.pids (its pid and its child's), then sleep; its child (a
                            ``sleep``, as a data loader's process) is in its process group
exit DIR CODE RANK DELAY    the worker of local rank RANK exits with CODE at once (CODE -9: kill -9 of
                            itself); the others sleep DELAY seconds, write DIR/<local rank>.done, exit 0
chatter LINES               LINES lines on stdout and stderr, each written in pieces with pauses between, of
                            lengths up to 20 kB: ``<local rank>:<i>:<x * n>:end``
streams                     one line on stdout and one on stderr: ``out <local rank>``, ``err <local rank>``
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LOCAL_RANK = int(os.environ["LOCAL_RANK"])


def main(mode: str, *args: str) -> int:
    if mode == "sleep":
        folder = Path(args[0])
        if "--ignore-term" in args:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "600"])
        (folder / f"{LOCAL_RANK}.pids").write_text(f"{os.getpid()} {child.pid}")
        time.sleep(600)
        return 0
    if mode == "exit":
        folder, code, rank, delay = Path(args[0]), int(args[1]), int(args[2]), float(args[3])
        if rank == LOCAL_RANK:
            if code == -9:
                os.kill(os.getpid(), signal.SIGKILL)
            return code
        time.sleep(delay)
        (folder / f"{LOCAL_RANK}.done").write_text("")
        return 0
    if mode == "chatter":
        for i in range(int(args[0])):
            for stream in (sys.stdout, sys.stderr):
                line = f"{LOCAL_RANK}:{i}:{'x' * ((i * 997 + LOCAL_RANK * 131) % 20000)}:end\n"
                step = max(1, len(line) // 3)
                for start in range(0, len(line), step):  # a line in pieces, as print and big writes make them
                    stream.write(line[start : start + step])
                    stream.flush()
                    time.sleep(0.0005)
        return 0
    if mode == "streams":
        print(f"out {LOCAL_RANK}", flush=True)
        print(f"err {LOCAL_RANK}", file=sys.stderr, flush=True)
        return 0
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
