"""The direction of imports (docs/architecture.md section 1, "The direction of imports") is checked by
import-linter: the contracts in pyproject.toml's ``[tool.importlinter]``, run by ``.ci/run`` as ``lint-imports``.

The real tree keeps every contract; and each contract is shown to catch what it forbids: the packages are copied
into a temporary folder, one forbidden import is added to one module there, and lint-imports, run in that folder
with the same configuration, fails and names the contract and the import. Each run builds the import graph of the
five packages afresh (no cache): about a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rasd", "rascli", "inprocess", "torchras", "torchras_formats")
# The checker of this interpreter's environment (.venv/bin/lint-imports), as .ci/run runs it.
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path, *contracts: str) -> tuple[int, str]:
    """Run lint-imports in ``cwd`` with ``cwd/pyproject.toml``, limited to ``contracts`` (ids) if any: (exit status,
    output with its line wrapping undone)."""
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: ./bootstrap installs it (the dev extra)"
    # The packages are found from cwd (lint-imports puts it first on sys.path), before the editable install.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(cwd), os.environ.get("PYTHONPATH")])))
    command = [str(LINT_IMPORTS), "--no-logo", "--no-cache", "--config", str(cwd / "pyproject.toml")]
    for contract in contracts:
        command += ["--contract", contract]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def test_the_tree_keeps_every_contract() -> None:
    status, output = lint_imports(ROOT)
    assert status == 0, output
    assert " 0 broken" in output and " KEPT" in output, output


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The five packages, pyproject.toml and our contract type (tests/unit/layers_contract.py), copied once."""
    folder = tmp_path_factory.mktemp("pristine")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, folder / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", folder)
    (folder / "tests" / "unit").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "unit" / "layers_contract.py", folder / "tests" / "unit")
    return folder


# (module file, the forbidden import added at its end, the contract it breaks: id and name, the import as reported)
VIOLATIONS = [
    pytest.param(
        "rasd/net/runtime.py",
        "import inprocess",
        "layers",
        "Layers: torchras (the app layer) > inprocess > rasd",
        "rasd.net.runtime -> inprocess",
        id="rasd-imports-inprocess",
    ),
    pytest.param(
        "rascli/main.py",
        "import rasd",
        "rascli-alone",
        "rascli imports nothing of rasd, inprocess or torchras",
        "rascli.main -> rasd",
        id="rascli-imports-rasd",
    ),
    pytest.param(
        # The formats' home is imported by every package: it imports none of them (issue 41, item 5).
        "torchras_formats/journal_lines.py",
        "from rascli import errors",
        "formats-alone",
        "torchras_formats imports nothing of rasd, rascli, inprocess or torchras",
        "torchras_formats.journal_lines -> rascli.errors",
        id="formats-import-rascli",
    ),
    pytest.param(
        "torchras_formats/endpoint_files.py",
        "import psutil",
        "formats-sans-io",
        "torchras_formats imports no third-party package, only the standard library",
        "torchras_formats.endpoint_files imports psutil",
        id="formats-import-third-party",
    ),
    pytest.param(
        "rasd/core/__init__.py",
        "from rasd.net import runtime",
        "core-alone",
        "rasd.core imports nothing of the project outside rasd.core",
        "rasd.core -> rasd.net.runtime",
        id="core-imports-rasd-net",
    ),
    pytest.param(
        "rasd/core/__init__.py",
        "import psutil",
        "core-sans-io",
        "rasd.core imports no third-party package, only the standard library",
        "rasd.core imports psutil",
        id="core-imports-third-party",
    ),
    pytest.param(
        # Imports under TYPE_CHECKING count (pyproject.toml says why).
        "inprocess/wrap.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torchras",
        "layers",
        "Layers: torchras (the app layer) > inprocess > rasd",
        "inprocess.wrap -> torchras",
        id="inprocess-imports-torchras-for-types",
    ),
    pytest.param(
        # The carrier offers hooks; the services attach themselves through them (issue 41).
        "rasd/net/runtime.py",
        "def _late():\n    from rasd.services import metrics",
        "rasd-layers",
        "The parts of rasd, in layers (docs/architecture.md section 1): entry points > torch > api > services > "
        "carrier > report > core",
        "rasd.net.runtime -> rasd.services.metrics",
        id="carrier-imports-a-service",
    ),
    pytest.param(
        "rasd/services/journal.py",
        "import torch",
        "torch-only-in-rasd-torch",
        "Of rasd, only rasd.torch imports torch (importing torch costs seconds, and rasd runs without it)",
        "rasd.services.journal -> torch",
        id="journal-imports-torch",
    ),
    pytest.param(
        # Imports inside a function count too: the cycle store <-> etcd_store stays cut.
        "inprocess/etcd_store.py",
        "def _late():\n    from . import store",
        "store-one-way",
        "inprocess.store imports etcd_store and store_base, never the reverse",
        "inprocess.etcd_store -> inprocess.store",
        id="etcd-store-imports-store",
    ),
]


@pytest.mark.parametrize(("module", "statement", "contract", "name", "reported"), VIOLATIONS)
def test_a_forbidden_import_breaks_its_contract(
    pristine: Path, tmp_path: Path, module: str, statement: str, contract: str, name: str, reported: str
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree)
    path = tree / module
    path.write_text(f"{path.read_text()}\n{statement}  # added by tests/unit/test_layers.py\n")
    status, output = lint_imports(tree, contract)
    assert status != 0, output
    assert f"{name} BROKEN" in output, output
    assert reported in output, output
