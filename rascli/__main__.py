"""``python -m rascli``: the same as the ``rascli`` command."""

from .main import main

main()
