"""Run a training script with torchras, without changing it: ``torchrun --nproc-per-node 8 -m rasd.run train.py
--its --args`` (or ``-m rasd.run -m package.module --args``). Hooks torch.distributed, then runs the script as
``__main__`` with its own arguments.

The script sees what ``python train.py`` would give it: ``sys.argv`` (its path first), ``sys.path[0]`` its own
folder (``-m``: the working directory), ``__name__ == "__main__"``, and classes defined in it pickle as
``__main__.X`` (multiprocessing's spawned children, a data loader's workers, import the script again by its path,
not this module, so they start no RAS node). The hooks start the node at the first ``init_process_group``; a
script that calls ``rasd.install()`` or ``rasd.start()`` itself gets the same node, not a second one.

``run(argv, lazy=True)`` (what ``rasd launch`` uses) hooks torch.distributed only once the script imports torch,
through a finder on ``sys.meta_path`` that removes itself: a worker that never imports torch pays nothing, and one
that does pays nothing it would not have paid anyway. Nothing here raises into the script: hooks that cannot be
installed are one WARNING line, and the script runs without RAS.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("rasd")

USAGE = "usage: python -m rasd.run SCRIPT [ARGS...] | -m MODULE [ARGS...]   (torchrun ... -m rasd.run SCRIPT ...)"


def install_hooks(then: Callable[[], None] | None = None) -> None:
    """``rasd.install()`` now, then ``then()``; never raises (one WARNING: the script runs without RAS)."""
    try:
        import rasd

        rasd.install()
        if then is not None:
            then()
    except Exception as error:  # noqa: BLE001 - never into training
        log.warning(
            "rasd: could not hook torch.distributed (%s: %s); the process runs without RAS", type(error).__name__, error
        )


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Calls ``action`` once ``torch`` has been imported completely (its ``__init__`` ran to the end), then leaves
    ``sys.meta_path``. Only the first import of ``torch`` is looked at; every other name goes to the next finder."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self.done = False

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != "torch" or self.done:
            return None
        self.done = True  # the search below must not come back here
        spec = None
        for finder in list(sys.meta_path):  # the search the import system would make, without this finder
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            self._leave()
            return spec
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            self._leave()
            self.action()

        loader.exec_module = exec_module  # this loader instance serves torch only
        return spec

    def _leave(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def install_when_torch_is_imported(then: Callable[[], None] | None = None) -> None:
    """``install_hooks(then)`` as soon as ``torch`` is imported (at once if it already is)."""
    if "torch" in sys.modules:
        install_hooks(then)
        return
    sys.meta_path.insert(0, _AfterTorch(lambda: install_hooks(then)))


def run_program(argv: Sequence[str]) -> None:
    """Run ``SCRIPT ARGS...`` or ``-m MODULE ARGS...`` as ``python`` would, as ``__main__``."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's path in sys.argv[0], as python -m does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = list(argv)
    # python puts the script's folder first on sys.path, not the working directory that -m rasd.run put there.
    folder = os.path.dirname(os.path.realpath(argv[0]))
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)
    runpy.run_path(argv[0], run_name="__main__")


def run(argv: Sequence[str], *, lazy: bool = False, then: Callable[[], None] | None = None) -> None:
    """Hook torch.distributed (``lazy``: once the program imports torch), then run the program."""
    if lazy:
        install_when_torch_is_imported(then)
    else:
        install_hooks(then)
    run_program(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        print(USAGE, file=sys.stderr)
        sys.exit(0 if argv and argv[0] != "-m" else 2)
    run(argv)


if __name__ == "__main__":
    main()
