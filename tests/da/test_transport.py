"""SketchSinkhornTransport: POT's ot.da API, agreement with ot.da.SinkhornTransport."""

from __future__ import annotations

import numpy as np
import ot
import pytest

from sketchot import SolverOptions
from sketchot.da import SketchSinkhornTransport


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(0)
    Xs = rng.uniform([0.5, 0.1, 0.0], [1.0, 0.6, 0.4], size=(80, 3))
    Xt = rng.uniform([0.0, 0.3, 0.4], [0.4, 0.8, 1.0], size=(60, 3))
    new_source = rng.random((25, 3))
    new_target = rng.random((30, 3))
    return Xs, Xt, new_source, new_target


@pytest.fixture(scope="module")
def fitted_pair(clouds):
    """The same problem solved by POT (log-domain Sinkhorn) and by sketchot's exact backend."""
    Xs, Xt, _, _ = clouds
    pot = ot.da.SinkhornTransport(reg_e=0.1, tol=1e-12, max_iter=5000).fit(Xs=Xs, Xt=Xt)
    ours = SketchSinkhornTransport(reg_e=0.1, backend="exact", tol=1e-12, max_iter=5000)
    return pot, ours.fit(Xs=Xs, Xt=Xt)


def test_transform_matches_pot_on_fitted_and_new_points(clouds, fitted_pair):
    Xs, Xt, new_source, new_target = clouds
    pot, ours = fitted_pair
    # both converge to the same scalings to ~1e-12 (tol); the maps are ratios of the same
    # sums, so they agree to rounding (measured 6e-16)
    for points in (Xs, new_source):
        np.testing.assert_allclose(
            ours.transform(Xs=points), pot.transform(Xs=points), rtol=0, atol=1e-9
        )
    for points in (Xt, new_target):
        np.testing.assert_allclose(
            ours.inverse_transform(Xt=points), pot.inverse_transform(Xt=points), rtol=0, atol=1e-9
        )
    np.testing.assert_allclose(ours.coupling_, pot.coupling_, rtol=1e-8, atol=1e-15)
    assert ours.n_fallbacks_ == 0


def test_labels_match_pot(clouds, fitted_pair):
    Xs, Xt, _, _ = clouds
    pot, ours = fitted_pair
    ys = (Xs[:, 0] > 0.75).astype(int) + 3  # labels need not start at 0
    yt = (Xt[:, 2] > 0.7).astype(int)
    np.testing.assert_allclose(ours.transform_labels(ys), pot.transform_labels(ys), atol=1e-10)
    np.testing.assert_allclose(
        ours.inverse_transform_labels(yt), pot.inverse_transform_labels(yt), atol=1e-10
    )


def test_transform_on_fitted_samples_is_the_plan_projection(clouds):
    Xs, Xt, _, _ = clouds
    mapping = SketchSinkhornTransport(reg_e=0.1, backend="nystrom", n_landmarks=140, rng=0)
    mapping.fit(Xs=Xs, Xt=Xt)
    plan = mapping.coupling_
    projection = (plan @ Xt) / plan.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(mapping.transform(Xs=Xs), projection, rtol=1e-9, atol=1e-12)


def test_pot_argument_names_and_estimator_protocol(clouds):
    Xs, Xt, new_source, _ = clouds
    mapping = SketchSinkhornTransport(reg_e=2.0, backend="rff", n_features=200, rng=3)
    assert mapping.backend_params == {"n_features": 200}
    params = mapping.get_params()
    assert params["reg_e"] == 2.0 and params["backend"] == "rff" and params["rng"] == 3
    assert mapping.fit(Xs=Xs, ys=None, Xt=Xt, yt=None) is mapping
    first = mapping.transform(Xs=new_source)
    # fit_transform (inherited from ot.da.BaseTransport) goes through the same fit
    np.testing.assert_array_equal(mapping.fit_transform(Xs=Xs, Xt=Xt), mapping.transform(Xs=Xs))
    clone = SketchSinkhornTransport(**mapping.get_params()).fit(Xs=Xs, Xt=Xt)
    np.testing.assert_array_equal(clone.transform(Xs=new_source), first)
    mapping.set_params(reg_e=3.0, backend_params={"n_features": 50})
    assert mapping.reg_e == 3.0 and mapping.get_params()["backend_params"] == {"n_features": 50}
    assert set(mapping.log_) >= {"log_u", "log_v", "n_iter", "err", "converged"}
    assert mapping.result_.backend == "rff"


