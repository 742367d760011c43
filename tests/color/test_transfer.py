"""Colour transfer: full-resolution mapping, the entropic map's properties, bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

import sketchot
from sketchot.color import (
    DEFAULT_COLOR_RANK,
    color_transfer,
    image_pixels,
    images,
    map_image,
    save_image,
    transfer_colors,
)

BACKENDS = ("exact", "nystrom", "rff", "polyts")


def warm_image(seed: int = 0, shape=(18, 24)) -> np.ndarray:
    """uint8 image in oranges and reds."""
    rng = np.random.default_rng(seed)
    low, high = np.array([150, 40, 0]), np.array([255, 150, 70])
    return rng.integers(low, high, size=(*shape, 3)).astype(np.uint8)


def cool_image(seed: int = 1, shape=(15, 20)) -> np.ndarray:
    """uint8 image in blues and teals."""
    rng = np.random.default_rng(seed)
    low, high = np.array([0, 70, 120]), np.array([80, 180, 255])
    return rng.integers(low, high, size=(*shape, 3)).astype(np.uint8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mapped_image_has_source_shape_and_unit_range(backend):
    with warnings.catch_warnings():
        # rff and polyts are coarse at reg = 0.1 (documented); only the output contract
        # is tested here, so impossible intermediate values are let through with a warning
        warnings.simplefilter("ignore", UserWarning)
        out = color_transfer(
            warm_image(), cool_image(), backend=backend, n_samples=150, rng=0, max_iter=300,
            errors="warn",
        )  # fmt: skip
    assert out.shape == (18, 24, 3) and out.dtype == np.float64
    assert np.all(np.isfinite(out)) and out.min() >= 0.0 and out.max() <= 1.0


def test_recolouring_takes_the_target_palette():
    out = color_transfer(warm_image(), cool_image(), backend="exact", n_samples=200, rng=0)
    target_mean = cool_image().reshape(-1, 3).mean(axis=0) / 255
    source_mean = warm_image().reshape(-1, 3).mean(axis=0) / 255
    # balanced transport moves the whole colour distribution: the mean follows (within the
    # sampling error of 200 samples and the entropic blur, measured 0.01)
    assert np.abs(out.reshape(-1, 3).mean(axis=0) - target_mean).max() < 0.03
    assert np.abs(source_mean - target_mean).max() > 0.3


@pytest.mark.parametrize(
    ("reg", "mean_bound", "max_bound"),
    # measured mean / max deviations: 1.05e-2 / 3.8e-2 (reg 1e-2), 3.9e-4 / 8.1e-3 (1e-3),
    # 5.5e-6 / 5.1e-4 (1e-4); bounds 2-3x above. The max comes from the closest colour pair.
    [(1e-2, 2e-2, 8e-2), (1e-3, 1e-3, 2e-2), (1e-4, 2e-5, 2e-3)],
)
def test_map_of_a_cloud_onto_itself_is_close_to_identity(reg, mean_bound, max_bound):
    # 150 distinct colours; the Gibbs weight between two different colours,
    # exp(-||x - y||^2 / reg), is tiny for their typical spacing (0.19 here), so the entropic
    # plan of a cloud with itself tends to the identity permutation as reg decreases.
    rng = np.random.default_rng(5)
    image = rng.random((10, 15, 3))
    # tol 1e-5 is 0.15% of a weight (1/150); a tighter tol leaves the map unchanged to 1e-6
    # (measured) but costs up to 8x more iterations near a permutation
    run = transfer_colors(
        image, image, reg=reg, backend="exact", n_samples=150, rng=0, max_iter=3000, tol=1e-5
    )
    assert run.result.converged
    error = np.abs(run.image - image)
    assert error.mean() < mean_bound and error.max() < max_bound, (error.mean(), error.max())


@pytest.mark.parametrize("backend", ["exact", "nystrom"])
def test_map_on_fitted_samples_is_the_barycentric_projection_of_the_plan(backend):
    rng = np.random.default_rng(2)
    X, Y = rng.random((60, 3)), rng.random((45, 3)) * 0.6 + 0.2
    params = {"n_landmarks": 105} if backend == "nystrom" else {}
    result = sketchot.sinkhorn(None, None, X, Y, reg=0.1, backend=backend, rng=0, **params)
    plan = result.plan  # small problem: the dense plan of the kernel the solver used
    projection = (plan @ Y) / plan.sum(axis=1, keepdims=True)
    # both are ratios of the same sums; only rounding separates them
    np.testing.assert_allclose(result.barycentric_map(), projection, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(result.barycentric_map(X_new=X), projection, rtol=1e-9, atol=1e-12)
    inverse = (plan.T @ X) / plan.sum(axis=0)[:, None]
    np.testing.assert_allclose(result.inverse_barycentric_map(), inverse, rtol=1e-10)


def test_map_image_distinct_colours_equals_per_pixel_map():
    source, target = warm_image(shape=(30, 40)), cool_image()
    run = transfer_colors(source, target, backend="nystrom", n_samples=200, rng=0)
    pixels = image_pixels(source / 255.0)
    direct = np.clip(run.result.barycentric_map(X_new=pixels), 0.0, 1.0)
    assert run.forward.n_colors < run.forward.n_pixels  # duplicates were found and skipped
    # same sums in a different blocking: rounding only (measured 2e-12)
    np.testing.assert_allclose(run.image.reshape(-1, 3), direct, rtol=0, atol=1e-10)
    # chunking the colours changes nothing
    chunked = map_image(run.result, source, chunk_size=7)
    np.testing.assert_allclose(chunked.image, run.image, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_map_image_in_pixel_blocks_equals_the_whole_image_at_once(dtype):
    # the bounded-memory path (colour codes, blocks of pixels, uint8 output) against one
    # block and against the float path on the same values: identical, not merely close
    source = warm_image(shape=(30, 40)) // 16 * 16  # repeated colours
    run = transfer_colors(source, cool_image(), backend="nystrom", n_samples=200, rng=0)
    stored = source.astype(dtype) * (257 if dtype == np.uint16 else 1)
    whole = map_image(run.result, stored, pixel_chunk=10**9)
    blocks = map_image(run.result, stored, pixel_chunk=7)
    floats = map_image(run.result, stored / float(np.iinfo(dtype).max))
    for other in (blocks, floats):
        np.testing.assert_array_equal(other.image, whole.image)
        assert (other.n_colors, other.n_clipped, other.n_fallbacks) == (
            whole.n_colors, whole.n_clipped, whole.n_fallbacks,
        )  # fmt: skip
    eight_bit = map_image(run.result, stored, pixel_chunk=7, dtype=np.uint8)
    assert eight_bit.image.dtype == np.uint8
    np.testing.assert_array_equal(eight_bit.image, np.round(whole.image * 255).astype(np.uint8))


def test_compact_transfer_keeps_integers_and_matches_the_float_one():
    source, target = warm_image(), cool_image()
    floats = transfer_colors(source, target, backend="exact", n_samples=150, rng=0, inverse=True)
    compact = transfer_colors(
        source, target, backend="exact", n_samples=150, rng=0, inverse=True, compact=True
    )
    assert compact.source.dtype == compact.image.dtype == compact.inverse_image.dtype == np.uint8
    expected = np.round(floats.image * 255).astype(np.uint8)
    np.testing.assert_array_equal(compact.image, expected)


def test_map_image_refuses_an_output_that_does_not_fit_in_memory(monkeypatch):
    run = transfer_colors(warm_image(), cool_image(), backend="exact", n_samples=100, rng=0)
    monkeypatch.setattr(images, "available_memory", lambda: 1000)  # bytes
    with pytest.raises(MemoryError, match=r"the mapped source \(432 pixels\) needs about"):
        map_image(run.result, warm_image(), name="source")


def test_inverse_map_recolours_the_target_with_the_source_palette():
    run = transfer_colors(
        warm_image(), cool_image(), backend="exact", n_samples=200, rng=0, inverse=True
    )
    assert run.inverse_image.shape == (15, 20, 3)
    source_mean = warm_image().reshape(-1, 3).mean(axis=0) / 255
    # measured 0.015 (same reasoning as the forward map)
    assert np.abs(run.inverse_image.reshape(-1, 3).mean(axis=0) - source_mean).max() < 0.03
    direct = map_image(run.result, cool_image(), inverse=True)
    np.testing.assert_array_equal(direct.image, run.inverse_image)


def test_color_transfer_accepts_files_and_is_reproducible(tmp_path):
    save_image(warm_image() / 255.0, tmp_path / "warm.png")
    Image.fromarray(cool_image()).convert("P").save(tmp_path / "cool.gif")
    first = color_transfer(tmp_path / "warm.png", str(tmp_path / "cool.gif"), n_samples=100, rng=4)
    again = color_transfer(tmp_path / "warm.png", tmp_path / "cool.gif", n_samples=100, rng=4)
    np.testing.assert_array_equal(first, again)
    assert first.shape == (18, 24, 3)


def test_low_rank_default_rank_is_capped_by_the_sample_size():
    run = transfer_colors(warm_image(), cool_image(), backend="nystrom", n_samples=20, rng=0)
    assert DEFAULT_COLOR_RANK > 40
    assert run.backend_params == {"rank": 40}
    # an explicit value is kept, even a poor one, and the accuracy check then warns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = transfer_colors(
            warm_image(), cool_image(), backend="nystrom", n_samples=20, rng=0, n_landmarks=5,
            max_iter=100, errors="warn",
        )  # fmt: skip
    assert any(issubclass(w.category, sketchot.AccuracyWarning) for w in caught)
    assert run.backend_params == {"n_landmarks": 5}


def test_approximate_denominators_fall_back_to_the_exact_kernel():
    # 8 random features at reg = 0.005 make many K~ v entries negative: those colours must be
    # mapped with the exact kernel, counted, and the output stays valid
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        run = transfer_colors(
            warm_image(), cool_image(), reg=0.005, backend="rff", n_features=8, n_samples=100,
            rng=0, max_iter=50, errors="warn",
        )  # fmt: skip
    assert run.forward.n_fallbacks > 0
    assert np.all(np.isfinite(run.image)) and 0.0 <= run.image.min() <= run.image.max() <= 1.0


def test_timings_and_true_kernel_check_are_reported():
    run = transfer_colors(warm_image(), cool_image(), n_samples=100, rng=0)
    for key in ("load", "sample", "build", "iterations", "map", "total"):
        assert run.timings[key] >= 0.0
    # auto solves 100 x 100 colours with the stored exact kernel: the check is exhaustive
    assert run.result.backend == "exact" and run.check.exhaustive
    assert run.check.relative_a < 1e-6


def test_bad_input_is_rejected_with_the_argument_name(tmp_path):
    source, target = warm_image(), cool_image()
    with pytest.raises(ValueError, match="reg must be > 0"):
        color_transfer(source, target, reg=0.0)
    with pytest.raises(ValueError, match="reg must be > 0"):
        color_transfer(source, target, reg=-1.0)
    with pytest.raises(ValueError, match=r"backend must be .auto. or one of"):
        color_transfer(source, target, backend="sinkhorn")
    with pytest.raises(ValueError, match="n_samples must be >= 1"):
        color_transfer(source, target, n_samples=0)
    with pytest.raises(ValueError, match=r"n_samples \(400\) is larger .* of target \(300\)"):
        color_transfer(source, target, n_samples=400)
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*'n_features'"):
        color_transfer(source, target, n_samples=50, n_features=10)
    with pytest.raises(FileNotFoundError, match="source: file"):
        color_transfer(tmp_path / "nope.png", target)


def test_map_image_rejects_non_colour_results():
    rng = np.random.default_rng(0)
    result = sketchot.sinkhorn(
        None, None, rng.random((10, 2)), rng.random((10, 2)), reg=1.0, backend="exact"
    )
    with pytest.raises(ValueError, match="3 columns"):
        map_image(result, warm_image())
    with pytest.raises(TypeError, match="SinkhornResult"):
        map_image("result", warm_image())
