"""The semi-supervised fit (``ys`` and ``yt``): POT's label cost, unlabelled samples (-1),
forbidden and penalised pairs, against POT's estimators on the same data."""

from __future__ import annotations

import numpy as np
import ot
import pytest

import sketchot.da
from sketchot import SketchSinkhornTransport, SketchUnbalancedSinkhornTransport

# Both sides stop at a marginal error (POT: its own criterion) far below what is compared:
# the plans then agree to ~1e-9 of their largest entry (measured at most 3e-10 of it, on
# two entries of one row with a finite limit_max), the maps to ~1e-8.
TOL = 1e-11


@pytest.fixture(scope="module")
def labelled():
    rng = np.random.default_rng(7)
    Xs = rng.normal(size=(60, 2))
    Xt = rng.normal(size=(45, 2)) + np.array([1.0, 0.5])
    ys = rng.integers(0, 3, size=60)
    yt = rng.integers(0, 3, size=45)
    # unlabelled samples on both sides connect the label blocks (unique potentials)
    ys[::7] = -1
    yt[::5] = -1
    return Xs, ys, Xt, yt


def pot_pair(cls_pot, cls_ours, data, **kwargs):
    Xs, ys, Xt, yt = data
    with np.errstate(over="ignore"):  # POT divides its stand-in cost 1.8e308 by reg
        pot = cls_pot(tol=TOL, max_iter=100_000, **kwargs).fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    ours = cls_ours(tol=TOL, max_iter=100_000, **kwargs).fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    return pot, ours


def allowed_mask(ys, yt):
    return (ys[:, None] == -1) | (yt[None, :] == -1) | (ys[:, None] == yt[None, :])


def test_forbidden_pairs_match_pot_and_carry_no_mass(labelled):
    """``limit_max=inf`` (POT's default): the plan is POT's, with exact zeros on the pairs
    of two labelled samples of different labels; unlabelled samples pair with everything."""
    _, ys, _, yt = labelled
    pot, ours = pot_pair(ot.da.SinkhornTransport, SketchSinkhornTransport, labelled, reg_e=0.5)
    plan = ours.coupling_
    allowed = allowed_mask(ys, yt)
    assert np.all(plan[~allowed] == 0.0)
    assert np.all(plan[allowed] > 0)  # -1 rows and columns pair with every sample
    np.testing.assert_allclose(plan, pot.coupling_, rtol=0, atol=1e-9 * plan.max())
    assert np.all(np.isinf(ours.cost_[~allowed])) and np.all(np.isfinite(ours.cost_[allowed]))
    # the same costs up to rounding (sketchot expands ||x - y||^2 on centred points)
    np.testing.assert_allclose(ours.cost_[allowed], pot.cost_[allowed], rtol=1e-12, atol=1e-13)
    # the certified exact solve: the true-kernel check is the plan's own marginals
    assert ours.result_.converged and ours.result_.backend == "exact"
    np.testing.assert_allclose(plan.sum(axis=1), ours.mu_s, rtol=0, atol=1e-9)


def test_label_aware_maps_match_pot(labelled):
    """The maps: on the fitted samples the label-aware plan's projection (POT's
    ``'ferradans'`` map there); new points through POT's continuous map (no labels)."""
    Xs, _, Xt, _ = labelled
    new = np.random.default_rng(1).normal(size=(13, 2))
    pot, ours = pot_pair(
        ot.da.SinkhornTransport, SketchSinkhornTransport, labelled, reg_e=0.5,
        out_of_sample_map="ferradans",
    )  # fmt: skip
    np.testing.assert_allclose(ours.transform(Xs=Xs), pot.transform(Xs=Xs), atol=1e-8)
    np.testing.assert_allclose(
        ours.inverse_transform(Xt=Xt), pot.inverse_transform(Xt=Xt), atol=1e-8
    )
    np.testing.assert_allclose(ours.transform(Xs=new), pot.transform(Xs=new), atol=1e-8)
    pot_c, ours_c = pot_pair(ot.da.SinkhornTransport, SketchSinkhornTransport, labelled, reg_e=0.5)
    # POT's continuous map ignores the labels on new points, as sketchot's does; the
    # potentials are unique here (unlabelled samples connect the label blocks)
    np.testing.assert_allclose(ours_c.transform(Xs=new), pot_c.transform(Xs=new), atol=1e-8)
    np.testing.assert_allclose(
        ours_c.inverse_transform(Xt=new), pot_c.inverse_transform(Xt=new), atol=1e-8
    )
    ys, yt = labelled[1], labelled[3]
    np.testing.assert_allclose(ours.transform_labels(ys), pot.transform_labels(ys), atol=1e-9)
    np.testing.assert_allclose(
        ours.inverse_transform_labels(yt), pot.inverse_transform_labels(yt), atol=1e-9
    )


