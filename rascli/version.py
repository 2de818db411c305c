"""torchras's version, written here only: rasd, rascli and the package metadata (pyproject.toml reads it) all take
it from this module. It lives in rascli because rascli imports nothing of rasd, while rasd may import rascli (as it
does for the endpoint files): the one module that every part of torchras can import. Standard library only."""

#: The version of torchras (rasd and rascli are released together).
__version__ = "0.1.0"
