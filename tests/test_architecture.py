"""The layout shows the architecture: subpackages along the data flow, imports only downward,
no import circles, no module over 400 lines, CuPy imported in one place (read from the source
with ``ast``, every import counted, those inside functions too)."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpuknap")

#: Subpackages from the bottom up: a module may import its own subpackage and those below.
LAYERS = {"engine": 0, "schedule": 1, "search": 2, "costs": 3, "formats": 4, "sweep": 5, "cli": 6}
#: Modules outside the subpackages: the version at the bottom, the public API and ``python -m`` on top.
TOP_LEVEL = {"gpuknap._version": -1, "gpuknap": 7, "gpuknap.__main__": 8}
MAX_LINES = 400


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].endswith("__init__.py")


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    """The gpuknap modules an ``import from`` reaches (a name may be a submodule)."""
    if node.level:
        base = module.split(".") if _is_package(module) else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("gpuknap"):
        return []
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    whole = target in MODULES and len(subs) < len(node.names)  # a name from the package itself
    return ([target] if whole else []) + subs


def imports() -> dict[str, set]:
    """Every gpuknap module each gpuknap module imports, anywhere in its source."""
    graph = {}
    for module, path in MODULES.items():
        with open(path) as fh:
            tree = ast.parse(fh.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                found.update(_resolve(module, node))
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in MODULES)
        graph[module] = found - {module}
    return graph


def layer(module: str) -> int:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    return LAYERS[module.split(".")[1]]


def test_every_module_is_in_a_layer():
    for module in MODULES:
        assert module in TOP_LEVEL or module.split(".")[1] in LAYERS, f"{module} is outside the layout"


def test_imports_only_go_down():
    upward = [(m, t) for m, targets in imports().items() for t in targets if layer(t) > layer(m)]
    assert not upward, f"imports of a higher layer: {upward}"


def test_no_import_circles():
    graph = imports()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_engine_and_the_search_never_import_the_cli_or_the_sweep():
    for m, targets in imports().items():
        if layer(m) <= LAYERS["search"]:
            assert not any(t.startswith(("gpuknap.cli", "gpuknap.sweep")) for t in targets), (m, targets)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_are_at_most_400_lines(module):
    with open(MODULES[module]) as fh:
        assert len(fh.read().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_subpackage_says_what_it_owns(package):
    doc = ast.get_docstring(ast.parse(open(MODULES[f"gpuknap.{package}"]).read()))
    assert doc and "Owns" in doc, f"gpuknap/{package}/__init__.py needs a docstring saying what it owns"


def test_cupy_is_imported_in_one_module_only():
    users = []
    for module, path in MODULES.items():
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "cupy" for n in names):
                users.append(module)
    assert set(users) == {"gpuknap.engine._backend"}, users