@pytest.mark.parametrize("limit_max", [0.5, 2.0])
def test_finite_limit_max_matches_pot(labelled, limit_max):
    """A finite ``limit_max`` is a cost of ``limit_max`` times the largest cost (POT's
    units), raised onto pairs of different labels (``max(C, limit)``: below 1 some of
    them keep their own cost)."""
    pot, ours = pot_pair(
        ot.da.SinkhornTransport, SketchSinkhornTransport, labelled, reg_e=0.5,
        limit_max=limit_max,
    )  # fmt: skip
    np.testing.assert_allclose(ours.cost_, pot.cost_, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(
        ours.coupling_, pot.coupling_, rtol=0, atol=1e-9 * pot.coupling_.max()
    )
    assert ours.limit_max == limit_max  # POT's fit changes it; ours does not


def test_unbalanced_semi_supervised_matches_pot(labelled):
    """``UnbalancedSinkhornTransport``'s default ``limit_max=10``, and ``inf``."""
    for limit_max in (10, np.inf):
        pot, ours = pot_pair(
            ot.da.UnbalancedSinkhornTransport, SketchUnbalancedSinkhornTransport, labelled,
            reg_e=0.5, reg_m=1.0, limit_max=limit_max,
        )  # fmt: skip
        np.testing.assert_allclose(
            ours.coupling_, pot.coupling_, rtol=0, atol=1e-9 * pot.coupling_.max()
        )


def test_one_side_of_labels_is_the_unsupervised_fit(labelled):
    """POT uses labels only when both sides have them."""
    Xs, ys, Xt, _ = labelled
    plain = SketchSinkhornTransport(reg_e=0.5, backend="exact").fit(Xs=Xs, Xt=Xt)
    one = SketchSinkhornTransport(reg_e=0.5, backend="exact").fit(Xs=Xs, ys=ys, Xt=Xt)
    np.testing.assert_array_equal(one.coupling_, plain.coupling_)


def test_all_unlabelled_is_the_unsupervised_plan(labelled):
    """Labels all -1 forbid nothing: the plan of the unsupervised fit (both exact)."""
    Xs, _, Xt, _ = labelled
    plain = SketchSinkhornTransport(reg_e=0.5, backend="exact", tol=TOL).fit(Xs=Xs, Xt=Xt)
    none = SketchSinkhornTransport(reg_e=0.5, tol=TOL).fit(
        Xs=Xs, ys=-np.ones(60), Xt=Xt, yt=-np.ones(45)
    )
    np.testing.assert_allclose(none.coupling_, plain.coupling_, rtol=1e-9, atol=1e-15)


def test_labels_refused_by_name(labelled, monkeypatch):
    Xs, ys, Xt, yt = labelled
    with pytest.raises(
        ValueError, match=r"yt must be a 1-D array with one label per sample \(45\)"
    ):
        SketchSinkhornTransport().fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt[:-1])
    with pytest.raises(TypeError, match=r"ys must be an array of numeric labels"):
        SketchSinkhornTransport().fit(Xs=Xs, ys=ys.astype(str), Xt=Xt, yt=yt)
    with pytest.raises(ValueError, match=r"ys must contain finite labels"):
        SketchSinkhornTransport().fit(Xs=Xs, ys=np.full(60, np.nan), Xt=Xt, yt=yt)
    with pytest.raises(ValueError, match=r"limit_max=2 \(finite\) with backend='nystrom'"):
        SketchSinkhornTransport(backend="nystrom", limit_max=2.0).fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    with pytest.raises(ValueError, match=r"same cloud with different labels"):
        SketchSinkhornTransport(backend="nystrom").fit(Xs=Xs, ys=ys, Xt=Xs, yt=ys[::-1])
    # the n x m cost is estimated before it is built, and refused above the budget
    monkeypatch.setattr(sketchot.da, "DEFAULT_MAX_DENSE_BYTES", 60 * 45 * 8)
    with pytest.raises(
        MemoryError, match=r"semi-supervised fit \(ys and yt\) needs the 60 x 45.*limit_max=inf"
    ):
        SketchSinkhornTransport().fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    with pytest.raises(MemoryError, match=r"norm='median' needs the 60 x 45 cost matrix"):
        SketchSinkhornTransport(norm="median").fit(Xs=Xs, Xt=Xt)
    fitted = SketchSinkhornTransport(backend="exact").fit(Xs=Xs, Xt=Xt)
    monkeypatch.setattr(sketchot.da, "DEFAULT_MAX_DENSE_BYTES", 100)
    with pytest.raises(MemoryError, match=r"cost_ would build the 60 x 45 cost matrix"):
        fitted.cost_  # noqa: B018


