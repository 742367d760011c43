"""Every docstring example of the package runs as written (they are documentation users copy)."""

import doctest
import importlib
import sys
from pathlib import Path

import pytest

import sketchot

PACKAGE = Path(sketchot.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# From the files, not pkgutil.walk_packages: that one must import a package to list its
# modules, and silently lists none of a package whose optional extra is missing.
MODULES = sorted(
    _module_name(path)
    for path in PACKAGE.rglob("*.py")
    if path.name == "__init__.py" or not path.stem.startswith("__")
)

#: Top-level modules of the optional extras (pyproject.toml), by extra.
OPTIONAL_MODULES = {"dask": "dask", "distributed": "dask", "torch": "torch"}


def import_or_skip(name: str):
    """Import a sketchot module; skip when (and only when) an optional extra it needs is
    missing. Any other import error fails the test."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in OPTIONAL_MODULES:
            raise
        pytest.skip(
            f"{name} needs the optional extra {OPTIONAL_MODULES[missing]} "
            f'(pip install ".[{OPTIONAL_MODULES[missing]}]"; {missing} is not installed)'
        )


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = import_or_skip(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        if test.examples:
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_examples_are_found():
    """Guard against a finder that silently finds nothing (24 examples when this was written;
    the modules of a missing optional extra are left out of the count)."""
    count = 0
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in OPTIONAL_MODULES:
                raise
            continue
        count += sum(len(test.examples) for test in doctest.DocTestFinder().find(module, name))
    assert count >= 20


def test_every_module_is_listed():
    """The file walk sees the packages pkgutil would (and the ones it cannot import)."""
    assert {"sketchot", "sketchot.distributed", "sketchot.distributed.solver"} <= set(MODULES)
    assert "sketchot.sketch.poly" in MODULES and not any("__" in m for m in MODULES)


class _BlockExtras:
    """A meta-path finder that makes the optional extras' modules missing."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in OPTIONAL_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_a_missing_extra_skips_and_any_other_missing_module_fails(monkeypatch):
    """The situation of an install without the dask extra, simulated in this process."""
    for key in list(sys.modules):
        if key.split(".")[0] in OPTIONAL_MODULES or key.startswith("sketchot.distributed"):
            monkeypatch.delitem(sys.modules, key)
    monkeypatch.setattr(sys, "meta_path", [_BlockExtras(), *sys.meta_path])
    for name in [m for m in MODULES if m.startswith("sketchot.distributed")]:
        with pytest.raises(pytest.skip.Exception, match=r"needs the optional extra dask"):
            import_or_skip(name)
    with pytest.raises(ModuleNotFoundError):
        import_or_skip("sketchot.no_such_module")
