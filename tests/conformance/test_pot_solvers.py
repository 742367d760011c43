"""POT's tests of ``ot.solve_sample``, ported to :func:`sketchot.solve_sample`.

Source: POT's ``test/test_solvers.py`` (MIT licence; repository PythonOT/POT at commit
aed0120, the tests of the installed POT 0.9.7). Each test names the POT test it ports;
inputs, assertions and tolerances are POT's. POT's helper ``assert_allclose_sol`` drops the
result of ``np.allclose`` (it asserts nothing); the ports assert it, with ``np.allclose``'s
default tolerances, on ``value``, ``value_linear``, ``plan`` and the marginals. The
potentials are compared up to the constant that balanced transport leaves free (POT's
``ot.solve`` returns ``(f, g)`` in cost units, sketchot ``(log u, log v)``:
``f = reg log u + c``, ``g = reg log v - c``).

No equivalent (not ported): ``test_solve``, ``test_solve_grid``, ``test_solve_last_step``,
``test_solve_detach``, ``test_solve_envelope``, ``test_solve_not_implemented`` (a cost
matrix ``M``: ``ot.solve``); the ``test_solve_gromov*`` tests (Gromov-Wasserstein);
``test_solve_sample_lazy_emd[metric]`` and ``test_solve_sample_lazy_emd_large`` (exact OT,
``reg=None``, the cost-matrix issue); ``test_solve_sample_geomloss`` (POT's GeomLoss
wrapper); ``test_solve_sample_methods`` for POT's ``1d``, ``gaussian``, ``factored`` and
``lowrank`` methods; ``test_solve_sample_NotImplemented`` (each case asserts a POT
limitation: methods sketchot lacks, or ``nystroem`` with another metric and lazy unbalanced
solves, which sketchot does solve).
"""

from __future__ import annotations

import numpy as np
import ot
import pytest

import sketchot

# POT's default stopThr of the Sinkhorn solvers behind ot.solve
POT_STOPTHR = 1e-9


def grid_case(n: int = 20):
    X_s = np.reshape(1.0 * np.arange(n), (n, 1))
    X_t = np.reshape(1.0 * np.arange(0, n), (n, 1))
    a = ot.utils.unif(X_s.shape[0])
    b = ot.utils.unif(X_t.shape[0])
    return X_s, X_t, a, b


def assert_allclose_sol(sol, ref, reg):
    """POT's ``assert_allclose_sol`` with its ``np.allclose`` asserted."""
    for name in ["value", "value_linear", "plan", "marginal_a", "marginal_b"]:
        mine, theirs = getattr(sol, name), getattr(ref, name)
        assert np.allclose(np.asarray(mine), np.asarray(theirs), equal_nan=True), name
    f = reg * np.asarray(sol.potentials[0])
    g = reg * np.asarray(sol.potentials[1])
    shift = np.mean(np.asarray(ref.potentials[0]) - f)
    assert np.allclose(f + shift, ref.potentials[0])
    assert np.allclose(g - shift, ref.potentials[1])


def test_solve_sample():
    """POT test_solvers.py::test_solve_sample: without ``reg`` POT solves exact OT (value 0
    between a grid and itself), with uniform or given weights; so does sketchot (never an
    entropic solve at a default ``reg``)."""
    X_s, X_t, a, b = grid_case()
    M = ot.dist(X_s, X_t)
    sol00 = ot.solve(M, a, b)
    sol0 = sketchot.solve_sample(X_s, X_t)
    sol = sketchot.solve_sample(X_s, X_t, a, b)
    sol.potentials, sol.marginals, sol.status  # noqa: B018  (POT checks they exist)
    for name in ["value", "value_linear", "plan"]:
        assert np.allclose(np.asarray(getattr(sol0, name)), np.asarray(getattr(sol, name)))
        assert np.allclose(np.asarray(getattr(sol0, name)), np.asarray(getattr(sol00, name)))


@pytest.mark.parametrize(
    "kwargs",
    [{"unbalanced": 1, "unbalanced_type": "cryptic divergence"},
     {"reg": 1, "reg_type": "cryptic divergence"}],
)  # fmt: skip
def test_solve_sample_not_implemented_types(kwargs):
    """POT test_solvers.py::test_solve_sample (its two ``NotImplementedError`` cases):
    an unknown ``unbalanced_type`` raises POT's ``NotImplementedError`` (also a
    ``ValueError`` naming the argument); ``solve_sample`` has no ``reg_type`` (KL
    regularisation only): that keyword is refused by name with a ``TypeError`` (documented
    difference)."""
    X_s, X_t, _, _ = grid_case()
    name = next(key for key in kwargs if key.endswith("_type"))
    expected = NotImplementedError if name == "unbalanced_type" else TypeError
    with pytest.raises(expected, match=name):
        sketchot.solve_sample(X_s, X_t, backend="exact", **{"reg": 1, **kwargs})


def test_solve_sample_lazy():
    """POT test_solvers.py::test_solve_sample_lazy: ``solve_sample(reg=1)`` equals
    ``ot.solve(M, reg=1)``; the lazy plan (``lazy_plan[:]`` -> ``lazy_plan.to_dense()``)
    equals the plan to rtol = atol = 1e-5 (sketchot returns both, no ``lazy=``)."""
    X_s, X_t, a, b = grid_case()
    M = ot.dist(X_s, X_t)
    sol00 = ot.solve(M, a, b, reg=1)
    sol0 = sketchot.solve_sample(X_s, X_t, a, b, reg=1, backend="exact", tol=POT_STOPTHR)
    assert_allclose_sol(sol0, sol00, reg=1)
    np.testing.assert_allclose(sol0.plan, sol0.lazy_plan.to_dense(), rtol=1e-5, atol=1e-5)


def test_solve_sample_methods_nystroem():
    """POT test_solvers.py::test_solve_sample_methods[{'method': 'nystroem', 'rank': 2}]
    (``method='nystroem'`` -> ``backend='nystrom'``; POT's default ``reg`` 1 passed): the
    solve runs on NumPy arrays and on tensors with the same answer. Rank 2 misses sketchot's
    accuracy contract, which a named backend reports with an AccuracyWarning."""
    n_samples_s, n_samples_t, n_features = 10, 9, 2
    rng = np.random.RandomState(42)
    x = rng.randn(n_samples_s, n_features)
    y = rng.randn(n_samples_t, n_features)
    a = ot.utils.unif(n_samples_s)
    b = ot.utils.unif(n_samples_t)
    params = {"reg": 1.0, "backend": "nystrom", "rank": 2, "rng": 0}

    with pytest.warns(sketchot.AccuracyWarning):
        sol = sketchot.solve_sample(x, y, **params)
    torch = pytest.importorskip("torch")
    xb, yb, ab, bb = (torch.from_numpy(v) for v in (x, y, a, b))
    with pytest.warns(sketchot.AccuracyWarning):
        solb = sketchot.solve_sample(xb, yb, ab, bb, **params)
    assert np.allclose(sol.value, float(solb.value))
    assert np.allclose(sol.value_linear, float(solb.value_linear))
    assert np.allclose(sol.plan, solb.plan.numpy())
