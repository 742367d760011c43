"""Every documented parameter of the public solve functions has an effect or is rejected.

The walk below reads each function's numpydoc "Parameters" section, so a parameter that is
documented but silently dropped on its way to the solver (as ``true_kernel_samples`` once was)
or accepted in a form that acts as another value (``log_domain=1``) fails here.
"""

from __future__ import annotations

import inspect
import re
from contextlib import nullcontext

import numpy as np
import pytest

import sketchot
from sketchot.color import transfer_colors
from sketchot.solver import SolverOptions

# A non-default value of every solver option, and how its effect shows in the result.
NON_DEFAULTS = {
    "max_iter": (7, lambda res: res.n_iter <= 7),
    "tol": (1e-3, lambda res: res.tol == 1e-3),
    "check_every": (3, lambda res: all(it % 3 == 1 for it, _ in res.error_history[1:])),
    "safeguard": ("clip", lambda res: res.safeguard["policy"] == "clip"),
    "log_domain": (np.True_, lambda res: res.log_domain is True),
    # mixing changes the iterates (the plain ones end 1e5 times further from the marginals
    # on this problem at the same iteration, measured); compared with a default solve below
    "anderson": (0, lambda res: res.options["anderson"] == 0),
    "accuracy": (0.5, lambda res: res.true_kernel is not None),
    "certify_first": (np.False_, lambda res: res.options["certify_first"] is False),
    "true_kernel_samples": (5, lambda res: res.true_kernel.n_rows == 5),
    "errors": ("warn", lambda res: res.options["errors"] == "warn"),
    "warn": (np.False_, lambda res: res.options["warn"] is False),
    "verbose": (True, lambda res: res.options["verbose"] is True),
}


def documented_parameters(function) -> list[str]:
    """Names in the numpydoc Parameters section (``a, b : ...`` lines give two names)."""
    doc = inspect.getdoc(function) or ""
    section = doc.split("Parameters\n----------\n", 1)[1].split("\n\n", 1)[0]
    names = []
    for line in section.splitlines():
        match = re.match(r"^(\*{0,2}[A-Za-z_][\w, *]*?)\s*(:|$)", line)
        if match and not line.startswith(" "):
            names += [name.strip() for name in match.group(1).split(",")]
    return names


@pytest.mark.parametrize(
    "function",
    [sketchot.sinkhorn, sketchot.make_kernel, transfer_colors, sketchot.color_transfer],
)
def test_documented_parameters_exist(function):
    """Every documented name is in the signature (or is the documented **kwargs)."""
    accepted = set(inspect.signature(function).parameters)
    for name in documented_parameters(function):
        assert name.lstrip("*") in accepted, f"{function.__name__} documents {name!r}"


def test_solver_options_document_every_field():
    assert set(documented_parameters(SolverOptions)) == set(SolverOptions.names())


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    return rng.random((40, 3)), rng.random((30, 3))


@pytest.mark.parametrize("name", sorted(NON_DEFAULTS))
@pytest.mark.parametrize("entry", ["sinkhorn", "sinkhorn_kernel"])
def test_every_solver_option_takes_effect(problem, name, entry, capsys):
    value, took_effect = NON_DEFAULTS[name]
    X, Y = problem
    backend = "exact" if name in ("log_domain", "anderson") else "nystrom"
    with np.errstate(all="ignore"), pytest.warns() if name == "max_iter" else nullcontext():
        if entry == "sinkhorn":
            res = sketchot.sinkhorn(None, None, X, Y, 0.5, backend, rng=0, **{name: value})
        else:
            kernel = sketchot.make_kernel(X, Y, 0.5, backend, rng=0)
            res = sketchot.sinkhorn_kernel(None, None, kernel, rng=0, **{name: value})
    assert res.options[name] == value
    assert took_effect(res), name
    if name == "anderson":  # an effect that the result's fields alone do not show
        default = sketchot.sinkhorn(None, None, X, Y, 0.5, backend, rng=0)
        assert res.error_history != default.error_history


