"""``sketchot.solve(M, ...)`` (``sketchot/matrix.py``): POT's ``ot.solve`` on a cost matrix,
with its names, defaults and result fields.

Sources: POT's ``test/test_solvers.py`` (POT 0.9.7, MIT licence): ``test_solve``,
``test_solve_grid`` and ``test_solve_not_implemented`` are ported with their inputs (POT's
``RandomState(0)`` stream, a local generator, reproduces them); POT's
``assert_allclose_sol`` drops the result of ``np.allclose``, the ports assert it (its default
tolerances, ``rtol=1e-5``, ``atol=1e-8``). Against ``ot.solve`` on the same ``M``: POT's
stopThr passed as ``tol`` and ``np.allclose``'s tolerances (POT's own in the ported tests);
plans of different Sinkhorn solvers to ``atol=1e-5`` (POT test_bregman.py::
test_sinkhorn_variants). Our own cases draw from ``np.random.default_rng(seed)``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import ot
import pytest

import sketchot

# POT's default stopThr of the Sinkhorn solvers behind ot.solve
POT_TOL = 1e-9
ACCURACY = 1e-3  # the default accuracy (sketchot._defaults.DEFAULT_ACCURACY)
FIELDS = ("value", "value_linear", "plan", "marginal_a", "marginal_b")


def pot_case():
    """POT test_solvers.py::test_solve's inputs: 10 and 7 Gaussian points in 2-D."""
    rng = np.random.RandomState(0)
    x, y = rng.randn(10, 2), rng.randn(7, 2)
    return ot.utils.unif(10), ot.utils.unif(7), ot.dist(x, y)


def random_case(seed, n=40, m=30):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(n, 2)), rng.normal(size=(m, 2)) + 0.5
    a, b = rng.random(n) + 0.1, rng.random(m) + 0.1
    return a / a.sum(), b / b.sum(), ot.dist(X, Y)


def pot_unbalanced_value(plan, M, a, b, reg, unbalanced, unbalanced_type="KL", reg_type="kl"):
    """POT's unbalanced objective with the generalised KL (``kl_div(..., mass=True)``) and
    the penalty of ``unbalanced_type`` (``ot.unbalanced._lbfgs``'s ``marg_kl``, ``marg_tv``);
    ``reg_type='entropy'``: its ``reg_entropy``, ``reg (sum P log P - sum P)``."""
    nx = ot.backend.NumpyBackend()
    sides = unbalanced if isinstance(unbalanced, tuple) else (unbalanced, unbalanced)
    if reg_type == "entropy":
        value = np.sum(plan * M) + reg * (np.sum(plan * np.log(plan + 1e-16)) - plan.sum())
    else:
        value = np.sum(plan * M) + reg * nx.kl_div(plan, a[:, None] * b[None, :], mass=True)
    for penalty, marginal, weights in zip(sides, (plan.sum(1), plan.sum(0)), (a, b), strict=True):
        if np.isfinite(penalty):
            if unbalanced_type == "TV":
                value += penalty * np.abs(marginal - weights).sum()
            else:
                value += penalty * nx.kl_div(marginal, weights, mass=True)
    return value


def assert_allclose_sol(sol, ref):
    """POT's ``assert_allclose_sol`` with its ``np.allclose`` asserted."""
    for name in FIELDS:
        assert np.allclose(getattr(sol, name), getattr(ref, name), equal_nan=True), name


# ------------------------------------------------------------------- POT's tests, ported


def test_solve():
    """POT test_solvers.py::test_solve: uniform weights by default, the result's
    ``potentials``, ``marginals`` and ``status``, and POT's ``NotImplementedError`` for an
    unknown penalty or regulariser. Added: the answer is ``ot.solve``'s on the same ``M``."""
    a, b, M = pot_case()
    reg = 1e-1
    sol0 = sketchot.solve(M, reg=reg)
    sol = sketchot.solve(M, a, b, reg=reg)
    assert len(sol.potentials) == 2 and len(sol.marginals) == 2
    assert sol.status == "converged"
    assert_allclose_sol(sol0, sol)
    ref = ot.solve(M, a, b, reg=reg)
    assert_allclose_sol(sketchot.solve(M, a, b, reg=reg, tol=POT_TOL), ref)
    with pytest.raises(NotImplementedError):
        sketchot.solve(M, unbalanced=1, unbalanced_type="cryptic divergence")
    with pytest.raises(NotImplementedError):
        sketchot.solve(M, reg=1, reg_type="cryptic divergence")


