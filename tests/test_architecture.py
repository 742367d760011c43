"""The layout shows the architecture: imports only point down, and the solver knows kernels
only through the operator contract (no backend module, no private attribute)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sketchot"

#: Layer of each part of the package, bottom up.
LAYERS = {
    "_validation": 0, "_memory": 0, "_dask": 0, "_defaults": 0, "_parallel": 1, "gibbs": 1,
    "sketch": 1,
    "distributed.geometry": 1, "kernels": 2, "distributed.kernels": 2, "solver": 3,
    "distributed.solver": 3, "distributed": 3, "da": 4, "color": 4,
}  # fmt: skip
BACKEND_MODULES = {"exact", "rff", "nystrom", "polyts"}
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def layer(parts: list[str]) -> int:
    """Layer of a module given as path components (``distributed`` is split by module)."""
    name = ".".join(parts[:2]).removesuffix(".py")
    return LAYERS.get(name, LAYERS[parts[0].removesuffix(".py")])


def part_of(path: Path) -> list[str]:
    return list(path.relative_to(PACKAGE).parts)


def imported_modules(path: Path) -> list[list[str]]:
    """Imported sketchot modules as path components below the package."""
    here = list(path.relative_to(PACKAGE).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                found.append(base + (node.module.split(".") if node.module else []))
            elif node.module and node.module.startswith("sketchot"):
                found.append(node.module.split(".")[1:])
        elif isinstance(node, ast.Import):
            found += [a.name.split(".")[1:] for a in node.names if a.name.startswith("sketchot.")]
    return [parts for parts in found if parts]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = layer(part_of(path))
    for parts in imported_modules(path):
        assert layer(parts) <= own, f"{path.name} imports {'.'.join(parts)} (a layer up)"


def test_solver_imports_no_backend_module_and_no_private_attribute():
    for path in sorted((PACKAGE / "solver").glob("*.py")):
        for parts in imported_modules(path):
            assert not (parts[0] == "kernels" and parts[-1] in BACKEND_MODULES), path.name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                owner = node.value.id if isinstance(node.value, ast.Name) else ""
                assert node.attr.startswith("__") or owner in ("self", "cls"), (
                    f"{path.name}: private attribute .{node.attr}"
                )
