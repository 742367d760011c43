"""POT's regularisers with a reference measure on a cost matrix (``sketchot/matrix.py``:
``sketchot.solve(M, a, b, reg=..., c=..., reg_type=...)``, ``sketchot.matrix.
sinkhorn_unbalanced(..., reg_type=..., c=...)``; ``sketchot/cost_matrix.py``:
``reference_costs``, ``CostMatrixGeometry.plan_inner``, ``lowest_cost``).

POT's ``ot.solve`` regularises by ``reg KL(P | c)`` (``c = a b^T`` by default;
``reg_type='entropy'``: ``c = 1``). For every plan, ``<P, M'> + reg KL(P | a b^T) = <P, M> +
reg KL(P | c) + reg (sum(a) sum(b) - sum(c))`` with ``M' = M + reg log(a b^T / c)``, so
sketchot solves the KL problem on ``M'`` (negative entries included: unbalanced transport is
not shift-invariant) and reports ``<P, M>`` and POT's value.

References, by the algorithm POT runs:

* balanced: POT's ``ot.solve`` (``sinkhorn_log``) ignores ``c`` (its value and plan are those
  of ``c = a b^T``); the problem its docstring states is POT's own Sinkhorn on ``M'``.
* unbalanced KL with ``reg_type='KL'``: ``ot.solve`` itself (``sinkhorn_knopp_unbalanced``
  honours ``c``); its value drops the KL's mass terms (``kl_div(..., mass=False)``), so it
  is compared in POT's formula with them.
* unbalanced with ``reg_type='entropy'``, and TV: ``ot.solve`` runs L-BFGS-B on the primal,
  which stops short (our objective is at most POT's, in POT's formula). The reference is
  POT's stabilised Sinkhorn with ``reg_type='entropy'`` (KL) or the dual, smooth and
  concave over a box, ``max_{|f|, |g| <= reg_m} <a, f> + <b, g> - reg <c, exp((f + g - M) /
  reg) - 1>``, solved by SciPy's L-BFGS-B and polished by exact alternate updates to its
  optimality conditions (checked, as in tests/solver/test_penalties.py).

Tolerances: the issue's 1e-6 (relative L1 of the plans, relative values) at ``tol=1e-12``;
ported POT tests keep POT's ``atol=1e-5`` (POT test/unbalanced/test_sinkhorn.py, MIT
licence: ``test_unbalanced_reference_measure``, ``test_unbalanced_convergence``) and
``np.allclose`` (test/test_solvers.py::test_solve_grid).
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import logsumexp

import sketchot
import sketchot.matrix
from sketchot.cost_matrix import CostMatrixGeometry, lowest_cost, reference_costs

INF = math.inf
AGREEMENT = 1e-6
TOL = 1e-12
REFERENCE_RESIDUAL = 1e-9


def pot_case():
    """POT test_solvers.py::test_solve_grid's inputs (10 and 7 Gaussian points)."""
    rng = np.random.RandomState(0)
    x, y = rng.randn(10, 2), rng.randn(7, 2)
    return ot.utils.unif(10), ot.utils.unif(7), ot.dist(x, y)


def random_case(seed: int, n: int = 40, m: int = 30):
    """Unequal weights and masses, a reference measure far from ``a b^T``."""
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(n, 2)), rng.normal(size=(m, 2)) + 0.5
    a, b = rng.random(n) + 0.1, rng.random(m) + 0.1
    c = rng.random((n, m)) * 2.0 / (n * m) + 1e-4
    return a / a.sum(), 1.3 * b / b.sum(), ot.dist(X, Y), c