def test_solve_not_implemented():
    """POT test_solvers.py::test_solve_not_implemented: an unknown regulariser with reg, an
    unknown penalty with unbalanced (POT's exact path, reg=None) raise NotImplementedError;
    with reg the penalty is refused by sketchot, by name."""
    _, _, M = pot_case()
    with pytest.raises(NotImplementedError, match="reg_type must be 'KL' or 'entropy'"):
        sketchot.solve(M, reg=1.0, reg_type="cryptic divergence")
    with pytest.raises(NotImplementedError):
        sketchot.solve(M, unbalanced=1.0, unbalanced_type="cryptic divergence")
    with pytest.raises(NotImplementedError, match=r"unbalanced_type must be one of \['KL', 'TV'\]"):
        sketchot.solve(M, reg=1.0, unbalanced=1.0, unbalanced_type="cryptic divergence")


def _quadratic():
    return (lambda G: np.sum(G**2), lambda G: 2 * G)


#: What the Sinkhorn solver refuses that POT solves with another algorithm (POT's solver).
REFUSED_WITH_REG = {
    "L2": "reg_type must be 'KL' or 'entropy'; got 'L2'",
    "tuple": "POT's general regulariser",
    ("L2", "unbalanced_type"): "unbalanced_type must be one of .* quadratic penalty",
}


def _refusal(reg_type, unbalanced, unbalanced_type):
    """The message sketchot refuses a ``test_solve_grid`` case with (``None``: solved)."""
    if reg_type in ("L2", "tuple"):
        return REFUSED_WITH_REG[reg_type]
    if unbalanced is None:
        return None
    if unbalanced_type == "L2":
        return REFUSED_WITH_REG[(unbalanced_type, "unbalanced_type")]
    return None


@pytest.mark.parametrize(
    ("reg", "reg_type", "unbalanced", "unbalanced_type"),
    itertools.product([None, 1], ["KL", "entropy", "L2", "tuple"], [None, 0.9],
                      ["KL", "L2", "TV"]),
)  # fmt: skip
def test_solve_grid(reg, reg_type, unbalanced, unbalanced_type):
    """POT test_solvers.py::test_solve_grid: uniform weights by default give the answer of
    the given uniform weights (POT skips what it does not implement). Added: the answer is
    ``ot.solve``'s (``reg=None``: POT's own, the same numbers); what the Sinkhorn solver does
    not solve is refused by name with ``NotImplementedError``."""
    a, b, M = pot_case()
    kwargs = dict(
        reg=reg, reg_type=_quadratic() if reg_type == "tuple" else reg_type,
        unbalanced=unbalanced, unbalanced_type=unbalanced_type,
    )  # fmt: skip
    refused = _refusal(reg_type, unbalanced, unbalanced_type) if reg is not None else None
    if refused is not None:
        with pytest.raises(NotImplementedError, match=refused):
            sketchot.solve(M, a, b, **kwargs)
        return
    try:
        ref = ot.solve(M, a, b, **kwargs, tol=POT_TOL if reg else None)
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            sketchot.solve(M, a, b, **kwargs)
        return
    sol0 = sketchot.solve(M, **kwargs, tol=POT_TOL if reg else None)
    sol = sketchot.solve(M, a, b, **kwargs, tol=POT_TOL if reg else None)
    assert_allclose_sol(sol0, sol)
    if reg is None:
        assert sol.notes == ["reg=None: exact transport solved by POT (ot.solve)"]
        assert isinstance(sol, ot.utils.OTResult)
    elif unbalanced is not None and (unbalanced_type == "TV" or reg_type == "entropy"):
        # POT's L-BFGS-B (TV, and entropy with unbalanced) stops short (tests/solver/
        # test_penalties.py, tests/test_solve_matrix_reference.py): our objective is at
        # most POT's, both in POT's formula
        kind = reg_type.lower()
        value = pot_unbalanced_value(sol.plan, M, a, b, reg, unbalanced, unbalanced_type, kind)
        assert np.allclose(sol.value, value)
        theirs = pot_unbalanced_value(ref.plan, M, a, b, reg, unbalanced, unbalanced_type, kind)
        assert value <= theirs + 1e-12
        return
    elif unbalanced is not None:  # POT 0.9.7's value drops the KL's mass terms
        np.testing.assert_allclose(sol.plan, ref.plan, atol=1e-5)
        assert np.allclose(sol.value, pot_unbalanced_value(sol.plan, M, a, b, reg, unbalanced))
        assert np.allclose(sol.value_linear, ref.value_linear)
        return
    assert_allclose_sol(sol, ref)


