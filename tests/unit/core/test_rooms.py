"""The rooms of the core, checked on the source: no concept writes another's state, and no concept imports another.

rasd/core/node.py's docstring states the rule: each concept module owns its state, reads the world through
``view.World`` and returns effects; it never calls or writes another concept, and node.py is the only module of the
core that knows more than one concept. This test walks the AST of every concept module and proves it:

* every write (an attribute or subscript assignment, an augmented assignment, ``del``, a mutating method call such as
  ``append`` or ``merge``, ``setattr``) is rooted at ``self`` (not ``self.world``) or at a local the function made
  from its own state, a constructor or a literal; never at a parameter (``conn: Conn``), at the world (``world``,
  ``self.world``), at a local bound from the world (``c = self.world.conn(...)``), or at a module-level name. Two
  kinds of parameter are the concept's own and may be written by its private helpers (``_name``): a record of its
  own state (``OWN_RECORDS``: a links ``Contact``, a gather's ``Gather``) and the caller's list of effects being
  built (annotated ``Effects``);
* every attribute a concept reads on the world is a query of ``view.World``;
* a concept module imports no other concept module, and of the core only ``ALLOWED_IMPORTS``.

The analysis is per function and flow-insensitive: a local is as bad as the worst value it is ever bound to.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rasd.core.view import World

from .concepts.world import FakeWorld, peer

CORE = Path(__file__).resolve().parents[3] / "rasd" / "core"
CONCEPTS = ("verdicts", "links", "gossip", "handshake", "floods", "gather", "sweeper", "suspicion", "reunion")
#: The core modules a concept may import: values and pure functions, no concept.
ALLOWED_IMPORTS = frozenset(
    {
        "effects",
        "view",
        "wire",
        "peers",
        "liveness",
        "connections",  # the Conn type
        "events",
        "actions",
        "comms",
        "config",
        "recent",
        "ring",
        "snapshot",
        "stuck",
        "auth",
        "frames",
        "fold",  # folded communicator ranks: values
        "witness",  # the text of a verdict the job's collectives withheld
    }
)
#: Records of a concept's own state that it hands to its own private helpers.
OWN_RECORDS = {"links": frozenset({"Contact"}), "gather": frozenset({"Gather"})}
#: Methods that change the object they are called on: the builtin containers', and the core's own mutators
#: (liveness.Contact, recent.Recent, peers.PeerTable, connections.Connections, wire.FrameReader, stuck.StuckDetector).
MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "add",
        "discard",
        "remove",
        "pop",
        "popitem",
        "popleft",
        "appendleft",
        "extendleft",
        "clear",
        "update",
        "setdefault",
        "sort",
        "reverse",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
        "merge",
        "move_to_end",
        "__setitem__",
        "__delitem__",
        "__setattr__",
        "__delattr__",
        "__iadd__",
        # the core's records
        "retry_later",
        "lost",
        "reset",
        "vouch",
        "forgive",
        "remember",
        "first_sight",
        "connected",
        "heard",
        "sent",
        "authenticated",
        "reaches",
        "ready_for",
        "open_outgoing",
        "open_incoming",
        "feed",
        "observe",
    }
)
#: Builtins whose result holds (or copies) what their arguments hold: ``list(self.gathers.values())`` is self's.
PASS_THROUGH = frozenset(
    {
        "list",
        "tuple",
        "set",
        "frozenset",
        "dict",
        "sorted",
        "reversed",
        "iter",
        "next",
        "enumerate",
        "zip",
        "min",
        "max",
    }
)

# What a value is rooted at, from harmless to worst.
FRESH, SELF, GLOBAL, PARAM, WORLD = "fresh", "self", "a module-level name", "a parameter", "the world"
_RANK = {FRESH: 0, SELF: 0, GLOBAL: 1, PARAM: 2, WORLD: 3}
_OK = (FRESH, SELF)


def _worst(*roots: str) -> str:
    return max(roots, key=_RANK.__getitem__, default=FRESH)


def _functions(tree: ast.Module):
    """(function, is_method) for every function defined at module level or in a class body (nested ones are walked
    with the function that defines them)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, False
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in item.decorator_list)
                    yield item, not static