def objective(P, M, a, b, reg, c, reg_type, unbalanced, unbalanced_type):
    """The objective POT's ``ot.solve`` states, in its formulas (``_lbfgs``: generalised KL,
    ``reg_entropy = sum P log P - sum P``; balanced: ``sinkhorn``'s ``kl_div`` without mass
    terms, ``sum P log P`` for entropy)."""
    nx = ot.backend.NumpyBackend()
    ref = a[:, None] * b[None, :] if c is None else c
    balanced = unbalanced is None
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(P > 0, np.log(np.where(P > 0, P, 1.0)), 0.0)
        if reg_type == "entropy":
            value = np.sum(P * M) + reg * (np.sum(P * logs) - (0.0 if balanced else P.sum()))
        else:
            kl = np.sum(np.where(P > 0, P * (logs - np.log(ref)), 0.0))
            value = np.sum(P * M) + reg * (kl if balanced else kl - P.sum() + ref.sum())
    if balanced:
        return float(value)
    sides = unbalanced if isinstance(unbalanced, tuple) else (unbalanced, unbalanced)
    for penalty, marginal, w in zip(sides, (P.sum(1), P.sum(0)), (a, b), strict=True):
        if math.isinf(penalty):
            continue
        if unbalanced_type == "TV":
            value += penalty * np.abs(marginal - w).sum()
        else:
            value += penalty * nx.kl_div(marginal, w, mass=True)
    return float(value)


def dual_reference(M, a, b, reg, c, reg_m):
    """The TV problem's maximiser (module notes): the plan ``c exp((f + g - M) / reg)``."""
    n, m = M.shape
    log_c = np.log(c)

    def negative_dual(z):
        f, g = z[:n], z[n:]
        E = c * np.exp((f[:, None] + g[None, :] - M) / reg)
        value = a @ f + b @ g - reg * (E.sum() - c.sum())
        return -value, -np.concatenate([a - E.sum(axis=1), b - E.sum(axis=0)])

    bounds = [(-reg_m[0], reg_m[0]) if math.isfinite(reg_m[0]) else (None, None)] * n
    bounds += [(-reg_m[1], reg_m[1]) if math.isfinite(reg_m[1]) else (None, None)] * m
    z = minimize(
        negative_dual, np.zeros(n + m), jac=True, method="L-BFGS-B", bounds=bounds,
        options={"maxiter": 100_000, "maxfun": 200_000, "ftol": 1e-16, "gtol": 1e-14},
    ).x  # fmt: skip
    f, g = z[:n], z[n:]

    def update(other, weights, log_ref, r):
        h = -reg * (logsumexp(log_ref + (other[None, :] - M_side) / reg, axis=1) - weights)
        return h if math.isinf(r) else np.clip(h, -r, r)

    for _ in range(500):
        M_side = M
        f_new = update(g, np.log(a), log_c, reg_m[0])
        M_side = M.T
        g_new = update(f_new, np.log(b), log_c.T, reg_m[1])
        residual = max(np.abs(f_new - f).max(), np.abs(g_new - g).max()) / reg
        f, g = f_new, g_new
        if residual < REFERENCE_RESIDUAL * 1e-2:
            break
    M_side = M
    residual = np.abs(update(g, np.log(a), log_c, reg_m[0]) - f).max() / reg
    assert residual <= REFERENCE_RESIDUAL, f"the reference did not converge: {residual:.2e}"
    return c * np.exp((f[:, None] + g[None, :] - M) / reg)


def reference_plan(M, a, b, reg, c, reg_type, unbalanced, unbalanced_type):
    """The reference plan of each case (module notes)."""
    effective = np.ones_like(M) if reg_type == "entropy" else c
    if unbalanced is None:
        ref = a[:, None] * b[None, :] if effective is None else effective
        transformed = M + reg * np.log(a[:, None] * b[None, :] / ref)
        return ot.solve(transformed, a, b, reg=reg, tol=1e-14, max_iter=100_000).plan
    sides = unbalanced if isinstance(unbalanced, tuple) else (unbalanced, unbalanced)
    if unbalanced_type == "TV":
        ref = a[:, None] * b[None, :] if effective is None else effective
        return dual_reference(M, a, b, reg, ref, sides)
    if reg_type == "entropy":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # POT: "c is overwritten by ones"
            return ot.sinkhorn_unbalanced(
                a, b, M, reg, list(sides), method="sinkhorn_stabilized", reg_type="entropy",
                stopThr=1e-15, numItermax=100_000,
            )  # fmt: skip
    return ot.solve(M, a, b, reg=reg, c=c, unbalanced=list(sides), tol=1e-15,
                    max_iter=100_000).plan  # fmt: skip


