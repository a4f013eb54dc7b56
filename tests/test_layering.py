"""The package's import direction, checked on the source's AST, and the README's sentence on it.

Each layer of the package imports exactly the layers :data:`LAYERS` lists (no more: the
direction holds; no fewer: the README's sentence stays true), besides torch, tensordict,
torchrl, the standard library and, for ``runtime``, the environment / cluster packages. No
recipe imports another recipe; nothing but ``cli`` imports recipes (``cli`` loads them by
name); nothing but ``__main__`` imports cli; and the import graph has no cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ac_extensions"
STDLIB_OK = set(sys.stdlib_module_names)
THIRD_PARTY = {"torch", "tensordict", "torchrl"}
ENVIRONMENTS = {"numpy", "gymnasium", "ale_py", "minatar", "ray"}

LAYERS = {
    "functional": (),
    "modules": (),
    "data": (),
    "objectives": ("functional", "modules"),
    "runtime": ("modules",),
    "recipes": ("data", "modules", "objectives", "runtime"),
}
"""Layer → the package layers it imports (``cli`` may import anything)."""

ALLOWED = {
    layer: (set() if layer == "functional" else set(THIRD_PARTY))
    | ({"torch"} if layer == "functional" else set())
    | (ENVIRONMENTS if layer == "runtime" else set())
    | {f"ac_extensions.{name}" for name in (layer, *uses)}
    for layer, uses in LAYERS.items()
    if layer != "recipes"
}


def layers_sentence() -> str:
    """The README's sentence on the import direction, from :data:`LAYERS`."""
    parts = [
        f"`{layer}` → " + (", ".join(f"`{u}`" for u in uses) if uses else "none")
        for layer, uses in LAYERS.items()
    ]
    return "Package layers each import only: " + "; ".join(parts) + "; `cli` → any."


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: use absolute imports, not relative ones")
            names.add(node.module or "")
    return names


def allowed(name: str, prefixes: set[str]) -> bool:
    root = name.split(".")[0]
    return root in STDLIB_OK or any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_it_may(layer):
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files, f"no files in {layer}"
    for path in files:
        bad = {n for n in imported_modules(path) if not allowed(n, ALLOWED[layer])}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


def test_nothing_imports_recipes():
    for path in PACKAGE.rglob("*.py"):
        if {"recipes", "cli"} & set(path.relative_to(PACKAGE).parts):  # cli may import anything
            continue
        assert not any(n.startswith("ac_extensions.recipes") for n in imported_modules(path)), path


def test_nothing_imports_cli():
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts or path.name == "__main__.py":
            continue
        assert not any(n.startswith("ac_extensions.cli") for n in imported_modules(path)), path


def test_layering_check_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import tensordict\nfrom torchrl.objectives import LossModule\n")
    names = imported_modules(bad)
    assert {n for n in names if not allowed(n, ALLOWED["functional"])} == {
        "tensordict",
        "torchrl.objectives",
    }


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports (lazily too); ``from P import m`` counts P.m."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                edges.add(node.module)
                edges.update(
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if f"{node.module}.{a.name}" in modules
                )
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path (first = last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_recipe_imports_another_recipe():
    for path in (PACKAGE / "recipes").glob("*.py"):
        if path.name == "__init__.py":  # the package re-exports its recipes' configs
            continue
        others = {n for n in imported_modules(path) if n.startswith("ac_extensions.recipes")}
        assert not others, f"{path.name} imports {sorted(others)}: shared code goes to runtime"


def test_runtime_is_below_the_recipes():
    for path in (PACKAGE / "runtime").rglob("*.py"):
        names = imported_modules(path)
        assert not any(n.startswith(("ac_extensions.recipes", "ac_extensions.cli")) for n in names)


def package_layers_imported(layer: str) -> set[str]:
    """The package layers that the files of ``layer`` import."""
    found = set()
    for path in (PACKAGE / layer).rglob("*.py"):
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[0] == "ac_extensions" and len(parts) > 1 and parts[1] != layer:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_imports_exactly_its_listed_layers(layer):
    assert package_layers_imported(layer) == set(LAYERS[layer])


def test_readme_states_the_import_direction():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert layers_sentence() in readme, layers_sentence()
