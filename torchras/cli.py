"""The ``rasd`` console script: ``rasd launch`` and ``rasd demo`` here, ``rasd swarm`` from ``rasd.cli``.

Why the script enters the app layer and not ``rasd.cli``: ``rasd launch`` and ``rasd demo`` run training under
``inprocess`` and sit above both packages (docs/architecture.md section 1, "The direction of imports"), and ``rasd``
must never import the app layer. This module is the one place that knows all three subcommands, so ``rasd --help``
lists them all.

``rasd launch`` takes torchrun's command line, which its own parser reads (``torchras.launch.args``): its words go
there untouched, before this parser sees them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

LAUNCH_HELP = "torchrun's command line; keeps the survivors when a worker dies and respawns it into the running job"


def parser() -> argparse.ArgumentParser:
    from rasd.cli import add_swarm_parser

    from . import demo

    p = argparse.ArgumentParser(prog="rasd", description="torchras: local jobs to try it with, and a launcher")
    subcommands = p.add_subparsers(dest="command", required=True)
    subcommands.add_parser("launch", help=f"{LAUNCH_HELP} (rasd launch --help)", add_help=False)
    demo.add_parser(subcommands)
    add_swarm_parser(subcommands)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] == "launch":
        from torchras.launch.main import main as launch_main

        return launch_main(arguments[1:])
    p = parser()
    args = p.parse_args(arguments)
    if args.command == "demo":
        from . import demo

        return demo.main(args)
    from rasd.cli import run_swarm

    return run_swarm(args, p)


if __name__ == "__main__":
    sys.exit(main())
