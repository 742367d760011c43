"""SketchUnbalancedSinkhornTransport against POT's UnbalancedSinkhornTransport, its log keys,
maps, approximate backends; the cost normalisations of both estimators against POT."""

from __future__ import annotations

import warnings

import numpy as np
import ot
import pytest

from sketchot import SketchSinkhornTransport, SketchUnbalancedSinkhornTransport

# POT's iteration converges to its fixed point at this tol (its criterion: the change of
# the scalings); sketchot's at its marginal residual. The plans then agree to ~1e-12 of
# their largest entry (measured 1e-14), the maps to rounding.
TOL = 1e-12


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(2)
    Xs = rng.uniform([0.5, 0.1, 0.0], [1.0, 0.6, 0.4], size=(70, 3))
    Xt = rng.uniform([0.0, 0.3, 0.4], [0.4, 0.8, 1.0], size=(55, 3))
    return Xs, Xt, rng.random((20, 3)), rng.random((15, 3))


def pot_unbalanced(Xs, Xt, **kwargs):
    return ot.da.UnbalancedSinkhornTransport(tol=TOL, max_iter=100_000, **kwargs).fit(Xs=Xs, Xt=Xt)


@pytest.mark.parametrize(("reg_e", "reg_m"), [(0.1, 0.1), (0.05, 1.0), (1.0, 10.0)])
def test_plan_and_log_match_pot(clouds, reg_e, reg_m):
    Xs, Xt, _, _ = clouds
    pot = pot_unbalanced(Xs, Xt, reg_e=reg_e, reg_m=reg_m, log=True)
    ours = SketchUnbalancedSinkhornTransport(
        reg_e=reg_e, reg_m=reg_m, log=True, backend="exact", tol=TOL, max_iter=100_000
    ).fit(Xs=Xs, Xt=Xt)
    scale = pot.coupling_.max()
    np.testing.assert_allclose(ours.coupling_, pot.coupling_, rtol=0, atol=1e-10 * scale)
    assert set(pot.log_) <= set(ours.log_)
    # POT's logu scales a b^T exp(-M / reg): the same plan, log u - log a (module docs)
    for key in ("logu", "logv"):
        np.testing.assert_allclose(ours.log_[key], pot.log_[key], rtol=0, atol=1e-8)
    np.testing.assert_allclose(ours.log_["cost"], pot.log_["cost"], rtol=1e-9)
    # total_cost sums terms of both signs (it is ~1e-16 at some optima): absolute, in units
    # of the linear cost
    np.testing.assert_allclose(
        ours.log_["total_cost"], pot.log_["total_cost"], rtol=0, atol=1e-9 * pot.log_["cost"]
    )
    # the mass is not the marginals' (the point of unbalanced transport)
    assert abs(ours.coupling_.sum() - 1.0) > 1e-3


def test_maps_match_pot(clouds):
    """POT's unbalanced estimator maps with ``'ferradans'`` (its only map): the plan's
    projection on the fitted samples, the nearest sample's move elsewhere."""
    Xs, Xt, new_source, new_target = clouds
    pot = pot_unbalanced(Xs, Xt, reg_e=0.1, reg_m=0.5)
    ours = SketchUnbalancedSinkhornTransport(
        reg_e=0.1, reg_m=0.5, backend="exact", tol=TOL, max_iter=100_000
    ).fit(Xs=Xs, Xt=Xt)
    assert ours.out_of_sample_map == "ferradans"  # POT's default
    for points in (Xs, new_source):
        np.testing.assert_allclose(ours.transform(Xs=points), pot.transform(Xs=points), atol=1e-9)
    for points in (Xt, new_target):
        np.testing.assert_allclose(
            ours.inverse_transform(Xt=points), pot.inverse_transform(Xt=points), atol=1e-9
        )
    ys = (Xs[:, 0] > 0.75).astype(int)
    np.testing.assert_allclose(ours.transform_labels(ys), pot.transform_labels(ys), atol=1e-10)


def test_continuous_map_is_the_plan_projection_on_fitted_samples(clouds):
    """sketchot also gives the unbalanced estimator the continuous entropic map: on the
    fitted samples it is ``(P Xt) / (P 1)`` (which does not depend on ``u``)."""
    Xs, Xt, new_source, _ = clouds
    est = SketchUnbalancedSinkhornTransport(
        reg_e=0.1, reg_m=0.5, backend="exact", out_of_sample_map="continuous"
    ).fit(Xs=Xs, Xt=Xt)
    plan = est.coupling_
    np.testing.assert_allclose(
        est.transform(Xs=Xs), plan @ Xt / plan.sum(axis=1, keepdims=True), rtol=1e-10
    )
    # off the samples: sum_j K(x, y_j) v_j y_j / sum_j K(x, y_j) v_j, evaluated densely here
    K = np.exp(-ot.dist(new_source, Xt) / 0.1 + est.log_["log_v"][None, :])
    np.testing.assert_allclose(
        est.transform(Xs=new_source), K @ Xt / K.sum(axis=1, keepdims=True), rtol=1e-10
    )