def _own_body(fn: ast.AST):
    """Every node of ``fn``'s body, not descending into nested function or class definitions (lambdas included)."""
    stack = list(reversed(list(ast.iter_child_nodes(fn))))
    while stack:  # depth first, in source order
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _args(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]


class _Scope:
    """The roots of one function's names (``outer``: the enclosing function's, for closures)."""

    def __init__(self, fn, is_method: bool, own: frozenset[str], outer: dict[str, str] | None = None) -> None:
        self.fn = fn
        self.roots: dict[str, str] = dict(outer or {})
        private = fn.name.startswith("_")
        for i, arg in enumerate(_args(fn)):
            annotation = arg.annotation.id if isinstance(arg.annotation, ast.Name) else None
            if is_method and i == 0:
                self.roots[arg.arg] = SELF
            elif annotation == "World":
                self.roots[arg.arg] = WORLD  # a constructor's world
            elif private and annotation is not None and (annotation in own or annotation == "Effects"):
                self.roots[arg.arg] = SELF  # the concept's own record, or the caller's list of effects
            else:
                self.roots[arg.arg] = PARAM
        for node in _own_body(fn):
            if isinstance(node, ast.Lambda):
                for arg in _args(node):
                    self.roots[arg.arg] = _worst(self.roots.get(arg.arg, FRESH), PARAM)
        self.local = {n.id for n in _own_body(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self._bind_all()

    def root(self, e: ast.AST) -> str:
        if isinstance(e, ast.Name):
            if e.id in self.roots:
                return self.roots[e.id]
            return FRESH if e.id in self.local else GLOBAL  # a local not bound yet in this pass: bottom
        if isinstance(e, ast.Attribute):
            if e.attr == "world" and isinstance(e.value, ast.Name) and self.root(e.value) == SELF:
                return WORLD
            return self.root(e.value)
        if isinstance(e, ast.Subscript):
            return self.root(e.value)
        if isinstance(e, ast.Call):
            f = e.func
            if isinstance(f, ast.Attribute):
                r = self.root(f.value)
                return FRESH if r == GLOBAL else r  # a module's function or a class's constructor returns a new value
            if isinstance(f, ast.Name) and f.id in PASS_THROUGH:
                return _worst(*(self.elements(a) if f.id in ("min", "max") else self.root(a) for a in e.args))
            return FRESH
        if isinstance(e, ast.IfExp):
            return _worst(self.root(e.body), self.root(e.orelse))
        if isinstance(e, ast.BoolOp):
            return _worst(*(self.root(v) for v in e.values))
        if isinstance(e, (ast.NamedExpr, ast.Starred)):
            return self.root(e.value)
        return FRESH  # literals, comprehensions, arithmetic: new values

    def elements(self, e: ast.AST) -> str:
        """The root of what iterating ``e`` yields (a literal tuple of self's containers yields self's)."""
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            return _worst(*(self.root(x) for x in e.elts))
        return self.root(e)

    def _bind(self, target: ast.AST, root: str, value: ast.AST | None = None) -> bool:
        if isinstance(target, ast.Name):
            new = _worst(self.roots.get(target.id, FRESH), root)
            changed = self.roots.get(target.id) != new
            self.roots[target.id] = new
            return changed
        if isinstance(target, (ast.Tuple, ast.List)):
            pairwise = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
            changed = False
            for i, t in enumerate(target.elts):
                v = value.elts[i] if pairwise else None
                changed |= self._bind(t, self.root(v) if v is not None else root, v)
            return changed
        if isinstance(target, ast.Starred):
            return self._bind(target.value, root)
        return False  # an attribute or subscript: a write, checked elsewhere

    def _bind_all(self) -> None:
        for _ in range(20):  # to a fixed point: a name may be bound from one bound later in the source
            changed = False
            for node in _own_body(self.fn):
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        changed |= self._bind(t, self.root(node.value), node.value)
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    changed |= self._bind(node.target, self.root(node.value), node.value)
                elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                    changed |= self._bind(node.target, self.elements(node.iter))
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    changed |= self._bind(node.optional_vars, self.root(node.context_expr))
                elif isinstance(node, ast.NamedExpr):
                    changed |= self._bind(node.target, self.root(node.value))
            if not changed:
                return
        raise AssertionError(f"no fixed point for {self.fn.name}")

    def writes(self):
        """(node, what is written, its root) for every write in the function's own body."""
        for node in _own_body(self.fn):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            for t in targets:
                for sub in ast.walk(t) if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                    if isinstance(sub, (ast.Attribute, ast.Subscript)):
                        yield node, sub.value, self.root(sub.value)
                    elif isinstance(sub, ast.Name) and isinstance(node, ast.AugAssign):
                        yield node, sub, self.root(sub)  # ``out += ...`` extends a list in place
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute) and f.attr in MUTATORS:
                    yield node, f.value, self.root(f.value)
                elif isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args:
                    yield node, node.args[0], self.root(node.args[0])

    def world_reads(self):
        """The attribute names read on the world itself (``world.X``, ``self.world.X``)."""
        for node in _own_body(self.fn):
            if isinstance(node, ast.Attribute) and self._is_world(node.value):
                yield node, node.attr

    def _is_world(self, e: ast.AST) -> bool:
        """Whether ``e`` is the world itself: ``self.world``, a ``world: World`` parameter, or a local bound to one."""
        if isinstance(e, ast.Attribute):
            return e.attr == "world" and isinstance(e.value, ast.Name) and self.root(e.value) == SELF
        if not (isinstance(e, ast.Name) and self.roots.get(e.id) == WORLD):
            return False
        if any(
            a.arg == e.id and isinstance(a.annotation, ast.Name) and a.annotation.id == "World" for a in _args(self.fn)
        ):
            return True
        return any(
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == e.id for t in node.targets)
            and isinstance(node.value, ast.Attribute)
            and self._is_world(node.value)
            for node in _own_body(self.fn)
        )