# ------------------------------------------------------------- against ot.solve on M


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("reg", [1.0, 0.1, 0.02])
@pytest.mark.parametrize("reg_type", ["KL", "entropy", "kl"])
def test_balanced_answers_are_pots(seed, reg, reg_type):
    """Balanced ``ot.solve(M, a, b, reg=...)`` on ``ot.dist`` of random points (not square,
    unequal weights): ``value``, ``value_linear``, ``plan`` and marginals to
    ``np.allclose``'s tolerances at POT's stopThr, the potentials to POT's (log_u, log_v) up
    to the constant balanced transport leaves free."""
    a, b, M = random_case(seed)
    mine = sketchot.solve(M, a, b, reg=reg, reg_type=reg_type, tol=POT_TOL)
    ref = ot.solve(M, a, b, reg=reg, reg_type=reg_type, tol=POT_TOL, max_iter=100_000)
    assert mine.converged and mine.accuracy_met
    assert_allclose_sol(mine, ref)
    shift = np.mean(ref.potentials[0] - mine.potentials[0])
    np.testing.assert_allclose(mine.potentials[0] + shift, ref.potentials[0], atol=1e-6)
    np.testing.assert_allclose(mine.potentials[1] - shift, ref.potentials[1], atol=1e-6)


def test_entropy_is_kl_shifted_by_a_constant():
    """POT's ``reg_type='entropy'`` (``reg sum P log P``) is ``'KL'`` plus ``reg (<a, log a> +
    <b, log b>)`` on the balanced constraint set: the same plan, values that differ by it."""
    a, b, M = random_case(2)
    kl = sketchot.solve(M, a, b, reg=0.1)
    entropy = sketchot.solve(M, a, b, reg=0.1, reg_type="entropy")
    np.testing.assert_array_equal(kl.plan, entropy.plan)
    row, col = entropy.marginals
    assert entropy.value - kl.value == pytest.approx(
        0.1 * (row @ np.log(a) + col @ np.log(b)), abs=1e-12
    )
    # the constant, to the marginals' L1 errors times the largest |log weight|
    shift = 0.1 * (a @ np.log(a) + b @ np.log(b))
    slack = 0.1 * sum(entropy.marginal_errors) * max(-np.log(a).min(), -np.log(b).min())
    assert abs(entropy.value - kl.value - shift) <= slack
    P = entropy.plan
    assert entropy.value == pytest.approx(np.sum(P * M) + 0.1 * np.sum(P * np.log(P)), abs=1e-12)


@pytest.mark.parametrize("unbalanced", [1.0, 0.1, (1.0, 2.0), (math.inf, 0.5), [0.7]])
def test_unbalanced_answers_are_pots(unbalanced):
    """Unbalanced KL (``ot.solve(M, a, b, reg, unbalanced=...)``, POT's
    ``sinkhorn_knopp_unbalanced``): POT's plan to 1e-5 (POT's tolerance between its
    methods) and ``value_linear`` to ``np.allclose``'s; ``value`` is POT's formula with the
    generalised KL (``kl_div(..., mass=True)``) to 1e-12. POT's stopping rule (relative
    change of the scalings) differs, so both run to 1e-12."""
    a, b, M = random_case(3)
    b = 1.5 * b  # unequal masses
    pot_unbalanced = list(unbalanced) if isinstance(unbalanced, tuple) else unbalanced
    mine = sketchot.solve(M, a, b, reg=0.1, unbalanced=unbalanced, tol=1e-12)
    ref = ot.solve(M, a, b, reg=0.1, unbalanced=pot_unbalanced, tol=1e-12, max_iter=100_000)
    assert mine.converged
    np.testing.assert_allclose(mine.plan, ref.plan, atol=1e-5)
    assert np.allclose(mine.value_linear, ref.value_linear)
    sides = tuple(unbalanced) if isinstance(unbalanced, tuple) else unbalanced
    sides = sides[0] if isinstance(sides, list) else sides
    expected = pot_unbalanced_value(mine.plan, M, a, b, 0.1, sides)
    assert mine.value == pytest.approx(expected, abs=1e-12)
    np.testing.assert_allclose(mine.marginals[0], ref.plan.sum(1), atol=1e-5)


