"""sketchot.sinkhorn_divergence: value and gradients against a dense float64 reference and
finite differences, the identities of a divergence, warm starts and the errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.loss import DivergenceResult

# The exact backend run to this tol: the potentials are then accurate to about 1e-12 (cost
# units), far below every tolerance below.
TIGHT = {"backend": "exact", "tol": 1e-13, "max_iter": 100_000}


def clouds(seed: int, n: int = 30, m: int = 24, d: int = 2, mass_b: float = 1.0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    Y = 0.8 * rng.random((m, d)) + 0.3
    a = rng.random(n) + 0.2
    b = rng.random(m) + 0.2
    return X, Y, a / a.sum(), mass_b * b / b.sum()


@pytest.mark.parametrize(("reg_m", "mass_b"), [(None, 1.0), (0.7, 1.6)])
def test_value_matches_the_dense_reference(dense_divergence, reg_m, mass_b):
    X, Y, a, b = clouds(0, mass_b=mass_b)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, reg_m=reg_m, **TIGHT)
    # both converged to ~1e-13 on the potentials: values agree to rounding of O(1) sums
    assert res.value == pytest.approx(dense_divergence(X, Y, a, b, 0.1, reg_m), abs=1e-10)
    assert res.value > 0 and res.value_error < 1e-9 and res.accuracy < 1e-9


def test_value_is_the_three_solves_values():
    X, Y, a, b = clouds(1)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.2, **TIGHT)
    values = {k: r.value for k, r in res.results.items()}
    assert res.value == pytest.approx(
        values["ab"] - 0.5 * (values["aa"] + values["bb"]), rel=1e-14
    )  # the same numbers summed: rounding only
    alone = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.2, debias=False, **TIGHT)
    assert alone.value == pytest.approx(values["ab"], rel=1e-12)  # the same solve, run again
    assert set(alone.results) == {"ab"}


def _central(fun, x, direction, h=1e-5):
    return (fun(x + h * direction) - fun(x - h * direction)) / (2 * h)


@pytest.mark.parametrize(("reg_m", "mass_b"), [(None, 1.0), (0.7, 1.6)])
def test_position_gradients_match_finite_differences(dense_divergence, reg_m, mass_b):
    X, Y, a, b = clouds(2, mass_b=mass_b)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, reg_m=reg_m, **TIGHT)
    rng = np.random.default_rng(3)
    for _ in range(2):
        dX, dY = rng.standard_normal(X.shape), rng.standard_normal(Y.shape)
        fd_X = _central(lambda Z: dense_divergence(Z, Y, a, b, 0.1, reg_m), X, dX)
        fd_Y = _central(lambda Z: dense_divergence(X, Z, a, b, 0.1, reg_m), Y, dY)
        # central differences at h = 1e-5: truncation ~h^2 |S'''| ~ 1e-9, rounding ~1e-16/h
        assert np.sum(res.grad_X * dX) == pytest.approx(fd_X, abs=1e-7)
        assert np.sum(res.grad_Y * dY) == pytest.approx(fd_Y, abs=1e-7)


def test_balanced_weight_gradients_along_mass_preserving_changes(dense_divergence):
    X, Y, a, b = clouds(4)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, **TIGHT)
    rng = np.random.default_rng(5)
    da, db = rng.standard_normal(a.shape), rng.standard_normal(b.shape)
    da -= da.mean()
    db -= db.mean()
    fd = _central(lambda t: dense_divergence(X, Y, a + t * da, b + t * db, 0.1), 0.0, 1.0)
    # as above: central differences at h = 1e-5
    assert res.grad_a @ da + res.grad_b @ db == pytest.approx(fd, abs=1e-7)
    # a change of both masses alike (sum(a) = sum(b) kept): <a, grad_a> + <b, grad_b> = S
    fd = _central(lambda t: dense_divergence(X, Y, a * (1 + t), b * (1 + t), 0.1), 0.0, 1.0)
    assert res.grad_a @ a + res.grad_b @ b == pytest.approx(fd, abs=1e-7)
    # the shift convention: <a, grad_a> = <b, grad_b> (= S / 2 at convergence)
    assert res.grad_a @ a == pytest.approx(res.grad_b @ b, abs=1e-12)


def test_unbalanced_weight_gradients_in_every_direction(dense_divergence):
    X, Y, a, b = clouds(6, mass_b=1.6)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, reg_m=0.7, **TIGHT)
    rng = np.random.default_rng(7)
    da, db = rng.standard_normal(a.shape), rng.standard_normal(b.shape)
    fd = _central(lambda t: dense_divergence(X, Y, a + t * da, b + t * db, 0.1, 0.7), 0.0, 1.0)
    assert res.grad_a @ da + res.grad_b @ db == pytest.approx(fd, abs=1e-7)  # as above


@pytest.mark.parametrize("reg_m", [None, 0.7])
def test_without_debiasing_the_gradients_are_those_of_ot(dense_ot, reg_m):
    X, Y, a, b = clouds(15, mass_b=1.0 if reg_m is None else 1.6)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, reg_m=reg_m, debias=False, **TIGHT)
    assert res.value == pytest.approx(dense_ot(X, Y, a, b, 0.1, reg_m), abs=1e-10)  # as above
    rng = np.random.default_rng(16)
    dX, da, db = (rng.standard_normal(v.shape) for v in (X, a, b))
    if reg_m is None:  # balanced: changes that keep sum(a) = sum(b)
        da, db = da - da.mean(), db - db.mean()
    fd_X = _central(lambda Z: dense_ot(Z, Y, a, b, 0.1, reg_m), X, dX)
    fd_w = _central(lambda t: dense_ot(X, Y, a + t * da, b + t * db, 0.1, reg_m), 0.0, 1.0)
    # central differences at h = 1e-5, as above
    assert np.sum(res.grad_X * dX) == pytest.approx(fd_X, abs=1e-7)
    assert res.grad_a @ da + res.grad_b @ db == pytest.approx(fd_w, abs=1e-7)


@pytest.mark.parametrize("reg_m", [None, 0.7])
def test_zero_weights_get_the_continuous_extension(dense_divergence, reg_m):
    X, Y, a, b = clouds(8)
    a[3] = 0.0
    a /= a.sum()
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, reg_m=reg_m, **TIGHT)
    assert np.all(np.isfinite(res.grad_a)) and np.all(res.grad_X[3] == 0.0)
    # moving mass h onto the zero weight (from point 0; balanced keeps the mass): one-sided
    # differences at h = 1e-6, truncation ~h |S''| ~ 1e-6
    d = np.zeros_like(a)
    d[3] = 1.0
    if reg_m is None:
        d[0] = -1.0
    h = 1e-6
    base = dense_divergence(X, Y, a, b, 0.1, reg_m)
    fd = (dense_divergence(X, Y, a + h * d, b, 0.1, reg_m) - base) / h
    assert res.grad_a @ d == pytest.approx(fd, abs=1e-5)


def test_negative_values_are_clipped_within_their_error_and_warned_beyond():
    rng = np.random.default_rng(3)
    X = rng.random((60, 2))
    Y = X + 1e-3 * rng.standard_normal(X.shape)
    # S is 1.2e-7 here (tol=1e-12); tol=1e-3 leaves the solves at S = -8.0e-5 against an
    # estimated error of 8.7e-4
    loose = {"backend": "exact", "tol": 1e-3, "warn": False}
    res = sketchot.sinkhorn_divergence(X, Y, reg=0.1, accuracy=0.9, **loose)
    assert res.clipped and res.value == 0.0 and res.value_error > 8e-5
    assert any("clipped to 0" in note for note in res.notes)
    with pytest.warns(sketchot.AccuracyWarning, match="< 0 with no error estimate"):
        res = sketchot.sinkhorn_divergence(X, Y, reg=0.1, accuracy=None, **loose)
    assert not res.clipped and res.value < 0


@pytest.mark.parametrize("backend", ["exact", "nystrom", "auto"])
def test_identical_inputs_give_exactly_zero(backend):
    X, _, a, _ = clouds(9)
    res = sketchot.sinkhorn_divergence(X, X.copy(), a, a.copy(), reg=0.1, backend=backend)
    assert res.value == 0.0
    for grad in (res.grad_X, res.grad_Y, res.grad_a, res.grad_b):
        assert not grad.any()


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    reg=st.sampled_from([0.05, 0.3, 1.0]),
    reg_m=st.sampled_from([None, 0.5]),
)
def test_symmetric_and_non_negative(seed, reg, reg_m):
    X, Y, a, b = clouds(seed, n=12, m=9, mass_b=1.0 if reg_m is None else 0.7)
    forward = sketchot.sinkhorn_divergence(X, Y, a, b, reg=reg, reg_m=reg_m, **TIGHT)
    backward = sketchot.sinkhorn_divergence(Y, X, b, a, reg=reg, reg_m=reg_m, **TIGHT)
    # the same three problems, transposed: equal up to the solves' tol
    assert forward.value == pytest.approx(backward.value, abs=1e-10)
    assert forward.value >= 0.0
    np.testing.assert_allclose(forward.grad_X, backward.grad_Y, atol=1e-9)
    np.testing.assert_allclose(forward.grad_a, backward.grad_b, atol=1e-9)


def test_approximate_backend_within_its_accuracy():
    rng = np.random.default_rng(10)
    X, Y = rng.random((400, 3)), rng.random((300, 3)) + 0.2
    exact = sketchot.sinkhorn_divergence(X, Y, reg=0.5, **TIGHT)
    approx = sketchot.sinkhorn_divergence(
        X, Y, reg=0.5, backend="nystrom", rng=0, accuracy=1e-4, rank="auto"
    )
    assert approx.accuracy <= 1e-4 and approx.backend == "nystrom"
    # value_error is a first-order estimate: allow a factor 10 for the second-order rest
    # (measured: error 1.8e-6 against an estimate 7.3e-6)
    assert abs(approx.value - exact.value) <= 10 * approx.value_error + 1e-12
    rel = np.linalg.norm(approx.grad_X - exact.grad_X) / np.linalg.norm(exact.grad_X)
    # marginal errors below 1e-4 move the plan's rows by about that much (measured 2.6e-5)
    assert rel < 1e-3


def test_warm_start_reuses_backend_and_potentials():
    X, Y, a, b = clouds(11, n=60, m=50)
    loss = sketchot.SinkhornDivergence(reg=0.1, backend="exact", tol=1e-11)
    first = loss(X, Y, a, b)
    moved = X - 0.01 * first.grad_X / np.abs(first.grad_X).max()
    second = loss(moved, Y, a, b)
    assert second.warm == {"ab": True, "aa": True, "bb": True}
    cold = sketchot.sinkhorn_divergence(moved, Y, a, b, reg=0.1, backend="exact", tol=1e-11)
    assert second.value == pytest.approx(cold.value, abs=1e-9)  # both converged to tol 1e-11
    # 'bb' did not move: the warm start is its fixed point already
    assert second.results["bb"].n_iter <= cold.results["bb"].n_iter
    loss.reset()
    assert loss(moved, Y, a, b).warm == {"ab": False, "aa": False, "bb": False}


def test_a_flow_predicts_the_next_potentials_from_their_drift():
    """Along a gradient flow (each point 10% of the way to its barycentric target) the third
    call starts from ``f + (f - f_prev)`` (``drift``): fewer iterations than the plain warm
    start from the same previous result (here 6 and 3 against 8 and 5), the same answer as
    a tight solve within the result's own error estimate (value) and the stopping tol's
    effect on the gradient (measured 5e-5 relative; 1e-3 allowed)."""
    X, Y, a, b = clouds(21, n=80, m=70)
    options = {"reg": 0.05, "backend": "exact", "tol": 1e-5}
    loss = sketchot.SinkhornDivergence(**options)
    first = loss(X, Y, a, b)
    assert first.drift == {}  # solved cold: nothing to predict from
    X = X - 0.05 * first.grad_X / a[:, None]
    second = loss(X, Y, a, b)
    assert set(second.drift) == {"ab", "aa"}  # 'bb' kept: no drift
    drift_f, drift_g = second.drift["ab"]
    assert drift_f.shape == (80,) and drift_g.shape == (70,) and np.abs(drift_g).max() > 0
    X = X - 0.05 * second.grad_X / a[:, None]
    predicted = loss(X, Y, a, b)
    plain = sketchot.sinkhorn_divergence(
        X, Y, a, b, warm_start=dataclasses.replace(second, drift={}), **options
    )
    for name in ("ab", "aa"):
        assert predicted.results[name].n_iter < plain.results[name].n_iter
    tight = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.05, **TIGHT)
    assert abs(predicted.value - tight.value) <= predicted.value_error
    scale = np.abs(tight.grad_X).max()
    np.testing.assert_allclose(predicted.grad_X, tight.grad_X, atol=1e-3 * scale)


def test_a_warm_start_rebuilds_a_fitted_block_local_kernel(colours):
    """The block-local kernel's info.params also describe its fit (clusters, degree, entry
    bound): the warm start builds it again from the parameters its builder accepts."""
    X, Y = colours
    loss = sketchot.SinkhornDivergence(reg=0.01, backend="polyts_local")
    first = loss(X, Y)
    second = loss(X - 0.01 * first.grad_X / np.abs(first.grad_X).max(), Y)
    assert second.warm["ab"] and second.results["ab"].backend == "polyts_local"
    assert second.accuracy <= 1e-3


def test_a_warm_start_that_misses_the_accuracy_is_solved_cold():
    X, Y, a, b = clouds(12, n=60, m=50)
    first = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, backend="exact")
    again = sketchot.sinkhorn_divergence(
        X + 0.3, Y, a, b, reg=0.1, backend="exact", max_iter=1, warm_start=first, warn=False
    )
    # 'aa' (translated: the same potentials) and 'bb' (unchanged) start at their fixed point
    assert again.warm == {"ab": False, "aa": True, "bb": True}
    assert any(note.startswith("ab: warm start") for note in again.notes)


def test_a_warm_start_that_breaks_down_is_solved_cold(monkeypatch):
    """A warm iteration whose result is impossible (raised by the solver's refusal) is
    solved again cold, with a note, instead of raising. The warm solve is made to raise
    here: since the summary reads the plan in a form that stays finite for any scalings,
    no natural case is known (the one this test used, a warm start at reg 0.005, was a
    summary's NaN, fixed)."""
    X, Y, a, b = clouds(16, n=60, m=50)
    loss = sketchot.SinkhornDivergence(reg=0.05, backend="exact")
    first = loss(X, Y, a, b)
    real_solve = sketchot.loss.solve

    def impossible(problem, kernel, options, rng=None):
        if problem.log_u0 is not None:  # the warm solves only
            raise sketchot.InvalidResultError("impossible (test)")
        return real_solve(problem, kernel, options, rng=rng)

    monkeypatch.setattr(sketchot.loss, "solve", impossible)
    moved = X - 0.01 * first.grad_X / np.abs(first.grad_X).max()
    again = loss(moved, Y, a, b)
    assert again.warm == {"ab": False, "aa": False, "bb": True}  # 'bb' did not move
    assert "ab: warm start on 'exact' failed (InvalidResultError): solved cold" in again.notes
    cold = sketchot.sinkhorn_divergence(moved, Y, a, b, reg=0.05, backend="exact")
    assert again.value == cold.value


def test_gradients_from_the_summary_moments_equal_plan_products():
    """The position gradients read the solves' summary moments; through the lazy plans'
    products they are the same to rounding (1e-10 relative: sums in another order)."""
    X, Y, a, b = clouds(17, n=60, m=50)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.05, backend="exact")
    assert all(m is not None for r in res.results.values() for m in r.plan_moments)
    bare = {k: dataclasses.replace(r, plan_moments=(None, None)) for k, r in res.results.items()}
    for side in ("X", "Y"):
        grad = sketchot.loss._position_gradient(bare, X, Y, True, side)
        np.testing.assert_allclose(getattr(res, f"grad_{side}"), grad, rtol=1e-10, atol=1e-14)


def test_each_position_gradient_is_computed_when_first_read():
    """A flow that moves X reads grad_X only: the cross plan's column moments (P^T X) are
    never computed for a log-domain kernel (here the block-local one), and reading grad_Y
    later computes them and gives the same numbers as computing both at once."""
    X, Y, a, b = clouds(18, n=200, m=150, d=3)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.01, backend="polyts_local")
    assert "grad_X" not in res.timings and "grad_Y" not in res.timings
    assert res.grad_X.shape == X.shape
    assert res.results["ab"].plan_moments[1] is None and "grad_Y" not in res.timings
    bare = {k: dataclasses.replace(r, plan_moments=(None, None)) for k, r in res.results.items()}
    np.testing.assert_array_equal(
        res.grad_Y, sketchot.loss._position_gradient(bare, X, Y, True, "Y")
    )
    assert res.results["ab"].plan_moments[1] is not None and "grad_Y" in res.timings
    with pytest.raises(ValueError, match="side must be 0"):
        res.results["ab"].moment(2)


