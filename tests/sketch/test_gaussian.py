import numpy as np
import pytest

from sketchot.sketch import GaussianPolySketch


def gaussian(X, Y, gamma):
    return np.exp(-gamma * ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1))


def mean_relative_sq_error(sketch, X, Y, gamma):
    K = gaussian(X, Y, gamma)
    approx = sketch.transform_x(X) @ sketch.transform_y(Y).T
    return np.mean(((approx - K) / K) ** 2)


VARIANTS = ["paper", "improved"]

# These tests are about centring, scaling and dtypes, not about the fit's accuracy: the
# paper's default sketch misses 5% at gamma = 1 here and would warn (SketchAccuracyWarning,
# tested in test_accuracy.py), each warning costing refits for its advice.
QUIET = {"fit_tolerance": None}


@pytest.mark.parametrize(("variant", "bound"), [("paper", 0.05), ("improved", 1e-6)])
def test_centering_improves_accuracy(variant, bound):
    """Colours in [0,1]^3 at gamma = 1: centring shrinks the norms that the polynomial and the
    TensorSketch variance depend on. Measured over 10 seeds: paper 0.01 (centred) vs 0.5
    (raw); improved (exact up to degree 5, sketch above) 1.2e-9 (centred) vs 3.6e-7 (raw)."""
    rng = np.random.default_rng(0)
    X, Y = rng.random((200, 3)), rng.random((150, 3)) ** 2
    centred, raw = [], []
    for seed in range(10):
        centred.append(
            mean_relative_sq_error(
                GaussianPolySketch(1.0, variant=variant, rng=seed, **QUIET).fit(X, Y), X, Y, 1.0
            )
        )
        raw.append(
            mean_relative_sq_error(
                GaussianPolySketch(1.0, center=None, variant=variant, rng=seed, **QUIET).fit(X, Y),
                X,
                Y,
                1.0,
            )
        )
    assert np.mean(centred) < bound
    assert np.mean(centred) < np.mean(raw) / 5


