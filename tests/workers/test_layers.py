"""The floor plan, checked over the source's imports (ast, nothing imported): the
library imports no Redis and nothing of the daemon; the daemon's packages are layers and
each imports only its own layer and those below; no import cycle between modules, hidden
or not; an import inside a function only where it defers a heavy or optional import, and
says so; no private name taken from another module."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY, DAEMON = ROOT / "streamnb", ROOT / "workers"

#: The daemon's layers, lowest first: a module imports only from its own layer and the
#: ones before it. The package's own modules (defaults, exit codes) are the base.
LAYERS = ["", "wire", "store", "observe", "replication", "worker", "client", "milter",
          "protocols", "cli"]
#: ``python -m streamnb_workers`` runs the command line, the top of every layer.
TOP = {"streamnb_workers.__main__"}
#: The word a comment must hold beside an import made inside a function.
DEFER = "defer"


def module_name(path: Path) -> str:
    if path.is_relative_to(DAEMON):
        parts = ("streamnb_workers",) + path.relative_to(DAEMON).with_suffix("").parts
    else:
        parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(top: Path) -> dict[str, Path]:
    return {module_name(p): p for p in sorted(top.rglob("*.py"))}


MODULES = {**sources(LIBRARY), **sources(DAEMON)}


class Import:
    """One imported module (``name``) and, for ``from m import a``, the names taken."""

    def __init__(self, name: str, names: list[str], node: ast.AST, nested: bool,
                 type_checking: bool) -> None:
        self.name, self.names, self.node = name, names, node
        self.nested, self.type_checking = nested, type_checking


def imports(module: str) -> list[Import]:
    """Every import of ``module``'s source, resolved to project modules where it names one
    (``from pkg import mod`` counts as an import of ``pkg.mod``)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, nested: bool, tc: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            in_tc = tc or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                out.extend(Import(a.name, [], child, nested, tc) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - child.level + 1]
                                    + ([base] if base else []))
                names = [a.name for a in child.names]
                subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in MODULES]
                out.append(Import(base, [n for n in names if f"{base}.{n}" not in MODULES],
                                  child, nested, tc))
                out.extend(Import(s, [], child, nested, tc) for s in subs)
            visit(child, inner, in_tc)

    visit(tree, False, False)
    return out


def layer(module: str) -> int:
    if module in TOP:
        return len(LAYERS)
    parts = module.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 and parts[1] in LAYERS else "")


def project_imports(module: str) -> list[Import]:
    return [i for i in imports(module) if i.name in MODULES]


def test_every_daemon_package_is_a_layer():
    packages = {".".join(p.parent.relative_to(DAEMON).parts) for p in DAEMON.rglob("__init__.py")
                if p.parent != DAEMON}
    layers = {pkg.partition(".")[0] for pkg in packages}  # a sub-package is of its layer
    assert layers <= set(LAYERS), f"packages not in LAYERS: {layers - set(LAYERS)}"
    # every package of the daemon installs (pyproject.toml lists them)
    listed = (ROOT / "pyproject.toml").read_text()
    for pkg in packages:
        assert f'"streamnb_workers.{pkg}"' in listed, f"pyproject.toml does not list {pkg}"


def test_library_imports_no_redis_and_no_daemon():
    for module in sources(LIBRARY):
        for imp in imports(module):
            assert imp.name.split(".")[0] not in {"redis", "streamnb_workers"}, \
                f"{module} imports {imp.name}: the library takes payloads, not Redis"


@pytest.mark.parametrize("module", sorted(sources(DAEMON)))
def test_layers_import_downward(module):
    mine = layer(module)
    for imp in project_imports(module):
        if imp.name.startswith("streamnb_workers"):
            assert layer(imp.name) <= mine, (
                f"{module} ({LAYERS[mine] if mine < len(LAYERS) else 'top'}) imports "
                f"{imp.name} ({LAYERS[layer(imp.name)]}): a lower layer imports a higher one")


def test_no_import_cycle():
    graph = {m: {i.name for i in project_imports(m) if i.name != m} for m in MODULES}
    # a package imports its modules' names; that is not a cycle through the package
    for m in graph:
        graph[m] = {d for d in graph[m] if not m.startswith(d + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_in_functions_say_why(module):
    """Neither ``TYPE_CHECKING`` imports nor unexplained imports inside functions: an import
    inside a function defers a heavy or optional import on purpose and says so in a comment
    on its line, the line before, or the function's first comment block."""
    lines = MODULES[module].read_text().splitlines()
    for imp in imports(module):
        where = f"{module}:{imp.node.lineno}"
        assert not imp.type_checking, f"{where}: an import under TYPE_CHECKING hides a cycle"
        if not imp.nested:
            continue
        nearby = " ".join(lines[max(0, imp.node.lineno - 3):imp.node.end_lineno]).lower()
        assert DEFER in nearby, (f"{where}: import of {imp.name} inside a function without a "
                                 f"comment saying what it defers ({DEFER!r})")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_crosses_a_module(module):
    for imp in project_imports(module):
        private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{module} takes private names {private} from {imp.name}"


def test_folders_and_modules_stay_small():
    """No folder of more than about 20 modules, no module over about 450 lines, no class
    of the daemon with more than 20 methods (the floor plan's limits; the library's
    estimators keep scikit-learn's API, which is wider)."""
    for folder, group in itertools.groupby(sorted(MODULES.values()), key=lambda p: p.parent):
        n = sum(1 for p in group if p.name != "__init__.py")
        assert n <= 20, f"{folder.relative_to(ROOT)} holds {n} modules"
    for module, path in MODULES.items():
        text = path.read_text()
        assert text.count("\n") <= 460, f"{module} has {text.count(chr(10))} lines"
        if not module.startswith("streamnb_workers"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                assert len(methods) <= 20, f"{module}.{node.name} has {len(methods)} methods"