def relative_l1(x, y) -> float:
    return float(np.abs(x - y).sum() / np.abs(y).sum())


GRID = [
    (unbalanced, unbalanced_type, reg_type, with_c)
    for unbalanced, unbalanced_type, reg_type, with_c in itertools.product(
        [None, 0.9, (0.3, 2.0), (INF, 0.5)], ["KL", "TV"], ["kl", "entropy"], [False, True]
    )
    if not (unbalanced is None and unbalanced_type == "TV")
    and not (reg_type == "entropy" and with_c)
]


@pytest.mark.parametrize(("unbalanced", "unbalanced_type", "reg_type", "with_c"), GRID, ids=str)
@pytest.mark.parametrize("reg", [1.0, 0.1])
def test_the_grid_matches_the_reference_to_1e_6(reg, unbalanced, unbalanced_type, reg_type,
                                                with_c):  # fmt: skip
    """Balanced and unbalanced, KL and TV, ``c`` given or not, ``'kl'`` and ``'entropy'``:
    the plan and value of the reference (module notes) to 1e-6; the value is the objective
    at the returned plan; ``value_linear`` is ``<P, M>`` on the given ``M``."""
    a, b, M, c = random_case(3)
    if unbalanced is None:
        b = b * (a.sum() / b.sum())
    scale = float(M.mean())
    reg = reg * scale
    if unbalanced is not None:
        unbalanced = (
            tuple(u * scale for u in unbalanced) if isinstance(unbalanced, tuple)
            else unbalanced * scale
        )  # fmt: skip
    given_c = c if with_c else None
    result = sketchot.solve(
        M, a, b, reg=reg, c=given_c, reg_type=reg_type, unbalanced=unbalanced,
        unbalanced_type=unbalanced_type, tol=TOL, max_iter=200_000,
    )  # fmt: skip
    assert result.converged and result.accuracy_met
    plan = result.plan
    reference = reference_plan(M, a, b, reg, given_c, reg_type, unbalanced, unbalanced_type)
    assert relative_l1(plan, reference) <= AGREEMENT
    args = (M, a, b, reg, given_c, reg_type, unbalanced, unbalanced_type)
    assert result.value == pytest.approx(objective(reference, *args), rel=AGREEMENT)
    assert result.value == pytest.approx(objective(plan, *args), rel=1e-9)
    assert result.value_linear == pytest.approx(float(np.sum(plan * M)), rel=1e-9)
    lbfgs = unbalanced is not None and (unbalanced_type == "TV" or reg_type == "entropy")
    hard = isinstance(unbalanced, tuple) and INF in unbalanced
    if lbfgs and not hard:
        # POT's ot.solve runs L-BFGS-B here (a hard side reg_m = inf is not a constraint
        # there: its plan leaves the marginal): never better than ours in its own objective
        pot = ot.solve(M, a, b, reg=reg, c=given_c, reg_type=reg_type,
                       unbalanced=unbalanced, unbalanced_type=unbalanced_type)  # fmt: skip
        assert result.value <= objective(pot.plan, *args) + 1e-12


@pytest.mark.parametrize("unbalanced", [None, 0.9])
@pytest.mark.parametrize("unbalanced_type", ["KL", "TV"])
@pytest.mark.parametrize("reg_type", ["KL", "entropy"])
def test_pots_solve_grid_case_with_a_reference_measure(reg_type, unbalanced, unbalanced_type):
    """POT test_solvers.py::test_solve_grid's inputs (reg = 1, uniform weights) with a
    reference measure: uniform weights by default give the answer of the given uniform
    weights (``np.allclose``), and ``c = a b^T`` (KL) or ``c = 1`` (entropy), POT's
    defaults, give the answer of ``c=None``."""
    if unbalanced is None and unbalanced_type == "TV":
        pytest.skip("TV is read only with unbalanced")
    a, b, M = pot_case()
    c = a[:, None] * b[None, :] if reg_type == "KL" else np.ones_like(M)
    kwargs = dict(reg=1.0, reg_type=reg_type, unbalanced=unbalanced,
                  unbalanced_type=unbalanced_type, tol=TOL)  # fmt: skip
    sol0 = sketchot.solve(M, c=c, **kwargs)
    sol = sketchot.solve(M, a, b, c=c, **kwargs)
    default = sketchot.solve(M, a, b, **kwargs)
    for name in ("value", "value_linear", "plan", "marginal_a", "marginal_b"):
        assert np.allclose(getattr(sol0, name), getattr(sol, name)), name
        assert np.allclose(getattr(default, name), getattr(sol, name), rtol=1e-9), name


