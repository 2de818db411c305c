"""A plain ``pip install`` of the distribution runs: every third-party package the five runtime packages import is a
dependency in pyproject.toml's ``[project]``, or an optional one imported only where it is needed.

Why a test: ``./bootstrap`` installs more than the distribution declares (the test tools, the checkers, etcd3gw), so
a run from the development environment never shows a missing dependency; a user's ``pip install`` does, at run time
(issue 27: ``rasd demo`` restarted for ever on ``Numpy is not available``). So the imports are read from the source
(every ``import`` statement of rasd, rascli, inprocess, torchras and torchras_formats, those inside functions too,
with ``ast``) and held against the declared requirements:

* a package imported at run time is declared in ``dependencies`` (under its distribution's name);
* a package of an optional extra (``etcd``), or an optional package of someone else's stack (NVML, Transformer
  Engine, nvidia-resiliency-ext), is imported only inside a function or under a ``try`` that catches its absence,
  so that importing our modules never needs it;
* torch's own optional needs that our calls reach (numpy, for the object collectives) are declared too, and each
  declared dependency is used, so the list says why every entry is there.

Imports under ``if TYPE_CHECKING:`` never run and are left out. Dynamic imports (``importlib.import_module``) are of
our own modules only (``inprocess.monitor_process``). Checked with the tree as it is, and the checker itself on a few
made-up modules, so a new undeclared import fails here rather than on a user's machine.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomllib came with 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rasd", "rascli", "inprocess", "torchras", "torchras_formats")

#: Import name -> distribution name, for every third-party package the runtime packages may import.
DISTRIBUTIONS = {
    "torch": "torch",
    "numpy": "numpy",
    "rich": "rich",
    "psutil": "psutil",
    "prometheus_client": "prometheus-client",
    "etcd3gw": "etcd3gw",
    "requests": "requests",
    "pynvml": "nvidia-ml-py",
    "transformer_engine": "transformer-engine",
    "nvidia_resiliency_ext": "nvidia-resiliency-ext",
}
#: Optional extras: import name -> (the extra, the distribution of the extra that brings it).
EXTRAS = {
    "etcd3gw": ("etcd", "etcd3gw"),  # inprocess.etcd_store: the Wrapper's store across hosts
    "requests": ("etcd", "etcd3gw"),  # etcd3gw's own dependency: inprocess.etcd_store's watch streams through it
}
#: Optional packages no extra brings: used only where the user installed them, never needed on a CPU machine.
OPTIONAL = {
    "pynvml": "inprocess.health_check: NVML's GPU and NVLink checks, where a driver answers",
    "transformer_engine": "inprocess.abort.AbortTransformerEngine, when Transformer Engine is installed",
    "nvidia_resiliency_ext": "inprocess.abort.AbortPersistentCheckpointProcesses: its checkpoint queues, if installed",
}
#: Declared dependencies nothing of ours imports: what torch needs for what our code calls. Distribution -> why,
#: and the calls that need it (a pattern of the runtime source: when none is left, the entry can go).
TORCH_NEEDS = {
    "numpy": (
        "torch's object collectives serialise through tensor.numpy(): without numpy, inprocess.elastic's "
        "state.sync() fails with 'Numpy is not available' in every restart iteration",
        r"\b(broadcast_object_list|all_gather_object|gather_object|scatter_object_list|send_object_list|"
        r"recv_object_list)\(|\.numpy\(\)",
    ),
}
#: The torch build this project is developed and tested with: the declared range must keep it.
TESTED_TORCH = "2.13.0"


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # the top-level package imported
    where: str  # file:line
    guarded: bool  # inside a function, or under a try that catches the package's absence


def _catches_absence(handler: ast.ExceptHandler) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(node, ast.Name) and node.id in names for node in types)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, filename: str) -> Iterator[Import]:
    """Every absolute import that runs (TYPE_CHECKING blocks left out), with whether it is guarded."""

    def visit(node: ast.AST, guarded: bool) -> Iterator[Import]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from visit(child, guarded)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name.split(".")[0], f"{filename}:{node.lineno}", guarded)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield Import(node.module.split(".")[0], f"{filename}:{node.lineno}", guarded)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            guarded = True
        if isinstance(node, ast.Try):
            body_guarded = guarded or any(_catches_absence(handler) for handler in node.handlers)
            for child in node.body:
                yield from visit(child, body_guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                yield from visit(child, guarded)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, guarded)

    yield from visit(ast.parse(source, filename), False)


def runtime_sources() -> Iterator[tuple[Path, str]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path, path.read_text()


def third_party(imports: Iterator[Import]) -> list[Import]:
    return [item for item in imports if item.module not in sys.stdlib_module_names and item.module not in PACKAGES]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def declared() -> dict[str, Requirement]:
    """``[project] dependencies`` by distribution name."""
    return {(req := Requirement(text)).name.lower(): req for text in project()["dependencies"]}


def problems(found: list[Import], dependencies: set[str], extras: dict[str, list[str]]) -> list[str]:
    """What is wrong with these imports, given the declared dependencies and extras (distribution names)."""
    extra_distributions = {extra: {Requirement(text).name.lower() for text in texts} for extra, texts in extras.items()}
    wrong = []
    for item in found:
        distribution = DISTRIBUTIONS.get(item.module)
        if distribution is None:
            wrong.append(
                f"{item.where}: imports {item.module}, which this test does not know: declare its distribution in "
                "pyproject.toml's [project] dependencies and add it to DISTRIBUTIONS here (or import it lazily, as "
                "an extra or an optional package)"
            )
        elif distribution in dependencies:
            continue
        elif item.module in EXTRAS:
            extra, brought_by = EXTRAS[item.module]
            if brought_by not in extra_distributions.get(extra, set()):
                wrong.append(f"{item.where}: {item.module} should come with the extra {extra!r} ({brought_by})")
            elif not item.guarded:
                wrong.append(
                    f"{item.where}: {item.module} (extra {extra!r}) is imported when the module is: import it inside "
                    "the function that needs it, so that a plain install runs"
                )
        elif item.module in OPTIONAL:
            if not item.guarded:
                wrong.append(
                    f"{item.where}: {item.module} is optional ({OPTIONAL[item.module]}) but imported unguarded"
                )
        else:
            wrong.append(f"{item.where}: imports {item.module}, but {distribution} is not a dependency")
    return wrong


# ---- the tree as it is ----------------------------------------------------------------------------------------


def test_every_third_party_import_is_a_declared_dependency_or_a_guarded_optional_one() -> None:
    found = [item for path, source in runtime_sources() for item in third_party(imports_of(source, str(path)))]
    assert {item.module for item in found} >= {"torch", "rich", "psutil"}, "the scan found the usual imports"
    optional = project().get("optional-dependencies", {})
    assert problems(found, set(declared()), optional) == []


def test_every_declared_dependency_is_used_and_says_why() -> None:
    imported = {
        DISTRIBUTIONS[item.module]
        for _, source in runtime_sources()
        for item in third_party(imports_of(source, ""))
        if item.module in DISTRIBUTIONS
    }
    for name in declared():
        assert name in imported or name in TORCH_NEEDS, f"{name} is declared but nothing of the five packages uses it"


@pytest.mark.parametrize("distribution", sorted(TORCH_NEEDS))
def test_what_torch_needs_for_our_calls_is_declared(distribution: str) -> None:
    why, calls = TORCH_NEEDS[distribution]
    using = [str(path.relative_to(ROOT)) for path, source in runtime_sources() if re.search(calls, source)]
    assert using, f"nothing calls what needs {distribution} any more ({why}): it may leave [project] dependencies"
    assert distribution in declared(), f"{', '.join(using)} need {distribution}: {why}"


def test_the_torch_requirement_keeps_the_tested_build() -> None:
    # An installed torch that satisfies the requirement is never replaced by pip (a CUDA build is gigabytes).
    assert declared()["torch"].specifier.contains(TESTED_TORCH), declared()["torch"]


def test_the_console_scripts_are_in_the_distribution() -> None:
    info = project()
    assert set(info["scripts"]) == {"rasd", "rascli"}
    for target in info["scripts"].values():
        module, _, function = target.partition(":")
        assert module.split(".")[0] in PACKAGES and function, target
        assert (ROOT / Path(*module.split("."))).with_suffix(".py").exists(), target
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert set(found["include"]) == {f"{package}*" for package in PACKAGES}


# ---- the checker itself, on made-up modules ---------------------------------------------------------------------


def check(source: str) -> list[str]:
    return problems(
        third_party(imports_of(source, "made_up.py")), {"torch", "numpy", "rich", "psutil"}, {"etcd": ["etcd3gw>=2.7"]}
    )


def test_a_new_undeclared_import_is_reported() -> None:
    assert check("import os\nimport yaml\n") == [
        "made_up.py:2: imports yaml, which this test does not know: declare its distribution in pyproject.toml's "
        "[project] dependencies and add it to DISTRIBUTIONS here (or import it lazily, as an extra or an optional "
        "package)"
    ]
    assert check("from torch import nn\nimport rich.table\nfrom . import sibling\n") == []


def test_a_known_package_that_is_not_declared_is_reported() -> None:
    wrong = problems(third_party(imports_of("import numpy\n", "made_up.py")), {"torch"}, {})
    assert wrong == ["made_up.py:1: imports numpy, but numpy is not a dependency"]


def test_an_extra_or_optional_package_must_be_imported_lazily() -> None:
    assert check("def store():\n    import etcd3gw\n") == []
    assert check("try:\n    import pynvml\nexcept ImportError:\n    pynvml = None\n") == []
    assert check("import etcd3gw\n") == [
        "made_up.py:1: etcd3gw (extra 'etcd') is imported when the module is: import it inside the function that "
        "needs it, so that a plain install runs"
    ]
    assert len(check("import pynvml\n")) == 1
    # The handler must catch the package's absence; a try that catches something else guards nothing.
    assert len(check("try:\n    import pynvml\nexcept KeyError:\n    pass\n")) == 1


def test_imports_for_type_checking_only_never_run() -> None:
    assert check("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import yaml\n") == []
    assert len(check("import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    import yaml\n")) == 1