def spread_clouds(n: int, m: int, seed: int = 7):
    """Labelled clouds on which the low-rank backends certify at reg_e=2 (measured:
    Nystrom with 150 landmarks and PolyTS at 1e-4 against the true masked kernel)."""
    rng = np.random.default_rng(seed)
    Xs = rng.normal(size=(n, 2))
    Xt = rng.normal(size=(m, 2)) + np.array([1.0, 0.5])
    ys = rng.integers(0, 3, size=n)
    yt = rng.integers(0, 3, size=m)
    ys[::7] = -1
    yt[::5] = -1
    return Xs, ys, Xt, yt


@pytest.mark.parametrize(("backend", "params"), [("nystrom", {"n_landmarks": 150}), ("polyts", {})])
def test_label_masked_kernel_of_an_approximate_backend(backend, params):
    """Forbidden pairs on a low-rank backend: the plan's forbidden entries are exactly 0,
    the solve is certified against the TRUE masked kernel (the sampled check evaluates it
    per label), and the plan, maps and labels are POT's within that certified error."""
    Xs, ys, Xt, yt = spread_clouds(300, 250)
    new = np.random.default_rng(2).normal(size=(20, 2))
    with np.errstate(over="ignore"):  # POT divides its stand-in cost 1.8e308 by reg
        pot = ot.da.SinkhornTransport(reg_e=2.0, tol=TOL, max_iter=100_000)
        pot.fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    ours = SketchSinkhornTransport(reg_e=2.0, backend=backend, rng=0, **params)
    ours.fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    assert ours.fit_path_ == "labelled" and ours.result_.converged
    check = ours.result_.true_kernel
    assert check is not None and check.bound <= 1e-3  # the default accuracy, certified
    plan = ours.coupling_
    assert np.all(plan[~allowed_mask(ys, yt)] == 0.0)
    # the certified marginal error bounds how far the plan and its maps are from POT's
    # (measured: plans 3e-4 and 7e-5 of the largest entry, maps 1e-4; clouds of spread ~3)
    bound = 10 * check.bound
    np.testing.assert_allclose(plan, pot.coupling_, rtol=0, atol=bound * pot.coupling_.max())
    # fitted samples: the label-aware plan's projection (POT's continuous map recomputes
    # them without labels; its 'ferradans' map is this projection)
    projection = pot.coupling_ @ Xt / pot.coupling_.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(ours.transform(Xs=Xs), projection, atol=5 * bound)
    np.testing.assert_allclose(ours.transform(Xs=new), pot.transform(Xs=new), atol=5 * bound)
    np.testing.assert_allclose(ours.transform_labels(ys), pot.transform_labels(ys), atol=bound)


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean"])
def test_label_masked_exact_kernel_is_exact(monkeypatch, metric):
    """The exact backend above the cost matrix's budget streams the masked kernel: POT's
    plan, value and maps to the solvers' tolerance (the mask keeps the kernel exact), for
    the squared Euclidean cost and another (whose value sums plan times cost entries)."""
    Xs, ys, Xt, yt = spread_clouds(120, 90, seed=3)
    with np.errstate(over="ignore"):
        pot = ot.da.SinkhornTransport(reg_e=1.0, metric=metric, tol=TOL, max_iter=100_000)
        pot.fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    monkeypatch.setattr(sketchot.da, "DEFAULT_MAX_DENSE_BYTES", 1000)
    ours = SketchSinkhornTransport(
        reg_e=1.0, backend="exact", metric=metric, tol=TOL, max_iter=100_000
    )
    ours.fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    assert ours.fit_path_ == "labelled"
    monkeypatch.setattr(sketchot.da, "DEFAULT_MAX_DENSE_BYTES", 1 << 30)
    np.testing.assert_allclose(
        ours.coupling_, pot.coupling_, rtol=0, atol=1e-9 * pot.coupling_.max()
    )
    assert ours.result_.true_kernel.bound < 1e-8
    allowed = allowed_mask(ys, yt)
    value = np.sum(pot.coupling_[allowed] * pot.cost_[allowed])
    np.testing.assert_allclose(ours.result_.value_linear, value, rtol=1e-9)
    new = Xs[:7] + 0.1
    np.testing.assert_allclose(ours.transform(Xs=new), pot.transform(Xs=new), atol=1e-9)


