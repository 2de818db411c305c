"""The ``rasd`` console script: ``rasd launch`` here, every other subcommand to ``rasd.cli`` unchanged.

Why the script enters the app layer and not ``rasd.cli``: ``rasd launch`` imports ``inprocess``'s contract with its
workers and runs above both packages (DESIGN.md section 2), and ``rasd`` must never import the app layer. This
module is the one place that knows both.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

LAUNCH_HELP = (
    "  launch   torchrun's command line; keeps the survivors when a worker dies and respawns it into the running "
    "job (rasd launch --help)"
)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] == "launch":
        from torchras.launch.main import main as launch_main

        return launch_main(arguments[1:])
    from rasd.cli import main as rasd_main

    try:
        return rasd_main(arguments)
    except SystemExit as done:
        if not arguments or arguments[0] in ("-h", "--help"):  # rasd's own help, and the subcommand it does not list
            print(LAUNCH_HELP, file=sys.stdout if done.code == 0 else sys.stderr)
        raise


if __name__ == "__main__":
    sys.exit(main())