# ----------------------------------------------------------------- POT's tests, ported


@pytest.mark.parametrize("reg_type", ["kl", "entropy"])
def test_unbalanced_reference_measure(reg_type):
    """POT test/unbalanced/test_sinkhorn.py::test_unbalanced_reference_measure: ``c=None``
    and POT's default made explicit (``a b^T`` for 'kl', ones for 'entropy') give the same
    scalings, plan and loss (atol 1e-5); added: both are POT's."""
    n = 100
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2)
    a, b, M = ot.utils.unif(n), ot.utils.unif(n), ot.dist(x, x)
    epsilon, reg_m = 1.0, 1.0
    G0, log0 = sketchot.matrix.sinkhorn_unbalanced(
        a, b, M, reg=epsilon, reg_m=reg_m, reg_type=reg_type, c=None, log=True
    )
    c = a[:, None] * b[None, :] if reg_type == "kl" else np.ones(M.shape)
    G, log = sketchot.matrix.sinkhorn_unbalanced(
        a, b, M, reg=epsilon, reg_m=reg_m, reg_type=reg_type, c=c, log=True
    )
    np.testing.assert_allclose(log["logu"], log0["logu"], atol=1e-05)
    np.testing.assert_allclose(log["logv"], log0["logv"], atol=1e-05)
    np.testing.assert_allclose(G, G0, atol=1e-05)
    np.testing.assert_allclose(log["cost"], log0["cost"], atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # POT: "c is overwritten by ones"
        reference = ot.sinkhorn_unbalanced(a, b, M, epsilon, reg_m, reg_type=reg_type, c=c)
    np.testing.assert_allclose(G, reference, atol=1e-05)


@pytest.mark.parametrize("reg_type", ["kl", "entropy"])
def test_unbalanced_convergence(reg_type):
    """POT test/unbalanced/test_sinkhorn.py::test_unbalanced_convergence: the returned
    ``logu``, ``logv`` satisfy POT's fixed-point equations of each reg_type (atol 1e-5), and
    the loss is ``sum(G * M)`` (atol 1e-5)."""
    n = 100
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2)
    a, b = ot.utils.unif(n), ot.utils.unif(n) * 1.5
    M = ot.dist(x, x)
    epsilon, reg_m = 1.0, 1.0
    G, log = sketchot.matrix.sinkhorn_unbalanced(
        a, b, M, reg=epsilon, reg_m=reg_m, reg_type=reg_type, log=True
    )
    fi = reg_m / (reg_m + epsilon)
    logb, loga = np.log(b + 1e-16), np.log(a + 1e-16)
    if reg_type == "entropy":
        logKtu = logsumexp(log["logu"][None, :] - M.T / epsilon, axis=1)
        logKv = logsumexp(log["logv"][None, :] - M / epsilon, axis=1)
    else:
        log_ab = loga[:, None] + logb[None, :]
        logKtu = logsumexp(log["logu"][None, :] - M.T / epsilon + log_ab.T, axis=1)
        logKv = logsumexp(log["logv"][None, :] - M / epsilon + log_ab, axis=1)
    np.testing.assert_allclose(fi * (loga - logKv), log["logu"], atol=1e-05)
    np.testing.assert_allclose(fi * (logb - logKtu), log["logv"], atol=1e-05)
    np.testing.assert_allclose(np.sum(G * M), log["cost"], atol=1e-5)


