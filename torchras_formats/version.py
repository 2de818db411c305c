"""torchras's version, written here only: rasd, rascli and the package metadata (pyproject.toml reads it) all take
it from this module, which every part of torchras may import (torchras_formats imports nothing of them). Standard
library only."""

#: The version of torchras (rasd and rascli are released together).
__version__ = "0.1.0"
