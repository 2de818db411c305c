"""An import-linter contract of ours: the source modules import, outside the project, only the standard library.

import-linter's own contracts forbid named modules; "no third-party package at all" cannot be written as a list of
names (every package that may ever be installed), and with ``include_external_packages`` the standard library is
in the graph too, so a wildcard would forbid ``os`` as well. This contract looks at every import made by a source
module (the modules inside it included) and reports each one whose top-level package is neither a root package of
the graph nor in ``sys.stdlib_module_names``. Direct imports suffice: an external package is a single module of the
graph with no imports of its own, and imports of the project are left to the other contracts (``core-alone``).

pyproject.toml names it in ``[tool.importlinter] contract_types``; lint-imports imports it as
``tests.unit.layers_contract`` from the repository root, its working directory. tests/unit/test_layers.py runs it.
"""

from __future__ import annotations

import sys

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck
from importlinter.domain.helpers import module_expressions_to_modules


class StandardLibraryOnlyContract(Contract):
    """Options: ``source_modules``, packages whose modules may import the standard library and no other external
    package (module expressions, as in a forbidden contract; each is taken with its descendants)."""

    type_name = "standard_library_only"

    source_modules = fields.SetField(subfield=fields.ModuleExpressionField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        if str(self.session_options.get("include_external_packages")).lower() != "true":
            raise ValueError("a standard_library_only contract needs include_external_packages = true")
        roots = set(self.session_options["root_packages"])
        sources = module_expressions_to_modules(graph, self.source_modules, as_packages=True)
        for source in sources:
            if source.name not in graph.modules:
                raise ValueError(f"Module '{source.name}' does not exist.")
        offences = []
        for importer in sorted(source.name for source in sources):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                top = imported.split(".")[0]
                if top in roots or top in sys.stdlib_module_names:
                    continue
                lines = sorted(
                    detail["line_number"] for detail in graph.get_import_details(importer=importer, imported=imported)
                )
                offences.append({"importer": importer, "imported": imported, "line_numbers": lines})
        return ContractCheck(kept=not offences, metadata={"offences": offences})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for offence in check.metadata["offences"]:
            lines = ", ".join(f"l.{number}" for number in offence["line_numbers"])
            output.print_error(
                f"{offence['importer']} imports {offence['imported']} ({lines}), which is not in the standard library"
            )
            output.new_line()