# --------------------------------------------------------------------------- properties


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), log_scale=st.floats(-5.0, 5.0))
def test_a_constant_factor_on_c_keeps_the_balanced_plan(seed, log_scale):
    """Invariant (balanced): ``KL(P | lambda c) = KL(P | c) - log(lambda) sum P`` up to a
    constant, so the plan is the same and POT's value moves by ``-reg log(lambda) mass``."""
    a, b, M, c = random_case(seed % 1000, n=12, m=9)
    b = b * (a.sum() / b.sum())
    base = sketchot.solve(M, a, b, reg=0.1, c=c, tol=TOL)
    scaled = sketchot.solve(M, a, b, reg=0.1, c=c * math.exp(log_scale), tol=TOL)
    assert relative_l1(scaled.plan, base.plan) <= 1e-9
    assert scaled.value == pytest.approx(base.value - 0.1 * log_scale * a.sum(), abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    unbalanced=st.floats(0.05, 5.0),
    kind=st.sampled_from(["KL", "TV"]),
)
def test_the_value_is_the_objective_at_the_plan(seed, unbalanced, kind):
    """Invariant (unbalanced, any ``c``): ``value`` is POT's objective at the returned plan
    and ``value_linear`` is ``<P, M>``."""
    a, b, M, c = random_case(seed % 1000, n=12, m=9)
    result = sketchot.solve(M, a, b, reg=0.2, c=c, unbalanced=unbalanced, unbalanced_type=kind,
                            tol=TOL, max_iter=100_000)  # fmt: skip
    P = result.plan
    assert result.value == pytest.approx(
        objective(P, M, a, b, 0.2, c, "kl", unbalanced, kind), rel=1e-9, abs=1e-12
    )
    assert result.value_linear == pytest.approx(float(np.sum(P * M)), rel=1e-9, abs=1e-12)


# ----------------------------------------------------------------- hard cases and inputs


def test_negative_transformed_costs_are_solved_as_they_are():
    """``M'`` is negative here (entropy: ``reg log(a_i b_j) < 0``), and so is the given
    ``M - 0.3``: the unbalanced problem is solved on its costs, not shifted, and matches
    POT's stabilised iteration; ``value_linear`` is negative and returned."""
    a, b, M, c = random_case(5)
    result = sketchot.solve(M - 0.3, a, b, reg=0.1, c=c, unbalanced=0.5, tol=TOL)
    reference = ot.sinkhorn_unbalanced(a, b, M - 0.3, 0.1, 0.5, c=c, method="sinkhorn_stabilized",
                                       stopThr=1e-15, numItermax=100_000)  # fmt: skip
    assert relative_l1(result.plan, reference) <= AGREEMENT
    assert result.value_linear < 0
    assert result.value_linear == pytest.approx(float(np.sum(reference * (M - 0.3))), rel=1e-6)
    assert result.kernel.geometry.offset == 0.0 and lowest_cost(result.kernel.geometry) < 0


def test_zeros_of_c_are_pairs_the_plan_never_uses():
    a, b, M, c = random_case(6)
    c = c.copy()
    c[0, :5] = 0.0
    c[3, 3] = 0.0
    for unbalanced in (None, 0.5):
        bb = b * (a.sum() / b.sum()) if unbalanced is None else b
        result = sketchot.solve(M, a, bb, reg=0.1, c=c, unbalanced=unbalanced, tol=TOL)
        assert result.converged
        plan = result.plan
        assert np.all(plan[c == 0] == 0.0)
        if unbalanced is not None:
            with np.errstate(invalid="ignore", divide="ignore"):  # POT's value: 0 / 0
                reference = ot.solve(M, a, bb, reg=0.1, c=c, unbalanced=unbalanced, tol=1e-15,
                                     max_iter=100_000).plan  # fmt: skip
            assert relative_l1(plan, reference) <= AGREEMENT


def test_a_warm_start_from_a_reference_result():
    a, b, M, c = random_case(7)
    first = sketchot.solve(M, a, b, reg=0.1, c=c, unbalanced=0.5, tol=1e-10)
    again = sketchot.solve(M, a, b, reg=0.1, c=c, unbalanced=0.5, tol=1e-10,
                           potentials_init=first.potentials)  # fmt: skip
    assert again.n_iter <= 2
    np.testing.assert_allclose(again.plan, first.plan, atol=1e-12)