@pytest.mark.parametrize("variant", VARIANTS)
def test_translation_invariance(variant):
    rng = np.random.default_rng(1)
    X, Y = rng.random((50, 3)), rng.random((40, 3))
    shift = np.array([1e3, -2e3, 5e2])
    a = GaussianPolySketch(2.0, variant=variant, rng=3, **QUIET).fit(X, Y)
    b = GaussianPolySketch(2.0, variant=variant, rng=3, **QUIET).fit(X + shift, Y + shift)
    # the centred coordinates differ only by rounding of the shift (1e3 * eps)
    np.testing.assert_allclose(b.transform_x(X + shift), a.transform_x(X), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_overflow_far_from_the_origin(variant):
    """exp(2 gamma x.y) unscaled would be exp(2e6) here: centring and the e^(a - ||u||^2) row
    scales keep every feature finite."""
    rng = np.random.default_rng(2)
    X, Y = 1000 + rng.random((60, 3)), 1000 + rng.random((50, 3))
    sketch = GaussianPolySketch(1.0, variant=variant, rng=0, **QUIET).fit(X, Y)
    features = sketch.transform_x(X), sketch.transform_y(Y)
    assert all(np.all(np.isfinite(f)) for f in features)
    assert mean_relative_sq_error(sketch, X, Y, 1.0) < 0.1


@pytest.mark.parametrize("variant", VARIANTS)
def test_too_small_reg_is_a_clear_error(variant):
    rng = np.random.default_rng(3)
    X = rng.random((30, 3)) * 10
    with pytest.raises(ValueError, match="too large for a polynomial sketch"):
        GaussianPolySketch(1e3, variant=variant, rng=0).fit(X)
    sketch = GaussianPolySketch(8.0, variant=variant, rng=0, **QUIET).fit(
        X
    )  # a ~ 8 * 8.5^2 ~ 580: fine in float64
    with pytest.raises(ValueError, match="float32 features would overflow"):
        sketch.transform_x(X, dtype=np.float32)


@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_features(variant):
    rng = np.random.default_rng(4)
    X = rng.random((40, 3))
    sketch = GaussianPolySketch(1.0, variant=variant, rng=0, **QUIET).fit(X)
    f32 = sketch.transform_x(X, dtype=np.float32)
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, sketch.transform_x(X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("center", ["auto", "bbox", np.array([0.5, 0.5, 0.5]), None])
def test_center_options(center, variant):
    X = np.random.default_rng(5).random((30, 3))
    sketch = GaussianPolySketch(1.0, center=center, variant=variant, rng=0, **QUIET).fit(X)
    assert sketch.center_.shape == (3,)


def test_auto_center_is_the_mean_for_the_paper_and_the_bbox_otherwise():
    X = np.random.default_rng(6).random((30, 3)) ** 3  # skewed: mean != bbox centre
    paper = GaussianPolySketch(1.0, variant="paper", rng=0, **QUIET).fit(X)
    improved = GaussianPolySketch(1.0, rng=0, **QUIET).fit(X)
    np.testing.assert_allclose(paper.center_, X.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(improved.center_, (X.min(axis=0) + X.max(axis=0)) / 2, rtol=1e-12)


def test_bad_center_and_gamma():
    X = np.ones((5, 3))
    with pytest.raises(ValueError, match="center must be"):
        GaussianPolySketch(center="median").fit(X)
    with pytest.raises(ValueError, match=r"center must be a finite point of shape \(3,\)"):
        GaussianPolySketch(center=[0.0, 1.0]).fit(X)
    with pytest.raises(ValueError, match="gamma must be > 0"):
        GaussianPolySketch(gamma=0.0).fit(X)


@pytest.mark.parametrize("name", ["torch", "array_api_strict"])
@pytest.mark.parametrize(
    "params",
    [
        {"variant": "paper", "degree": 3, "sketch_dim": 8},  # TensorSketches only
        {"variant": "improved", "degree": 3, "sketch_dim": 8},  # exact 1-3, a folded sketch
        {"variant": "improved", "degree": 2, "rank": 10},  # exact only: 1 + 3 + 6
    ],
    ids=["paper", "improved", "exact"],
)
@pytest.mark.parametrize("block_bytes", [1 << 30, 4000], ids=["one block", "blocks"])
def test_features_on_a_device_equal_the_hosts(monkeypatch, name, params, block_bytes):
    """``device=``: the features computed in another Array API library (its ``fft``
    extension for the TensorSketches), in one row block or several, are the host's, to
    rounding relative to the features' size (the sketches' FFT sums of signed terms cancel
    to ~1e-19 in places), in the ``dtype`` asked for."""
    from sketchot.sketch import poly

    module = pytest.importorskip(name)
    monkeypatch.setattr(poly, "DEVICE_FEATURE_BYTES", block_bytes)
    from sketchot._arrays import DeviceArrays, array_context

    rng = np.random.default_rng(31)
    X, Y = rng.random((70, 3)), rng.random((50, 3))
    sketch = GaussianPolySketch(2.0, rng=3, fit_tolerance=None, **params).fit(X, Y)
    assert (sketch.sketch_.tensor_sketch_ is None) == ("rank" in params)
    on = DeviceArrays(array_context(X=module.asarray(X)))
    for transform in (sketch.transform_x, sketch.transform_y):
        host = transform(X)
        ours = transform(X, device=on)
        assert type(ours).__module__.split(".")[0] == name
        scale = np.abs(host).max()
        np.testing.assert_allclose(on.get(ours), host, rtol=1e-10, atol=1e-13 * scale)
        single = transform(X, dtype=np.float32, device=on)
        assert single.dtype == module.float32
        np.testing.assert_allclose(on.get(single), host, rtol=1e-5, atol=1e-6 * scale)
