"""rascli: the ``ncclras``-like command line client of torchras.

It speaks the RAS client protocol (version 2) to the status port of a running job and shows what it answers:
drawn with rich on a terminal, byte for byte in a pipe, JSON for machines, and a live event monitor. It stands
alone: nothing here imports ``rasd``, ``inprocess`` or ``torchras``. The formats it shares with rasd (the endpoint
files of ``--list``, the verdict journal's lines, the version) are ``torchras_formats``'s, which both import.
"""

# The version (torchras_formats/version.py, torchras's one copy): ``rascli --version`` shows it when the
# distribution's metadata is not installed (running from a checkout).
from torchras_formats.version import __version__ as __version__