def test_unequal_masses_balanced_value_is_pots():
    """Balanced weights of mass 2 (POT's value has no mass term: ``<P, M> + reg sum P log(P /
    (a b^T))``)."""
    a, b, M = random_case(4)
    mine = sketchot.solve(M, 2 * a, 2 * b, reg=0.1, tol=POT_TOL)
    ref = ot.solve(M, 2 * a, 2 * b, reg=0.1, tol=POT_TOL, max_iter=100_000)
    assert_allclose_sol(mine, ref)


def test_exact_transport_is_pots():
    """``reg=None``: POT's ``ot.solve`` itself (network simplex; exact unbalanced by POT's
    majorisation-minimisation), every POT argument passed through, with a note."""
    a, b, M = random_case(5)
    for kwargs in ({}, {"unbalanced": 1.0}, {"unbalanced": 1.0, "unbalanced_type": "L2"}):
        mine, ref = sketchot.solve(M, a, b, **kwargs), ot.solve(M, a, b, **kwargs)
        assert isinstance(mine, ot.utils.OTResult)
        assert mine.notes == ["reg=None: exact transport solved by POT (ot.solve)"]
        np.testing.assert_array_equal(mine.plan, ref.plan)
        assert mine.value == ref.value
    with pytest.raises(TypeError, match="takes none of sketchot's accuracy"):
        sketchot.solve(M, a, b, accuracy=1e-4)


# -------------------------------------------------------------- small reg, certified


def test_pots_1d_histograms_at_reg_1e_2_are_certified():
    """``ot.utils.dist0(100)`` and POT's Gaussian histograms (test_bregman.py's pair) at
    ``reg = 1e-2`` (largest cost over reg 9.8e5): certified by the exhaustive check after the
    Newton stage; the value inside the bracket of ``tests/solver/test_grids.py`` (the exact
    optimum minus the certified error times the largest cost, plus the entropic gap
    ``reg log(n m)``)."""
    a = ot.datasets.make_1D_gauss(100, m=30, s=10)
    b = ot.datasets.make_1D_gauss(100, m=40, s=10)
    M = ot.utils.dist0(100)
    result = sketchot.solve(M, a, b, reg=1e-2)
    assert result.converged and result.accuracy_met and result.true_kernel.exhaustive
    assert result.true_kernel.bound <= ACCURACY
    assert result.iteration_info["strategy"] == "newton"
    optimum, missed = ot.emd2(a, b, M), result.true_kernel.bound * M.max()
    assert optimum - missed <= result.value_linear <= optimum + 1e-2 * math.log(1e4) + missed


# ----------------------------------------------------------- options and conventions


def test_max_iter_tol_and_verbose_are_the_solvers_options(capsys):
    a, b, M = random_case(6)
    with pytest.warns(sketchot.InvalidResultWarning, match="did not converge in 7"):
        result = sketchot.solve(M, a, b, reg=0.05, max_iter=7, tol=1e-12, verbose=True,
                                errors="warn", warn=False)  # fmt: skip
    assert result.options["max_iter"] == 7 and result.options["tol"] == 1e-12
    assert result.n_iter <= 7 and result.status == "max_iter reached"
    assert capsys.readouterr().out  # verbose printed the checks
    default = sketchot.solve(M, a, b, reg=0.05)
    assert default.options["max_iter"] == 1000 and default.options["tol"] is None


def test_a_warm_start_from_potentials():
    a, b, M = random_case(7)
    cold = sketchot.solve(M, a, b, reg=0.05, tol=1e-10)
    warm = sketchot.solve(M, a, b, reg=0.05, tol=1e-10, potentials_init=cold.potentials)
    assert warm.n_iter < cold.n_iter
    assert warm.value == pytest.approx(cold.value, abs=1e-10)


def test_float32_in_float32_out():
    a, b, M = random_case(8)
    single = sketchot.solve(M.astype(np.float32), a, b, reg=0.1)
    double = sketchot.solve(M.astype(np.float32).astype(np.float64), a, b, reg=0.1)
    assert isinstance(single.value, np.float32) and isinstance(single.value_linear, np.float32)
    assert single.plan.dtype == np.float32 and single.potentials[0].dtype == np.float32
    assert single.marginals[1].dtype == np.float32
    assert single.value == np.float32(double.value)  # solved in float64, then rounded


