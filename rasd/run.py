"""Run a training script with torchras, without changing it: ``torchrun --nproc-per-node 8 -m rasd.run train.py
--its --args``. Hooks torch.distributed, then runs the script as ``__main__`` with its own arguments."""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: python -m rasd.run SCRIPT [ARGS...]   (under torchrun: torchrun ... -m rasd.run SCRIPT ...)",
            file=sys.stderr,
        )
        sys.exit(0 if argv else 2)
    import rasd

    rasd.install()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