def _scopes(tree: ast.Module, module: str):
    own = OWN_RECORDS.get(module, frozenset())
    for fn, is_method in _functions(tree):
        scope = _Scope(fn, is_method, own)
        yield scope
        yield from _nested(scope, own)


def _nested(scope: _Scope, own: frozenset[str]):
    for node in _own_body(scope.fn):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = _Scope(node, False, own, outer=scope.roots)
            yield inner
            yield from _nested(inner, own)


def write_violations(source: str, module: str) -> list[str]:
    """Every write in ``source`` (the text of concept module ``module``) not rooted at the concept's own state."""
    found = []
    for scope in _scopes(ast.parse(source), module):
        for node, _, root in scope.writes():
            if root not in _OK:
                found.append(f"{module}.py:{node.lineno} {scope.fn.name}: {ast.unparse(node)!r} writes {root}")
    return found


def world_read_violations(source: str, module: str) -> list[str]:
    """Every attribute read on the world that is not a query of ``view.World``."""
    queries = {n for n in vars(World) if not n.startswith("_")}
    found = []
    for scope in _scopes(ast.parse(source), module):
        for node, attr in scope.world_reads():
            if attr not in queries:
                found.append(f"{module}.py:{node.lineno} {scope.fn.name}: world.{attr} is not a World query")
    return found


