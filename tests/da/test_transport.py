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
    with pytest.raises(ValueError, match=r"ys must be a 1-D array with one label per sample"):
        SketchSinkhornTransport().fit(Xs=Xs, ys=np.zeros(79), Xt=Xt, yt=np.zeros(60))
    with pytest.raises(ValueError, match="reg_e must be > 0"):
        SketchSinkhornTransport(reg_e=0).fit(Xs=Xs, Xt=Xt)
    with pytest.raises(ValueError, match=r"backend must be .auto. or one of"):
        SketchSinkhornTransport(backend="keops").fit(Xs=Xs, Xt=Xt)
    with pytest.raises(TypeError, match="backend_params must be a dict"):
        SketchSinkhornTransport(backend_params=[("n_landmarks", 5)]).fit(Xs=Xs, Xt=Xt)
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


def test_reg_is_refused_with_reg_e_suggested(clouds):
    """A keyword that is not a parameter but names another input is a signature error,
    refused at construction (as Python refuses an unexpected keyword); inside
    ``backend_params`` it is a value, checked at fit."""
    with pytest.raises(TypeError, match=r"reg=0\.1 .* pass reg_e=\.\.\."):
        SketchSinkhornTransport(reg=0.1)
    mapping = SketchSinkhornTransport(backend_params={"reg": 0.1})
    with pytest.raises(TypeError, match=r"reg=0\.1 .* pass reg_e"):
        mapping.fit(Xs=clouds[0], Xt=clouds[1])


@pytest.mark.parametrize(
    "name", ["a", "b", "X", "Y", "reg", "backend", "rng", *SolverOptions.names()]
)
def test_every_argument_that_would_reach_sinkhorn_twice_is_refused(clouds, name):
    """Each name sinkhorn receives from the estimator itself, given again as a backend
    parameter, is refused by fit, naming it (not deep in the solver with 'multiple
    values'); the constructor only stores it (scikit-learn's convention)."""
    with pytest.raises(TypeError, match=f"{name}=1 as a backend parameter"):
        SketchSinkhornTransport(backend_params={name: 1}).fit(Xs=clouds[0], Xt=clouds[1])
    # set_params too: fit checks
    mapping = SketchSinkhornTransport(backend="exact")
    mapping.set_params(backend_params={name: 1})
    with pytest.raises(TypeError, match=f"{name}=1 as a backend parameter"):
        mapping.fit(Xs=clouds[0], Xt=clouds[1])


def test_solver_options_that_are_constructor_arguments_are_refused(clouds):
    with pytest.raises(TypeError, match=r"pass max_iter=\.\.\. to the constructor"):
        SketchSinkhornTransport(solver_options={"max_iter": 5}).fit(Xs=clouds[0], Xt=clouds[1])
    options = {"accuracy": 1e-2}
    mapping = SketchSinkhornTransport(solver_options=options)
    assert mapping.solver_options is options  # stored as given (sklearn.base.clone)


def test_log_fills_pot_keys_and_log_true_adds_the_scalings(clouds):
    """POT's ``log=True`` (test_da.py::test_log_da): ``log_`` carries POT's keys; ``u``, ``v``
    only on request (they overflow where the log-scalings do not)."""
    Xs, Xt, _, _ = clouds
    quiet = SketchSinkhornTransport(reg_e=0.5, backend="exact").fit(Xs=Xs, Xt=Xt)
    assert set(quiet.log_) == {"log_u", "log_v", "err", "niter", "n_iter", "converged"}
    logged = SketchSinkhornTransport(reg_e=0.5, backend="exact", log=True).fit(Xs=Xs, Xt=Xt)
    assert set(logged.log_) == set(quiet.log_) | {"u", "v"}
    assert logged.log_["niter"] == logged.log_["n_iter"] == logged.result_.n_iter
    # POT's relation between its keys (same solve: equal to rounding of exp)
    np.testing.assert_allclose(logged.log_["u"], np.exp(logged.log_["log_u"]), rtol=1e-15)
    np.testing.assert_allclose(logged.log_["v"], np.exp(logged.log_["log_v"]), rtol=1e-15)
    # the plan is diag(u) K diag(v) with POT's kernel exp(-M / reg_e)
    K = np.exp(-ot.dist(Xs, Xt) / 0.5)
    plan = logged.log_["u"][:, None] * K * logged.log_["v"][None, :]
    np.testing.assert_allclose(plan, logged.coupling_, rtol=1e-12, atol=1e-15)