def test_pot_color_example_runs_with_the_class_swapped():
    # POT's examples/domain-adaptation/plot_otda_color_images.py, the lines that use the class,
    # on two small generated images, with ot.da.SinkhornTransport replaced by ours
    rng = np.random.default_rng(42)
    I1 = rng.integers(0, 256, size=(30, 40, 3)).astype(np.float64) / 256
    I2 = (rng.integers(0, 256, size=(25, 30, 3)) // 2).astype(np.float64) / 256

    def im2mat(img):
        return img.reshape((img.shape[0] * img.shape[1], img.shape[2]))

    def mat2im(X, shape):
        return X.reshape(shape)

    def minmax(img):
        return np.clip(img, 0, 1)

    X1, X2 = im2mat(I1), im2mat(I2)
    nb = 500
    idx1 = rng.integers(X1.shape[0], size=(nb,))
    idx2 = rng.integers(X2.shape[0], size=(nb,))
    Xs, Xt = X1[idx1, :], X2[idx2, :]

    ot_sinkhorn = SketchSinkhornTransport(reg_e=1e-1)
    ot_sinkhorn.fit(Xs=Xs, Xt=Xt)
    transp_Xs_sinkhorn = ot_sinkhorn.transform(Xs=X1)
    transp_Xt_sinkhorn = ot_sinkhorn.inverse_transform(Xt=X2)
    Image_sinkhorn = minmax(mat2im(transp_Xs_sinkhorn, I1.shape))
    Image_sinkhorn_inverse = minmax(mat2im(transp_Xt_sinkhorn, I2.shape))
    assert Image_sinkhorn.shape == I1.shape and Image_sinkhorn_inverse.shape == I2.shape

    reference = ot.da.SinkhornTransport(reg_e=1e-1).fit(Xs=Xs, Xt=Xt)
    expected = minmax(mat2im(reference.transform(Xs=X1), I1.shape))
    # default backend (Nystrom, 400 landmarks capped to the 1000 samples) against POT's exact
    # kernel; measured 2.1e-4 mean absolute difference, < 1/255 is invisible
    assert np.abs(Image_sinkhorn - expected).mean() < 1 / 255


def test_errors_name_the_argument(clouds):
    Xs, Xt, _, _ = clouds
    with pytest.raises(RuntimeError, match="not fitted yet"):
        SketchSinkhornTransport().transform(Xs=Xs)
    with pytest.raises(ValueError, match="Xt missing"):
        SketchSinkhornTransport().fit(Xs=Xs)
    with pytest.raises(ValueError, match="ys and yt were both given"):
        SketchSinkhornTransport().fit(Xs=Xs, ys=np.zeros(80), Xt=Xt, yt=np.zeros(60))
    with pytest.raises(ValueError, match="reg_e must be > 0"):
        SketchSinkhornTransport(reg_e=0).fit(Xs=Xs, Xt=Xt)
    with pytest.raises(ValueError, match=r"backend must be .auto. or one of"):
        SketchSinkhornTransport(backend="keops").fit(Xs=Xs, Xt=Xt)
    with pytest.raises(TypeError, match="backend_params must be a dict"):
        SketchSinkhornTransport(backend_params=[("n_landmarks", 5)])
    with pytest.raises(ValueError, match="Xt must have 3 columns"):
        SketchSinkhornTransport().fit(Xs=Xs, Xt=Xt[:, :2])
    fitted = SketchSinkhornTransport(reg_e=0.5, backend="exact").fit(Xs=Xs, Xt=Xt)
    with pytest.raises(ValueError, match="Xs must have 3 columns"):
        fitted.transform(Xs=Xs[:, :2])
    with pytest.raises(ValueError, match="Xt is missing"):
        fitted.inverse_transform(Xs=Xs)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        fitted.transform(Xs=Xs, batch_size=0)
    with pytest.raises(ValueError, match="one label per fitted sample"):
        fitted.transform_labels(np.zeros(3))


def test_reg_is_refused_at_construction_with_reg_e_suggested():
    with pytest.raises(TypeError, match=r"reg=0\.1 .* pass reg_e=\.\.\."):
        SketchSinkhornTransport(reg=0.1)
    with pytest.raises(TypeError, match=r"reg=0\.1 .* pass reg_e"):
        SketchSinkhornTransport(backend_params={"reg": 0.1})


@pytest.mark.parametrize(
    "name", ["a", "b", "X", "Y", "reg", "backend", "rng", *SolverOptions.names()]
)
def test_every_argument_that_would_reach_sinkhorn_twice_is_refused(clouds, name):
    """Each name sinkhorn receives from the estimator itself, given again as a backend
    parameter, is refused before fit (where it used to fail with 'multiple values')."""
    with pytest.raises(TypeError, match=f"{name}=1 as a backend parameter"):
        SketchSinkhornTransport(backend_params={name: 1})
    # set_params bypasses the constructor: fit checks again
    mapping = SketchSinkhornTransport(backend="exact")
    mapping.set_params(backend_params={name: 1})
    with pytest.raises(TypeError, match=f"{name}=1 as a backend parameter"):
        mapping.fit(Xs=clouds[0], Xt=clouds[1])


def test_solver_options_that_are_constructor_arguments_are_refused():
    with pytest.raises(TypeError, match=r"pass max_iter=\.\.\. to the constructor"):
        SketchSinkhornTransport(solver_options={"max_iter": 5})
    mapping = SketchSinkhornTransport(solver_options={"accuracy": 1e-2})
    assert mapping.solver_options == {"accuracy": 1e-2}