def test_read_only_strided_inputs_twice_give_the_same_bits():
    a, b, M, c = random_case(8, m=60)
    M_view, c_view = M[:, ::2], c[:, ::2]
    M_view.flags.writeable = False
    c_view.flags.writeable = False
    frozen_M, frozen_c = M_view.copy(), c_view.copy()
    b = b[::2] / b[::2].sum()
    results = [
        sketchot.solve(M_view, a, b, reg=0.1, c=c_view, unbalanced=0.5, unbalanced_type=kind)
        for kind in ("KL", "KL", "TV")
    ]
    copy = sketchot.solve(frozen_M, a, b, reg=0.1, c=frozen_c, unbalanced=0.5)
    np.testing.assert_array_equal(results[0].plan, results[1].plan)
    np.testing.assert_array_equal(results[0].plan, copy.plan)
    assert results[0].value == results[1].value == copy.value
    np.testing.assert_array_equal(M_view, frozen_M)
    np.testing.assert_array_equal(c_view, frozen_c)


def test_float32_costs_give_float32_answers():
    a, b, M, c = random_case(9)
    result = sketchot.solve(M.astype(np.float32), a, b, reg=0.1, c=c, unbalanced=0.5)
    assert result.plan.dtype == np.float32 and isinstance(result.value, np.float32)
    exact = sketchot.solve(M.astype(np.float32).astype(np.float64), a, b, reg=0.1, c=c,
                           unbalanced=0.5)  # fmt: skip
    assert float(result.value) == pytest.approx(exact.value, rel=1e-6)


def test_reference_costs_and_the_plan_inner_product():
    """The transform's identity on a random plan (module notes), and ``plan_inner`` against
    the dense plan."""
    a, b, M, c = random_case(10, n=8, m=6)
    reg = 0.3
    transformed = reference_costs(M, a, b, reg, np.log(c))
    P = np.random.default_rng(0).random(M.shape)
    kl = lambda P, q: float(np.sum(P * np.log(P / q)) - P.sum() + q.sum())  # noqa: E731
    left = np.sum(P * transformed) + reg * kl(P, a[:, None] * b[None, :])
    right = np.sum(P * M) + reg * kl(P, c) + reg * (a.sum() * b.sum() - c.sum())
    assert left == pytest.approx(right, rel=1e-12)
    g = CostMatrixGeometry(transformed, reg)
    log_u, log_v = np.log(a), np.log(b)
    dense = np.exp(log_u[:, None] + log_v[None, :] - transformed / reg)
    assert g.plan_inner(log_u, log_v, M) == pytest.approx(float(np.sum(dense * M)), rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(c=np.ones((3, 3))), ValueError, r"c must have the shape of M \(4, 3\)"),
        (dict(c=-np.ones((4, 3))), ValueError, "c must be non-negative"),
        (dict(c=np.full((4, 3), np.nan)), ValueError, "c must contain finite numbers"),
        (dict(c=np.full((4, 3), 2.0), reg_type="entropy"), ValueError,
         r"c must be None \(or ones\) with reg_type='entropy'"),
        (dict(c=np.full((4, 3), "x")), TypeError, "c must be an array of real numbers"),
        (dict(c=np.full((4, 3), 1e308), unbalanced=1.0), ValueError, "c is too large"),
        (dict(c=np.ones((4, 3)), b=np.ones((3, 2)) / 3), NotImplementedError,
         "several targets .* a reference measure c"),
        (dict(reg_type="entropy", unbalanced=1.0, b=np.ones((3, 2)) / 3), NotImplementedError,
         "several targets .* reg_type='entropy' and unbalanced"),
    ],
)  # fmt: skip
def test_refusals_name_the_argument(kwargs, error, message):
    M = np.arange(12.0).reshape(4, 3)
    with pytest.raises(error, match=message):
        sketchot.solve(M, reg=0.1, **kwargs)


def test_a_sparse_reference_measure_is_refused_with_the_dense_remedy():
    import scipy.sparse

    M = np.arange(12.0).reshape(4, 3)
    c = scipy.sparse.csr_matrix(np.ones((4, 3)))
    with pytest.raises(TypeError, match=r"c must be a dense array .* c\.toarray\(\)"):
        sketchot.solve(M, reg=0.1, c=c)
    assert sketchot.solve(M, reg=1.0, c=c.toarray()).converged