@pytest.mark.parametrize("name", sorted(NON_DEFAULTS))
def test_colour_functions_pass_every_solver_option(name):
    value, took_effect = NON_DEFAULTS[name]
    rng = np.random.default_rng(1)
    source = rng.integers(0, 256, size=(6, 7, 3)).astype(np.uint8)
    target = rng.integers(0, 128, size=(5, 6, 3)).astype(np.uint8)
    # with max_iter, POT's criterion at 1e-9: the default (the accuracy) is met within it
    options = {name: value, **({"tol": 1e-9} if name == "max_iter" else {})}
    with np.errstate(all="ignore"), pytest.warns() if name == "max_iter" else nullcontext():
        run = transfer_colors(source, target, n_samples=20, rng=0, backend="exact", **options)
    assert run.result.options[name] == value
    if name != "true_kernel_samples":  # the exact kernel's check is always exhaustive
        assert took_effect(run.result), name


@pytest.mark.parametrize("name", ["log_domain", "warn", "verbose"])
@pytest.mark.parametrize("value", [1, 0, "yes"])
def test_booleans_reject_integers_and_strings(problem, name, value):
    X, Y = problem
    with pytest.raises((TypeError, ValueError), match=name):
        sketchot.sinkhorn(None, None, X, Y, 0.5, "exact", **{name: value})


def test_unknown_keyword_is_rejected_naming_it(problem):
    X, Y = problem
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*'replce'"):
        sketchot.sinkhorn(None, None, X, Y, 0.5, "nystrom", replce=True)


PUBLIC_SOLVES = [
    sketchot.sinkhorn,
    sketchot.sinkhorn2,
    sketchot.sinkhorn_unbalanced,
    sketchot.solve_sample,
    sketchot.sinkhorn_kernel,
    sketchot.make_kernel,
]


@pytest.mark.parametrize("function", PUBLIC_SOLVES, ids=lambda f: f.__name__)
def test_public_signatures_name_every_parameter(function):
    """Every parameter is named in the signature and documented (here or, for the
    conveniences' ``**kwargs``, in sinkhorn's own section); the only catch-all left is the
    backend's parameters."""
    signature = inspect.signature(function)
    documented = set(documented_parameters(function))
    own = {name.lstrip("*") for name in documented}
    if "**kwargs" in documented:
        own |= {name.lstrip("*") for name in documented_parameters(sketchot.sinkhorn)}
    for name, param in signature.parameters.items():
        assert name in own, f"{function.__name__}: {name!r} is not documented"
        if param.kind is param.VAR_KEYWORD:
            assert name == "backend_params", f"{function.__name__} takes **{name}"
    if function is not sketchot.make_kernel:
        assert set(SolverOptions.names()) <= set(signature.parameters)


@pytest.mark.parametrize("function", PUBLIC_SOLVES[:4], ids=lambda f: f.__name__)
def test_signature_defaults_are_the_options_defaults(function):
    """One fact in one place: the defaults shown are SolverOptions' own."""
    defaults = SolverOptions()
    for name in SolverOptions.names():
        assert inspect.signature(function).parameters[name].default == getattr(defaults, name)


@pytest.mark.parametrize(
    ("call", "wrong", "right"),
    [
        (lambda X, **kw: sketchot.sinkhorn2(None, None, X, X, 1.0, **kw), "max_iters", "max_iter"),
        (lambda X, **kw: sketchot.solve_sample(X, X, reg=1.0, **kw), "acuracy", "accuracy"),
        (lambda X, **kw: sketchot.sinkhorn(None, None, X, X, 1.0, **kw), "warm_start",
         "warmstart"),
        (lambda X, **kw: sketchot.sinkhorn_kernel(
            None, None, sketchot.make_kernel(X, X, 1.0, "exact"), **kw), "tols", "tol"),
    ],
)  # fmt: skip
def test_conveniences_give_a_did_you_mean(problem, call, wrong, right):
    with pytest.raises(TypeError, match=f"{wrong!r} \\(did you mean {right!r}\\?\\)"):
        call(problem[0], **{wrong: 1})
