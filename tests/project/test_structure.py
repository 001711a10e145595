"""The shape of the code (issue 14): no module over 600 lines, no function over 80, no import
cycles between modules, metadata/ a leaf, and import-linter's layering contract kept.

Each check lists every offender, so a failure says what to split. The import graph is built
with ``ast`` from the source folders as pyproject.toml maps them into the package, and counts
every import: at module level, inside functions and under ``TYPE_CHECKING`` alike, since each
one ties the two modules together for a reader.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from functools import cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# Known exceptions, each with the reason; the tests fail once an entry no longer applies, so
# these lists only shrink.
LONG_FUNCTIONS_OWNED_ELSEWHERE: dict[str, str] = {}
LONG_MODULES_OWNED_ELSEWHERE: dict[str, str] = {}
CYCLES_OWNED_ELSEWHERE: list[set[str]] = []
METADATA_LEAF_MAY_IMPORT = ("sediment.metadata", "sediment.errors", "sediment._fs", "sediment._s3")
# module -> private calls on another module's objects still to be given public names
PRIVATE_CALLS_OWNED_ELSEWHERE: dict[str, set[str]] = {}
INTERPRETER_PRIVATE_CALLS = {"os._exit", "sys._getframe"}  # documented interpreter APIs with a leading _


@cache
def modules() -> dict[str, str]:
    """Every module of the package: dotted name -> file, per pyproject's package-dir."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    found: dict[str, str] = {}
    for package, folder in mapping.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if os.path.exists(os.path.join(dirpath, d, "__init__.py")))
            rel = os.path.relpath(dirpath, base)
            parts = [package] + ([] if rel == "." else rel.split(os.sep))
            for name in filenames:
                if name.endswith(".py"):
                    dotted = ".".join(parts if name == "__init__.py" else [*parts, name[:-3]])
                    found.setdefault(dotted, os.path.join(dirpath, name))
    return found


@cache
def parsed(module: str) -> ast.Module:
    with open(modules()[module], encoding="utf-8") as f:
        return ast.parse(f.read(), modules()[module])


def _owner(name: str) -> str | None:
    """The module a dotted import name lands in: itself, or its nearest enclosing package."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its body."""
    mods = modules()
    is_package = mods[module].endswith("__init__.py")
    out: set[str] = set()
    for node in ast.walk(parsed(module)):
        if isinstance(node, ast.Import):
            out.update(_owner(a.name) for a in node.names if a.name.split(".")[0] == "sediment")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: None if is_package else -1]
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "sediment":
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                out.add(full if full in mods else _owner(source))
    out.discard(None)
    out.discard(module)
    return out  # type: ignore[return-value]


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(component)
    return cycles


def long_functions() -> dict[str, int]:
    """``module:qualified.name`` -> lines, for every function over the limit."""
    found = {}
    for module in modules():
        def visit(node: ast.AST, prefix: str, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        lines = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                        if lines > MAX_FUNCTION_LINES:
                            found[f"{module}:{name}"] = lines
                    visit(child, name + ".")
        visit(parsed(module), "")
    return found


def private_calls(tree: ast.Module) -> set[str]:
    """Every ``obj._name(...)`` call whose receiver is not ``self`` or ``cls`` and whose method no
    function or class of the same source defines: a call into another module's privates."""
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, receiver = node.func.attr, node.func.value
            if (not name.startswith("_") or (name.startswith("__") and name.endswith("__")) or name in defined
                    or isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")):
                continue
            found.add(ast.unparse(node.func))
    return found - INTERPRETER_PRIVATE_CALLS


def test_the_package_is_found() -> None:
    mods = modules()
    for name in ("sediment.engine.engine", "sediment.wal.record", "sediment.trace.store", "sediment.blob.s3",
                 "sediment.metadata.protocol", "sediment.wal.replication.node.storage_node"):
        assert name in mods
    assert "sediment.engine.scheduler" in imports_of("sediment.engine.engine")


def test_no_module_over_600_lines() -> None:
    over = {}
    for module, path in modules().items():
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_MODULE_LINES:
            over[module] = lines
    unexpected = {m: n for m, n in over.items() if m not in LONG_MODULES_OWNED_ELSEWHERE}
    assert not unexpected, f"modules over {MAX_MODULE_LINES} lines (split them): {unexpected}"
    stale = sorted(set(LONG_MODULES_OWNED_ELSEWHERE) - set(over))
    assert not stale, f"no longer over the limit, remove from LONG_MODULES_OWNED_ELSEWHERE: {stale}"


def test_no_function_over_80_lines() -> None:
    over = long_functions()
    unexpected = {f: n for f, n in over.items() if f not in LONG_FUNCTIONS_OWNED_ELSEWHERE}
    assert not unexpected, f"functions over {MAX_FUNCTION_LINES} lines (split them): {unexpected}"
    stale = sorted(set(LONG_FUNCTIONS_OWNED_ELSEWHERE) - set(over))
    assert not stale, f"no longer over the limit, remove from LONG_FUNCTIONS_OWNED_ELSEWHERE: {stale}"


def test_no_import_cycles_between_modules() -> None:
    graph = {m: imports_of(m) for m in modules()}
    cycles = import_cycles(graph)
    unexpected = [sorted(c) for c in cycles if c not in CYCLES_OWNED_ELSEWHERE]
    assert not unexpected, f"import cycles (break them): {unexpected}"
    stale = [sorted(c) for c in CYCLES_OWNED_ELSEWHERE if c not in cycles]
    assert not stale, f"these cycles are gone, remove them from CYCLES_OWNED_ELSEWHERE: {stale}"


def test_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert import_cycles(graph) == [{"a", "b", "c"}]
    assert import_cycles({"x": {"y"}, "y": set()}) == []


def test_metadata_is_a_leaf() -> None:
    """wal/ and trace/ may use the MetadataStore protocol and keys only because metadata/
    imports nothing above sediment.errors, sediment._fs and sediment._s3 (so the layers need no exemption for it)."""
    wrong = {}
    for module in modules():
        if module.startswith("sediment.metadata"):
            bad = sorted(i for i in imports_of(module) if not i.startswith(METADATA_LEAF_MAY_IMPORT))
            if bad:
                wrong[module] = bad
    assert not wrong, f"metadata/ must stay a leaf package: {wrong}"


def test_import_linter_contracts_are_kept() -> None:
    """The layering of pyproject.toml's [tool.importlinter] (as `make lint` runs it)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "lint_imports.py"), "--no-logo"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_module_calls_private_methods_of_another_modules_objects() -> None:
    """A method a second module needs gets a public name; a ``_name`` stays its module's business."""
    found = {m: calls for m in modules() if (calls := private_calls(parsed(m)))}
    unexpected = {m: sorted(c - PRIVATE_CALLS_OWNED_ELSEWHERE.get(m, set())) for m, c in found.items()
                  if c - PRIVATE_CALLS_OWNED_ELSEWHERE.get(m, set())}
    assert not unexpected, f"private calls across modules (give the method a public name): {unexpected}"
    stale = {m: sorted(c - found.get(m, set())) for m, c in PRIVATE_CALLS_OWNED_ELSEWHERE.items()
             if c - found.get(m, set())}
    assert not stale, f"gone, remove them from PRIVATE_CALLS_OWNED_ELSEWHERE: {stale}"


def test_private_call_finder_finds_them() -> None:
    tree = ast.parse("class A:\n    def _own(self): self._x(); other._own(); log._flush(); os._exit(1); a.__len__()\n")
    assert private_calls(tree) == {"log._flush"}