def test_approximate_backend_within_its_certified_error(clouds):
    """A Nystrom kernel's plan: its true-kernel check bounds the marginal error; the
    transported points stay within that share of the clouds' diameter of POT's."""
    Xs, Xt, _, _ = clouds
    pot = pot_unbalanced(Xs, Xt, reg_e=0.1, reg_m=1.0)
    ours = SketchUnbalancedSinkhornTransport(
        reg_e=0.1, reg_m=1.0, backend="nystrom", n_landmarks=100, rng=0, max_iter=1000
    ).fit(Xs=Xs, Xt=Xt)
    check = ours.result_.true_kernel
    assert check is not None and check.bound <= 1e-3  # the solver's default accuracy
    diameter = np.ptp(np.vstack([Xs, Xt]), axis=0).max()
    gap = np.abs(ours.transform(Xs=Xs) - pot.transform(Xs=Xs)).max()
    assert gap <= 10 * check.bound * diameter


def test_reg_m_pair_and_errors(clouds):
    Xs, Xt, _, _ = clouds
    pot = ot.da.UnbalancedSinkhornTransport(reg_e=0.2, reg_m=0.5, tol=TOL, max_iter=100_000)
    pair = SketchUnbalancedSinkhornTransport(
        reg_e=0.2, reg_m=(0.5, 0.5), backend="exact", tol=TOL, max_iter=100_000
    )
    np.testing.assert_allclose(
        pair.fit(Xs=Xs, Xt=Xt).coupling_, pot.fit(Xs=Xs, Xt=Xt).coupling_, atol=1e-14
    )
    with pytest.raises(ValueError, match=r"reg_m must be .*> 0"):
        SketchUnbalancedSinkhornTransport(reg_m=-1.0).fit(Xs=Xs, Xt=Xt)
    with pytest.raises(ValueError, match=r"reg_m must be a positive number .* got None"):
        SketchUnbalancedSinkhornTransport(reg_m=None).fit(Xs=Xs, Xt=Xt)
    with pytest.raises(ValueError, match=r"method must be one of 'sinkhorn', .*got 'sinkhorn_log'"):
        SketchUnbalancedSinkhornTransport(method="sinkhorn_log").fit(Xs=Xs, Xt=Xt)
    with pytest.raises(TypeError, match=r"reg_m=1.0 as a backend parameter.*SketchUnbalanced"):
        SketchSinkhornTransport(reg_m=1.0)


def test_default_max_iter_is_pots_and_converges(clouds):
    """POT's default max_iter=10: the KL penalties make the iteration contract fast; on
    these clouds at POT's defaults sketchot converges within it, without a warning."""
    Xs, Xt, _, _ = clouds
    est = SketchUnbalancedSinkhornTransport()
    assert est.max_iter == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.fit(Xs=Xs, Xt=Xt)
    assert est.result_.converged


@pytest.mark.parametrize("norm", ["max", "median", "log", "loglog"])
@pytest.mark.parametrize("unbalanced", [False, True])
def test_norms_match_pot(clouds, norm, unbalanced):
    """POT's ``norm`` (``ot.utils.cost_normalization``): ``'max'`` on the clouds (the kernel
    of reg_e times the largest cost), the others on the cost matrix."""
    Xs, Xt, new_source, _ = clouds
    if unbalanced:
        pot_cls, ours_cls, extra = (
            ot.da.UnbalancedSinkhornTransport, SketchUnbalancedSinkhornTransport,
            {"reg_m": 0.5},
        )  # fmt: skip
    else:
        pot_cls, ours_cls, extra = ot.da.SinkhornTransport, SketchSinkhornTransport, {}
    pot = pot_cls(reg_e=0.1, norm=norm, tol=TOL, max_iter=100_000, **extra).fit(Xs=Xs, Xt=Xt)
    ours = ours_cls(reg_e=0.1, norm=norm, tol=TOL, max_iter=100_000, backend="exact", **extra)
    ours.fit(Xs=Xs, Xt=Xt)
    scale = pot.coupling_.max()
    np.testing.assert_allclose(ours.coupling_, pot.coupling_, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(ours.cost_, pot.cost_, rtol=1e-12, atol=1e-13)
    if norm in ("max", "median"):
        np.testing.assert_allclose(ours.norm_cost_, pot.norm_cost_, rtol=1e-12)
    np.testing.assert_allclose(
        ours.transform(Xs=new_source), pot.transform(Xs=new_source), rtol=0, atol=1e-8
    )
    assert ours.fit_path_ == ("clouds" if norm == "max" else "matrix")  # no n x m for max
