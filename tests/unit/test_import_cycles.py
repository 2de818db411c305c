"""No import cycle in rasd (issue 41): the strongly connected components of rasd's import graph, as grimp builds it
for import-linter (imports inside functions and under TYPE_CHECKING count), are single modules. The layers contract
(pyproject.toml, ``rasd-layers``) orders rasd's parts; this also holds inside each part, and for the package's own
``__init__``, which is in no layer. About a second (grimp parses rasd afresh, no cache)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grimp


def rasd_imports() -> dict[str, set[str]]:
    """Every module of rasd and the modules of rasd it imports."""
    graph = grimp.build_graph("rasd", include_external_packages=True, cache_dir=None)
    ours = {module for module in graph.modules if module == "rasd" or module.startswith("rasd.")}
    return {module: graph.find_modules_directly_imported_by(module) & ours for module in ours}


def cycles(imports: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion: a chain of
    imports can be deeper than Python's recursion limit allows), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(imports.get(target, ())))))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_finder_finds_a_cycle() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(imports) == [["a", "b", "c"]]


def test_rasd_has_no_import_cycle() -> None:
    imports = rasd_imports()
    assert "rasd.net.runtime" in imports and "rasd.services.journal" in imports  # the graph is rasd's
    found = cycles(imports)
    chains = [{module: sorted(set(imports[module]) & set(cycle)) for module in cycle} for cycle in found]
    assert found == [], chains