def test_new_parameters_follow_the_estimator_protocol(clouds):
    Xs, Xt, new_source, _ = clouds
    mapping = SketchSinkhornTransport(
        reg_e=0.5, backend="exact", log=True, out_of_sample_map="ferradans"
    )
    params = mapping.get_params()
    assert params["log"] is True and params["out_of_sample_map"] == "ferradans"
    assert "n_features" not in params and params["backend_params"] is None
    mapping.fit(Xs=Xs, Xt=Xt)
    clone = SketchSinkhornTransport(**params).fit(Xs=Xs, Xt=Xt)
    np.testing.assert_array_equal(clone.transform(Xs=new_source), mapping.transform(Xs=new_source))
    assert set(clone.log_) == set(mapping.log_)
    mapping.set_params(log=False, out_of_sample_map="continuous")
    assert "u" not in mapping.fit(Xs=Xs, Xt=Xt).log_
    # set_params bypasses the constructor's checks: fit and transform check again, by name
    mapping.set_params(out_of_sample_map="nearest")
    with pytest.raises(ValueError, match="out_of_sample_map must be one of"):
        mapping.transform(Xs=new_source)
    with pytest.raises(ValueError, match="out_of_sample_map must be one of"):
        mapping.fit(Xs=Xs, Xt=Xt)
    mapping.set_params(out_of_sample_map="continuous", log="yes")
    with pytest.raises(TypeError, match="log must be True or False; got 'yes'"):
        mapping.fit(Xs=Xs, Xt=Xt)


def test_ferradans_map_matches_pot(clouds):
    """``out_of_sample_map='ferradans'`` against POT's on new points, inverse included; the
    block size (POT's ``batch_size``) does not change the answer."""
    Xs, Xt, new_source, new_target = clouds
    pot = ot.da.SinkhornTransport(
        reg_e=0.1, tol=1e-12, max_iter=5000, out_of_sample_map="ferradans"
    ).fit(Xs=Xs, Xt=Xt)
    ours = SketchSinkhornTransport(
        reg_e=0.1, backend="exact", tol=1e-12, max_iter=5000, out_of_sample_map="ferradans"
    ).fit(Xs=Xs, Xt=Xt)
    continuous = SketchSinkhornTransport(reg_e=0.1, backend="exact", tol=1e-12, max_iter=5000)
    continuous.fit(Xs=Xs, Xt=Xt)
    # same scalings to ~1e-12 (tol); the maps are ratios of the same sums plus the same
    # offsets, so they agree to rounding (as the continuous map does above)
    for batch_size in (128, 7, 1):
        np.testing.assert_allclose(
            ours.transform(Xs=new_source, batch_size=batch_size),
            pot.transform(Xs=new_source),
            rtol=0,
            atol=1e-9,
        )
        np.testing.assert_allclose(
            ours.inverse_transform(Xt=new_target, batch_size=batch_size),
            pot.inverse_transform(Xt=new_target),
            rtol=0,
            atol=1e-9,
        )
    # on the fitted samples both maps are the plan's barycentric projection
    np.testing.assert_array_equal(ours.transform(Xs=Xs), continuous.transform(Xs=Xs))
    # the maps differ elsewhere (else the option would mean nothing)
    assert np.abs(ours.transform(Xs=new_source) - continuous.transform(Xs=new_source)).max() > 1e-3


