"""Every docstring example of the package runs as written (they are documentation users copy)."""

import doctest
import importlib
import pkgutil

import pytest

import sketchot

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(sketchot.__path__, prefix="sketchot.")
    if not info.name.split(".")[-1].startswith("__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        if test.examples:
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_examples_are_found():
    """Guard against a finder that silently finds nothing (24 examples when this was written)."""
    count = sum(
        len(test.examples)
        for name in MODULES
        for test in doctest.DocTestFinder().find(importlib.import_module(name), name)
    )
    assert count >= 20