def imported_core_modules(source: str) -> set[str]:
    """The modules of rasd.core that ``source`` (a module of rasd.core) imports, by name; any other module of rasd
    is named in full."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif node.level > 1:
                found.add("." * node.level + (node.module or ""))
            elif node.module == "rasd.core":
                found |= {a.name for a in node.names}
            elif node.module and node.module.startswith("rasd.core."):
                found.add(node.module.split(".")[2])
            elif node.module and node.module.split(".")[0] == "rasd":
                found.add(node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["rasd", "core"] and len(parts) > 2:
                    found.add(parts[2])
                elif parts[0] == "rasd":
                    found.add(alias.name)
    return found


def import_violations(source: str, module: str) -> list[str]:
    return [
        f"{module}.py imports {m}" + (" (a concept)" if m in CONCEPTS else "")
        for m in sorted(imported_core_modules(source) - {module})
        if m not in ALLOWED_IMPORTS
    ]


def _source(module: str) -> str:
    return (CORE / f"{module}.py").read_text()


# --- the core as it is ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", CONCEPTS)
def test_no_concept_writes_state_that_is_not_its_own(module):
    assert write_violations(_source(module), module) == []


@pytest.mark.parametrize("module", CONCEPTS)
def test_a_concept_reads_the_world_only_through_its_queries(module):
    assert world_read_violations(_source(module), module) == []


@pytest.mark.parametrize("module", CONCEPTS)
def test_a_concept_imports_no_other_concept(module):
    assert import_violations(_source(module), module) == []


def test_node_is_the_only_core_module_that_knows_more_than_one_concept():
    knowing = {
        path.stem: sorted(imported_core_modules(path.read_text()) & set(CONCEPTS) - {path.stem})
        for path in sorted(CORE.glob("*.py"))
    }
    assert {m for m, concepts in knowing.items() if len(concepts) > 1} == {"node"}
    assert knowing["node"] == sorted(CONCEPTS)


def test_every_concept_module_is_checked():
    """A new concept module must be added to CONCEPTS: every module of the core that takes a World is one."""
    takes_world = {
        path.stem
        for path in CORE.glob("*.py")
        if "world: World" in path.read_text() and path.stem not in ("view", "node")
    }
    assert takes_world == set(CONCEPTS)


def test_the_fake_world_answers_every_query_of_the_protocol():
    fake = FakeWorld(peer(1))
    missing = [n for n in vars(World) if not n.startswith("_") and not hasattr(fake, n)]
    assert missing == []


# --- the checker catches what it must ------------------------------------------------------------------------------


def _module(body: str, signature: str = "self, conn: Conn, key: PeerKey, out, now: float", name: str = "on_x") -> str:
    lines = "\n".join("        " + line for line in body.splitlines())
    return (
        "from .connections import Conn\n"
        "_TABLE = {}\n\n"
        "class Concept:\n"
        "    def __init__(self, world: World) -> None:\n"
        "        self.world = world\n"
        "        self.items = {}\n\n"
        f"    def {name}({signature}):\n"
        f"{lines}\n"
    )


@pytest.mark.parametrize("module", CONCEPTS)
def test_a_write_planted_in_each_concept_module_is_caught(module):
    """Into the first public method of the module's concept that takes a parameter: a write to that parameter, one
    to the world, and one through a local bound from the world, each reported (and the module is clean without)."""
    tree = ast.parse(_source(module))
    method = next(
        fn
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_") and len(_args(fn)) >= 2
    )
    param = _args(method)[1].arg
    planted = f"{param}.planted = 1\nself.world.planted = 2\nw = self.world.table\nw.merge([])"
    method.body[:0] = ast.parse(planted).body
    found = write_violations(ast.unparse(tree), module)
    assert [v.rsplit(" writes ", 1)[1] for v in found] == [PARAM, WORLD, WORLD], found


def test_the_checker_reports_a_planted_write_to_a_connection():
    found = write_violations(_module("conn.state = 1"), "links")
    assert len(found) == 1
    assert "'conn.state = 1' writes a parameter" in found[0]


@pytest.mark.parametrize(
    ("body", "root"),
    [
        ("conn.state = 1", PARAM),
        ("conn.peer, self.x = None, 1", PARAM),
        ("conn.last_recv += 1.0", PARAM),
        ("del conn.reader", PARAM),
        ("conn.reader.feed(b'')", PARAM),
        ("setattr(conn, 'state', 1)", PARAM),
        ("out += [key]", PARAM),
        ("out.append(key)", PARAM),
        ("key.addr.__setitem__(0, 1)", PARAM),
        ("self.world.table.merge([])", WORLD),
        ("self.world.dead.add(key)", WORLD),
        ("self.world.hung[key] = now", WORLD),
        ("world = self.world\nworld.dead.discard(key)", WORLD),
        ("c = self.world.conn(1)\nc.state = None", WORLD),
        ("c = self.world.conn(1) if now else None\nc.peer = None", WORLD),
        ("for c in self.world.conns_list():\n    c.last_send = now", WORLD),
        ("for c in list(self.world.ready_conns()):\n    c.last_send = now", WORLD),
        ("table = self.world.table\nalias = table\nalias.merge([])", WORLD),
        ("alias = table\ntable = self.world.table\nalias.merge([])", WORLD),  # bound later in the source
        ("first, *rest = self.world.conns_list()\nfirst.state = 1", WORLD),
        ("_TABLE[key] = now", GLOBAL),
        ("def inner(c):\n    c.state = 1\ninner(conn)", PARAM),
        ("f = lambda c: c.reader.feed(b'')", PARAM),
    ],
)
def test_the_checker_reports_every_kind_of_foreign_write(body, root):
    found = write_violations(_module(body), "links")
    assert len(found) == 1 and found[0].endswith(f"writes {root}"), found


@pytest.mark.parametrize(
    "body",
    [
        "self.x = conn",
        "self.world = None",
        "self.items[conn.id] = conn",
        "del self.items[key]",
        "c = self.items.get(1)\nc.state = 1",
        "c = self.items.get(conn.peer) if conn.peer else None\nc.state = 1",
        "for c in list(self.items.values()):\n    c.state = 1",
        "for k, c in sorted(self.items.items()):\n    c.state = k",
        "for d in (self.a, self.b):\n    d.clear()",
        "g = Gather(root=1)\ng.pending.add(1)",
        "acc = []\nacc.append(conn)\nacc += [key]",
        "seen: set[int] = set()\nseen.add(1)",
        "x = self.world.conn(1)\ny = x.peer\nself.items[y] = x",
        "data = self.world.local_data()\ndata = dataclasses.replace(data)",
        "def inner(c):\n    self.items[c] = 1\n    return c.state\ninner(conn)",
    ],
)
def test_the_checker_accepts_writes_to_the_concepts_own_state(body):
    assert write_violations(_module(body), "links") == []


def test_own_records_and_effect_lists_are_the_concepts_own_only_in_its_private_helpers():
    contact = "contact.hung = True\nout += [1]"
    assert write_violations(_module(contact, "self, contact: Contact, out: Effects", "_hung"), "links") == []
    # Another concept's record type, or a public method: a parameter like any other.
    assert len(write_violations(_module(contact, "self, contact: Contact, out: Effects", "_hung"), "floods")) == 1
    assert len(write_violations(_module(contact, "self, contact: Contact, out: Effects", "hung"), "links")) == 2
    # A Conn is never the concept's own, even in a private helper.
    assert len(write_violations(_module("conn.state = 1", "self, conn: Conn", "_drop"), "links")) == 1


def test_a_static_or_module_function_owns_no_self():
    source = "class C:\n    @staticmethod\n    def f(self):\n        self.x = 1\n\ndef g(p):\n    p.append(1)\n"
    assert [v.split(": ", 1)[0] for v in write_violations(source, "ring")] == ["ring.py:4 f", "ring.py:7 g"]


def test_the_checker_reports_a_world_attribute_that_is_no_query():
    assert world_read_violations(_module("n = self.world.links.contacts"), "floods") == [
        "floods.py:10 on_x: world.links is not a World query"
    ]
    assert world_read_violations(_module("world = self.world\nn = world.verdicts.dead"), "floods") == [
        "floods.py:11 on_x: world.verdicts is not a World query"
    ]
    assert world_read_violations(_module("t = self.world.table\nn = t.get(key)"), "floods") == []
    # A constructor's ``world: World`` is the world too.
    init = (
        "class C:\n"
        "    def __init__(self, world: World) -> None:\n"
        "        self.t = world.links\n"
        "        world.dead.add(1)\n"
    )
    assert world_read_violations(init, "floods") == ["floods.py:3 __init__: world.links is not a World query"]
    assert write_violations(init, "floods") == ["floods.py:4 __init__: 'world.dead.add(1)' writes the world"]


@pytest.mark.parametrize(
    ("line", "imported"),
    [
        ("from .links import Links", "links"),
        ("from . import gossip", "gossip"),
        ("from . import auth, sweeper", "sweeper"),
        ("from rasd.core import verdicts", "verdicts"),
        ("from rasd.core.reunion import spread", "reunion"),
        ("import rasd.core.sweeper", "sweeper"),
        ("from .node import Node", "node"),
        ("from ..net import runtime", "..net"),
        ("import rasd.net.runtime", "rasd.net.runtime"),
    ],
)
def test_the_checker_reports_a_planted_import(line, imported):
    source = f"from . import wire\nfrom .effects import Say\nimport enum\n{line}\n"
    (found,) = import_violations(source, "floods")
    assert found.startswith(f"floods.py imports {imported}")