def test_errors_name_the_argument():
    X, Y, a, b = clouds(13)
    with pytest.raises(ValueError, match="reg_m must be None or one penalty"):
        sketchot.sinkhorn_divergence(X, Y, reg=0.1, reg_m=(1.0, 2.0))
    with pytest.raises(TypeError, match="warm_start must be a DivergenceResult"):
        sketchot.sinkhorn_divergence(X, Y, reg=0.1, warm_start=3)
    with pytest.raises(ValueError, match="reg"):
        sketchot.sinkhorn_divergence(X, Y, reg=-1.0)
    with pytest.raises(ValueError, match="Y"):
        sketchot.sinkhorn_divergence(X, Y[:, :1], reg=0.1)
    with pytest.raises(ValueError, match="same total mass"):
        sketchot.sinkhorn_divergence(X, Y, a, 2 * b, reg=0.1, backend="exact")


def test_result_repr_and_backend():
    X, Y, a, b = clouds(14)
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, backend="exact")
    assert isinstance(res, DivergenceResult) and res.backend == "exact" and res.converged
    assert "DivergenceResult(value=" in repr(res)
    assert set(res.timings) == {"solve", "gradient"}


def test_the_solves_go_to_the_full_stopping_fraction_unless_asked():
    """The gradients come from the potentials: the divergence's solves skip the first stop
    at half the accuracy (``certify_first=False``) unless the caller asks for it."""
    from sketchot.solver.options import CERTIFY_FRACTION, STOP_FRACTION

    rng = np.random.default_rng(8)
    X, Y = rng.random((150, 3)), rng.random((120, 3))
    default = sketchot.sinkhorn_divergence(X, Y, reg=0.05, backend="exact")
    first = sketchot.sinkhorn_divergence(X, Y, reg=0.05, backend="exact", certify_first=True)
    for name in ("ab", "aa", "bb"):
        assert default.results[name].tol == STOP_FRACTION * 1e-3
        assert first.results[name].tol == CERTIFY_FRACTION * 1e-3
        assert default.results[name].n_iter >= first.results[name].n_iter


