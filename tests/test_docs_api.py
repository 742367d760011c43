"""The API reference (docs/*.rst) lists every public name: ``sketchot.__all__`` and the
``__all__`` of each subpackage. Parses the reStructuredText itself, so it needs no Sphinx."""

import importlib
import re
from pathlib import Path

import pytest

import sketchot

DOCS = Path(__file__).resolve().parents[1] / "docs"
MODULES = [
    "sketchot",
    "sketchot.kernels",
    "sketchot.sketch",
    "sketchot.solver",
    "sketchot.policy",
    "sketchot.distributed",
    "sketchot.color",
    "sketchot.nn",
]


def documented_names(text: str) -> set[str]:
    """Fully qualified names that an rst text documents: ``autosummary`` entries and
    ``py:data`` directives under the current ``currentmodule``, plus the names that a
    subpackage section spells out as ``module.name`` (re-exports documented at the top)."""
    names: set[str] = set()
    module = None
    in_autosummary = False
    for line in text.splitlines():
        stripped = line.strip()
        if match := re.match(r"\.\. (?:py:)?currentmodule:: (\S+)", stripped):
            module, in_autosummary = match.group(1), False
            continue
        if stripped.startswith(".. autosummary::"):
            in_autosummary = True
            continue
        if match := re.match(r"\.\. (?:py:data|autodata|autofunction|autoclass):: (\S+)", stripped):
            names.add(f"{module}.{match.group(1)}")
            continue
        if in_autosummary:
            if not stripped or stripped.startswith(":"):
                continue  # blank lines and the directive's options
            if line.startswith("   ") and re.fullmatch(r"[\w.]+", stripped):
                names.add(f"{module}.{stripped}")
                continue
            in_autosummary = False
        names.update(re.findall(r"``(sketchot(?:\.\w+)+)``", line))
    return names


@pytest.fixture(scope="module")
def documented() -> set[str]:
    files = sorted(DOCS.glob("**/*.rst"))
    files = [path for path in files if "_build" not in path.parts and "generated" not in path.parts]
    if not files:
        pytest.skip("docs/ is not next to the tests (installed elsewhere)")
    return set().union(*(documented_names(path.read_text()) for path in files))


def import_or_skip(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        extra = (exc.name or "").split(".")[0]
        if extra in ("dask", "torch"):
            pytest.skip(f'{name} needs the optional extra {extra} (pip install ".[{extra}]")')
        raise


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_is_in_the_api_reference(module_name, documented):
    module = import_or_skip(module_name)
    missing = sorted(name for name in module.__all__ if f"{module_name}.{name}" not in documented)
    assert not missing, f"docs/api.rst lacks these names of {module_name}.__all__: {missing}"


def test_the_parser_sees_autosummary_entries():
    text = (
        ".. currentmodule:: pkg\n\n.. autosummary::\n   :toctree: generated/\n\n   one\n"
        "   two\n\nText with ``sketchot.sub.three``.\n\n.. py:data:: four\n"
    )
    assert documented_names(text) == {"pkg.one", "pkg.two", "sketchot.sub.three", "pkg.four"}


def test_docs_python_blocks_compile():
    """The user guide's ``code-block:: python`` snippets are valid Python (they are run by
    hand when a page changes; the gallery's scripts run in the docs build)."""
    files = [
        p
        for p in DOCS.glob("**/*.rst")
        if not {"_build", "generated", "auto_examples"} & set(p.parts)
    ]
    blocks = 0
    for path in files:
        pattern = r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)"
        for match in re.finditer(pattern, path.read_text()):
            code = "\n".join(line[3:] for line in match.group(1).splitlines())
            compile(code, str(path), "exec")
            blocks += 1
    if files:
        assert blocks >= 5


def test_the_version_is_one_fact():
    """The package, its metadata and the changelog's newest entry name the same version."""
    root = Path(__file__).resolve().parents[1]
    declared = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    assert declared is not None and sketchot.__version__ == declared.group(1)
    newest = re.search(r"^## (\S+)", (root / "CHANGELOG.md").read_text(), re.M)
    assert newest is not None and newest.group(1) == declared.group(1)