def test_ferradans_map_moves_a_point_as_its_nearest_sample():
    rng = np.random.default_rng(5)
    Xs, Xt = rng.random((40, 2)), rng.random((30, 2)) + 1.0
    mapping = SketchSinkhornTransport(reg_e=0.2, backend="exact", out_of_sample_map="ferradans")
    mapping.fit(Xs=Xs, Xt=Xt)
    offset = rng.uniform(-1e-3, 1e-3, size=Xs.shape)  # far below the samples' spacing
    np.testing.assert_allclose(
        mapping.transform(Xs=Xs + offset), mapping.transform(Xs=Xs) + offset, rtol=0, atol=1e-12
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"out_of_sample_map": "unknown"}, ValueError,
         r"out_of_sample_map must be one of 'continuous', 'ferradans'; got 'unknown'"),
        ({"log": 1}, TypeError, r"log must be True or False; got 1"),
        ({"reg_e": "0.1"}, TypeError, r"reg_e must be a real number; got '0.1'"),
        ({"reg_e": -1.0}, ValueError, r"reg_e must be > 0; got -1"),
        ({"backend": "keops"}, ValueError, r"backend must be .auto. or one of .* got 'keops'"),
        ({"max_iter": 10.5}, TypeError, r"max_iter must be an integer; got 10.5"),
        ({"tol": -1.0}, ValueError, r"tol must be > 0; got -1"),
        ({"verbose": "yes"}, TypeError, r"verbose must be True or False; got 'yes'"),
        ({"safeguard": "foo"}, ValueError, r"safeguard must be one of .* got 'foo'"),
        ({"distribution_estimation": "uniform"}, TypeError,
         r"distribution_estimation must be a callable .* got 'uniform'"),
        ({"rng": "x"}, TypeError, r"rng must be None, .* got 'x'"),
        ({"solver_options": {"accurracy": 1e-3}}, TypeError,
         r"solver_options got unknown option\(s\) 'accurracy' \(did you mean 'accuracy'\?\)"),
        ({"solver_options": {"accuracy": -1.0}}, ValueError, r"accuracy must be > 0; got -1"),
        ({"backend": "nystrom", "n_landmrks": 5}, TypeError,
         r"SketchSinkhornTransport\(\) got unexpected keyword argument\(s\) 'n_landmrks' "
         r"\(did you mean 'n_landmarks'\?\)"),
        ({"n_landmarks": 5}, TypeError,
         r"'n_landmarks'; backend='auto' chooses its own parameters"),
        ({"dtype": "float8"}, TypeError, r"dtype must be numpy.float64 or numpy.float32"),
        ({"method": "sinkhorn_fast"}, ValueError,
         r"method must be one of 'sinkhorn', 'sinkhorn_log', .* got 'sinkhorn_fast'"),
        ({"norm": "mean"}, ValueError,
         r"norm must be one of 'median', 'max', 'log', 'loglog'; got 'mean'"),
        ({"limit_max": -1.0}, ValueError, r"limit_max must be > 0 \(or inf"),
        ({"limit_max": "10"}, TypeError, r"limit_max must be a real number > 0 or inf; got '10'"),
        ({"metric": "cosine"}, ValueError, r"metric must be one of .* got 'cosine'"),
    ],
)  # fmt: skip
def test_bad_parameters_fail_at_fit_by_name(clouds, kwargs, error, match):
    """Every parameter is checked by fit, naming it, never first deep in the solver; the
    constructor stores its arguments unchanged (scikit-learn's estimator contract, which
    POT's out_of_sample_map check in __init__ breaks), and so does set_params."""
    with pytest.raises(error, match=match):
        SketchSinkhornTransport(**kwargs).fit(Xs=clouds[0], Xt=clouds[1])
    mapping = SketchSinkhornTransport()
    own = set(mapping.get_params())
    mapping.set_params(
        **{name: value for name, value in kwargs.items() if name in own},
        backend_params={name: value for name, value in kwargs.items() if name not in own},
    )
    with pytest.raises(error, match=match):
        mapping.fit(Xs=clouds[0], Xt=clouds[1])


@pytest.mark.parametrize(
    ("estimate", "match"),
    [
        (lambda X: np.ones(3), r"distribution_estimation\(Xs\) must have one weight per row"),
        (lambda X: -np.ones(len(X)), r"distribution_estimation\(Xs\) must be non-negative"),
        (lambda X: np.full(len(X), np.nan), r"distribution_estimation\(Xs\) must contain only"),
    ],
)
def test_bad_distribution_estimation_output_is_named(clouds, estimate, match):
    with pytest.raises(ValueError, match=match):
        SketchSinkhornTransport(distribution_estimation=estimate).fit(Xs=clouds[0], Xt=clouds[1])