# ----------------------------------------------------------------- issue 42: other costs
METRICS = [
    {"metric": "euclidean"},
    {"metric": "cityblock"},
    {"metric": "minkowski", "p": 3.0},
]


def _value(X, Y, a, b, **kwargs):
    return sketchot.sinkhorn_divergence(X, Y, a, b, **kwargs).value


@pytest.mark.parametrize("metric", METRICS, ids=lambda m: m["metric"])
@pytest.mark.parametrize(("reg_m", "debias"), [(None, True), (0.7, True), (None, False)])
def test_position_gradients_of_other_metrics_match_finite_differences(metric, reg_m, debias):
    """Issue 42: ``metric='euclidean'`` returned the squared-Euclidean gradient formula
    (0.7-1.08 relative error against finite differences). The envelope theorem on each plan,
    checked against central differences of the value returned."""
    X, Y, a, b = clouds(20, mass_b=1.0 if reg_m is None else 1.3)
    kwargs = {"reg": 0.2, "reg_m": reg_m, "debias": debias, **TIGHT, **metric}
    res = sketchot.sinkhorn_divergence(X, Y, a, b, **kwargs)
    rng = np.random.default_rng(21)
    dX, dY = rng.standard_normal(X.shape), rng.standard_normal(Y.shape)
    fd_X = _central(lambda Z: _value(Z, Y, a, b, **kwargs), X, dX)
    fd_Y = _central(lambda Z: _value(X, Z, a, b, **kwargs), Y, dY)
    # h = 1e-5 on costs with bounded second derivatives away from x = y (no pair coincides):
    # truncation ~1e-9, plus the solves' 1e-13 potentials over 2h
    assert np.sum(res.grad_X * dX) == pytest.approx(fd_X, rel=1e-6, abs=1e-7)
    assert np.sum(res.grad_Y * dY) == pytest.approx(fd_Y, rel=1e-6, abs=1e-7)


