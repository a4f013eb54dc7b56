"""The package's import direction (style.md §4.1), checked on the source's AST.

functional → torch only; modules → torch, tensordict, torchrl, functional;
objectives → may add torchrl.objectives and modules; recipes and cli → anything;
nothing else in the package imports recipes; nothing but ``__main__`` imports cli.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ac_extensions"
STDLIB_OK = set(sys.stdlib_module_names)

ALLOWED = {
    "data": {"torch", "tensordict", "torchrl", "ac_extensions.data"},
    "functional": {"torch", "ac_extensions.functional"},
    "modules": {
        "torch",
        "tensordict",
        "torchrl",
        "ac_extensions.functional",
        "ac_extensions.modules",
    },
    "objectives": {
        "torch",
        "tensordict",
        "torchrl",
        "ac_extensions.functional",
        "ac_extensions.modules",
        "ac_extensions.objectives",
    },
}


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