def test_label_masked_unbalanced_matches_pot():
    """The unbalanced estimator with forbidden pairs on a Nystrom kernel, within its
    certified error of POT's plan."""
    Xs, ys, Xt, yt = spread_clouds(300, 250, seed=4)
    with np.errstate(over="ignore"):
        pot = ot.da.UnbalancedSinkhornTransport(
            reg_e=2.0, reg_m=0.5, limit_max=np.inf, tol=TOL, max_iter=100_000
        ).fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
    ours = SketchUnbalancedSinkhornTransport(
        reg_e=2.0, reg_m=0.5, limit_max=np.inf, backend="nystrom", n_landmarks=150, rng=0,
        max_iter=1000,
    ).fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)  # fmt: skip
    assert ours.fit_path_ == "labelled"
    assert ours.result_.true_kernel.bound <= 1e-3  # the scalings, on the TRUE masked kernel
    # coupling_ holds the Nystrom kernel's entries (within ~1e-6 of the true ones at this
    # reg): measured 4e-7 of the largest entry from POT's plan
    np.testing.assert_allclose(
        ours.coupling_, pot.coupling_, rtol=0, atol=1e-5 * pot.coupling_.max()
    )


def test_label_masked_fit_builds_no_n_by_m_array():
    """n = 8000, m = 3000 (an n x m float64 array is 183 MiB): the fit, the maps of the
    fitted and of new points and the labels peak at a quarter of it at most (measured at
    n = 4000: 22 MiB, the maps' blocks of 128 x m and the sampled check's rows)."""
    import tracemalloc

    Xs, ys, Xt, yt = spread_clouds(8000, 3000, seed=5)
    estimator = SketchSinkhornTransport(reg_e=2.0, backend="nystrom", n_landmarks=100, rng=0)
    tracemalloc.start()
    try:
        estimator.fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)
        estimator.transform(Xs=Xs)
        estimator.transform(Xs=Xs[:500] + 0.01)
        estimator.transform_labels(ys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert estimator.fit_path_ == "labelled"
    assert peak < 8000 * 3000 * 8 / 4
