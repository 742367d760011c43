"""The solver's options as one object (``options=SolverOptions(...)``) beside the flat
keywords, and signatures written out in the source, so that static tools (IDEs, type
checkers) follow every parameter from the public solves inward (issue 43, item 7)."""

import ast
import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest

import sketchot
from sketchot import SolverOptions

API = Path(sketchot.__file__).parent / "api.py"

#: The public solves that take the solver's options.
SOLVES = ("sinkhorn", "sinkhorn2", "sinkhorn_unbalanced", "solve_sample", "sinkhorn_kernel")


def clouds():
    rng = np.random.default_rng(20261128)
    return rng.random((60, 2)), rng.random((50, 2))


def _definitions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(API.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("name", SOLVES)
def test_every_option_is_written_in_the_source_signature(name):
    """The keywords are in the ``def`` itself (no signature assembled at run time): a reader
    or an IDE sees ``tol``, ``max_iter``, ... and ``options`` where the function is."""
    definition = _definitions()[name]
    keywords = [arg.arg for arg in definition.args.kwonlyargs]
    assert set(SolverOptions.names()) | {"options"} <= set(keywords)
    function = getattr(sketchot, name)
    assert "__signature__" not in vars(inspect.unwrap(function))


@pytest.mark.parametrize("name", SOLVES)
def test_the_options_object_gives_the_flat_keywords_answer(name):
    """The same options as one object or as keywords: the same bits."""
    X, Y = clouds()
    flat = {"tol": 1e-7, "max_iter": 400, "anderson": 0, "check_every": 1}
    options = SolverOptions(**flat)

    def call(**keywords):
        if name == "sinkhorn_kernel":
            kernel = sketchot.make_kernel(X, Y, 0.3, "exact")
            return sketchot.sinkhorn_kernel(None, None, kernel, **keywords)
        if name == "solve_sample":
            return sketchot.solve_sample(X, Y, reg=0.3, backend="exact", **keywords)
        if name == "sinkhorn_unbalanced":
            return sketchot.sinkhorn_unbalanced(None, None, X, Y, 0.3, 1.0, "exact", **keywords)
        return getattr(sketchot, name)(None, None, X, Y, 0.3, "exact", **keywords)

    by_keywords, by_object = call(**flat), call(options=options)
    if name == "sinkhorn2":
        assert by_keywords == by_object
        return
    assert by_object.options == by_keywords.options
    assert np.array_equal(by_object.potentials[0], by_keywords.potentials[0])
    assert by_object.n_iter == by_keywords.n_iter


def test_an_object_and_a_differing_keyword_are_refused_by_name():
    """Either one would silently drop the other; the default value of a keyword is what
    leaving it out gives, so it passes."""
    X, Y = clouds()
    options = SolverOptions(tol=1e-7)
    with pytest.raises(TypeError, match=r"options= and max_iter=50.*dataclasses.replace"):
        sketchot.sinkhorn2(None, None, X, Y, 0.3, options=options, max_iter=50)
    default = SolverOptions().max_iter
    value = sketchot.sinkhorn2(None, None, X, Y, 0.3, "exact", options=options, max_iter=default)
    assert value == sketchot.sinkhorn2(None, None, X, Y, 0.3, "exact", options=options)
    with pytest.raises(TypeError, match=r"options must be a sketchot.SolverOptions.*dict"):
        sketchot.sinkhorn(None, None, X, Y, 0.3, options={"tol": 1e-7})


def test_a_replaced_object_is_the_documented_way_to_change_one_option():
    X, Y = clouds()
    base = SolverOptions(tol=1e-7)
    with pytest.warns(UserWarning, match="max_iter reached"):
        result = sketchot.solve_sample(
            X, Y, reg=0.3, backend="exact", options=dataclasses.replace(base, max_iter=3)
        )
    assert result.options["max_iter"] == 3 and result.n_iter <= 3


def test_exact_transport_refuses_sketchots_options_by_name():
    """Without ``reg`` POT solves the problem: an options object is sketchot's and refused
    by name; POT's own ``max_iter`` passes."""
    X, Y = clouds()
    with pytest.raises(TypeError, match=r"takes none of sketchot's options"):
        sketchot.solve_sample(X, Y, options=SolverOptions())
    with pytest.raises(TypeError, match=r"takes none of sketchot's tol"):
        sketchot.solve_sample(X, Y, tol=1e-7)
    result = sketchot.solve_sample(X, Y, max_iter=100_000)
    assert result.notes == ["reg=None: exact transport solved by POT (ot.solve_sample)"]