def test_weight_gradients_of_another_metric_with_a_zero_weight():
    """Zero weights' potentials extended with the metric's own cost (they used
    ``||x - y||^2``)."""
    X, Y, a, b = clouds(22)
    a[3] = 0.0
    a /= a.sum()
    kwargs = {"reg": 0.2, **TIGHT, "metric": "euclidean"}
    res = sketchot.sinkhorn_divergence(X, Y, a, b, **kwargs)
    d = np.zeros_like(a)
    d[3], d[0] = 1.0, -1.0
    h = 1e-6  # one-sided (a_3 >= 0): truncation ~h |S''| ~ 1e-6
    fd = (_value(X, Y, a + h * d, b, **kwargs) - _value(X, Y, a, b, **kwargs)) / h
    assert res.grad_a @ d == pytest.approx(fd, abs=1e-5)


def test_a_callable_metric_has_weight_gradients_and_refuses_position_gradients():
    X, Y, a, b = clouds(23)

    def metric(A, B):  # the Euclidean cost, as a user's callable
        return np.sqrt(((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))

    kwargs = {"reg": 0.2, **TIGHT, "metric": metric}
    res = sketchot.sinkhorn_divergence(X, Y, a, b, **kwargs)
    named = sketchot.sinkhorn_divergence(X, Y, a, b, **{**kwargs, "metric": "euclidean"})
    assert res.value == pytest.approx(named.value, rel=1e-10)  # the same cost
    for side in ("grad_X", "grad_Y"):
        with pytest.raises(ValueError, match="metric=<callable>"):
            getattr(res, side)
    rng = np.random.default_rng(24)
    da, db = rng.standard_normal(a.shape), rng.standard_normal(b.shape)
    da, db = da - da.mean(), db - db.mean()
    fd = _central(lambda t: _value(X, Y, a + t * da, b + t * db, **kwargs), 0.0, 1.0)
    assert res.grad_a @ da + res.grad_b @ db == pytest.approx(fd, abs=1e-7)  # h = 1e-5
    same = sketchot.sinkhorn_divergence(X, X, a, a, **kwargs)  # identical inputs: no solve
    with pytest.raises(ValueError, match="metric=<callable>"):
        _ = same.grad_X


def test_a_loss_object_keeps_its_metric_on_warm_starts():
    """The warm start rebuilt its kernel with the default cost: the second call of
    ``SinkhornDivergence(metric='euclidean')`` solved the squared-Euclidean problem."""
    X, Y, a, b = clouds(25)
    loss = sketchot.SinkhornDivergence(0.2, metric="euclidean", **TIGHT)
    loss(X, Y, a, b)
    moved = X + 0.05
    res = loss(moved, Y, a, b)
    assert res.warm["ab"]
    ref = sketchot.sinkhorn_divergence(moved, Y, a, b, reg=0.2, metric="euclidean", **TIGHT)
    assert res.value == pytest.approx(ref.value, rel=1e-9)  # both to tol 1e-13
    np.testing.assert_allclose(res.grad_X, ref.grad_X, rtol=1e-7, atol=1e-10)
    # a warm start from a solve of another cost is not used
    other = sketchot.sinkhorn_divergence(moved, Y, a, b, reg=0.2, warm_start=res, **TIGHT)
    assert not any(other.warm.values())


def test_an_approximate_backend_with_another_metric():
    """Nystrom (any metric): the position gradients from its plan's entries, within a few
    times the solve's true-kernel marginal error of the exact kernel's."""
    X, Y, a, b = clouds(26, n=120, m=100)
    kwargs = {"reg": 0.5, "metric": "euclidean"}
    approx = sketchot.sinkhorn_divergence(X, Y, a, b, backend="nystrom", rank=100, rng=0, **kwargs)
    exact = sketchot.sinkhorn_divergence(X, Y, a, b, **kwargs, **TIGHT)
    assert approx.backend == "nystrom" and approx.accuracy < 1e-3
    for side in ("grad_X", "grad_Y"):
        ours, ref = getattr(approx, side), getattr(exact, side)
        # measured 6.6e-4 (X) and 4.2e-4 (Y) at a marginal error of 4.3e-4
        assert np.abs(ours - ref).sum() / np.abs(ref).sum() < 10 * approx.accuracy


def test_an_unknown_option_is_named_in_the_losss_terms():
    """The solves' keyword checks speak of the entry the caller used, not of sinkhorn()."""
    X = np.random.default_rng(0).random((20, 2))
    with pytest.raises(TypeError, match=r"^sinkhorn_divergence\(\) got unexpected.*'tol'"):
        sketchot.sinkhorn_divergence(X, X + 1.0, reg=0.1, tol_x=1e-3)
    with pytest.raises(TypeError, match=r"^sinkhorn_divergence\(\) got unexpected"):
        sketchot.SinkhornDivergence(0.1, tol_x=1e-3)(X, X + 1.0)