def test_read_only_strided_repeated_and_threaded_calls_give_the_same_bits():
    """A read-only ``M`` is read, never written; a strided view solves as its copy; the same
    call twice, and with two threads, gives the same bits."""
    a, b, M = random_case(9, m=60)
    view = M[:, ::2]
    b = b[::2] / b[::2].sum()
    frozen = np.ascontiguousarray(view)
    frozen.setflags(write=False)
    results = [
        sketchot.solve(frozen, a, b, reg=0.05),
        sketchot.solve(frozen, a, b, reg=0.05),
        sketchot.solve(view, a, b, reg=0.05),
        sketchot.solve(frozen, a, b, reg=0.05, n_threads=2),
    ]
    for other in results[1:]:
        np.testing.assert_array_equal(results[0].plan, other.plan)
        for left, right in zip(results[0].potentials, other.potentials, strict=True):
            np.testing.assert_array_equal(left, right)
        assert results[0].value == other.value
    np.testing.assert_array_equal(frozen, M[:, ::2])


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(reg=0), ValueError, "reg must be > 0 .* or None for exact transport"),
        (dict(reg=-1.0), ValueError, "reg"),
        (dict(reg=0.1, c=np.full((4, 3), 2.0), reg_type="entropy"), ValueError,
         "c must be None \\(or ones\\) with reg_type=.entropy."),
        (dict(reg=0.1, c=np.ones((3, 3))), ValueError, r"c must have the shape of M \(4, 3\)"),
        (dict(reg=0.1, c=-np.ones((4, 3))), ValueError, "c must be non-negative"),
        (dict(reg=0.1, reg_type="L2"), NotImplementedError, "got 'L2' \\(POT's quadratic"),
        (dict(reg=0.1, unbalanced=1.0, unbalanced_type="L2"), NotImplementedError,
         "quadratic penalty has no closed-form Sinkhorn step"),
        (dict(reg=0.1, method="sinkhorn_log"), ValueError, "method must be None with reg"),
        (dict(reg=0.1, plan_init=np.ones((4, 3))), ValueError, "plan_init must be None"),
        (dict(reg=0.1, grad="reverse"), ValueError, "grad must be one of 'autodiff'"),
        (dict(reg=0.1, potentials_init=np.zeros(4)), TypeError, "potentials_init must be"),
        (dict(reg=0.1, potentials_init=(np.zeros(3), np.zeros(3))), ValueError,
         "potentials_init"),
        (dict(reg=0.1, n_threads=0), ValueError, "n_threads"),
        (dict(reg=0.1, max_iters=10), TypeError, "'max_iters' \\(did you mean 'max_iter'"),
        (dict(reg=0.1, acuracy=1e-4), TypeError, "did you mean 'accuracy'"),
        (dict(reg=0.1, unbalanced=-1.0), ValueError, "^unbalanced"),
        (dict(reg=0.1, a=np.ones(5) / 5), ValueError, "a must have one weight per row of M"),
        (dict(reg=0.1, b=np.ones(4) / 4), ValueError, "b must have one weight per column"),
    ],
)  # fmt: skip
def test_refusals_name_the_argument(kwargs, error, message):
    M = np.arange(12.0).reshape(4, 3)
    with pytest.raises(error, match=message):
        sketchot.solve(M, **kwargs)


@pytest.mark.parametrize(
    ("M", "message"),
    [
        (np.full((3, 3), np.nan), "M must contain real costs"),
        (np.full((3, 3), np.inf), "M must have at least one finite cost"),
        (np.ones(3), "M"),
    ],
)
def test_a_bad_cost_matrix_is_refused_by_name(M, message):
    with pytest.raises(ValueError, match=message):
        sketchot.solve(M, reg=0.1)


def test_tensors_are_refused_by_name():
    torch = pytest.importorskip("torch")
    M = torch.rand(4, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"sketchot\.solve takes NumPy arrays; got M from torch"):
        sketchot.solve(M, reg=0.1)
    with pytest.raises(TypeError, match="got a from torch"):
        sketchot.solve(np.ones((4, 3)), torch.ones(4) / 4, reg=0.1)
