"""rascli: the ``ncclras``-like command line client of torchras.

It speaks the RAS client protocol (version 2) to the status port of a running job and shows what it answers:
drawn with rich on a terminal, byte for byte in a pipe, JSON for machines, and a live event monitor. It stands
alone: nothing here imports ``rasd``. The other way round, rasd writes and reads the endpoint files (``--list``)
through ``endpoints.py``, so that their format has one implementation.
"""

# The version (rascli/version.py, torchras's one copy): ``rascli --version`` shows it when the distribution's metadata
# is not installed (running from a checkout).
from .version import __version__ as __version__
