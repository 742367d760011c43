"""Images with an alpha channel: fully transparent pixels stay out of the palette, and the
alpha channel passes through every mapping unchanged (RGBA in, RGBA out)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import sketchot
from sketchot.color import color_spread, load_image, map_image, sample_pixels, save_image
from sketchot.color.figures import color_transfer_figure
from sketchot.color.images import as_float, as_uint8

WHITE = {"uint8": 255, "uint16": 65535, "float64": 1.0}


def rgba_image(rng: np.random.Generator, shape: tuple[int, int], visible: np.ndarray, kind: str):
    """Visible pixels have red <= half of white; fully transparent ones are pure red, a colour
    no visible pixel has, so any of them in a sample or a palette is detectable."""
    white = WHITE[kind]
    colors = rng.uniform(0.0, 1.0, size=(*shape, 3))
    colors[..., 0] *= 0.5
    alpha = np.where(visible, rng.uniform(0.01, 1.0, size=shape), 0.0)
    image = np.concatenate([colors, alpha[..., None]], axis=2)
    image[~visible, :3] = (1.0, 0.0, 0.0)
    if kind == "float64":
        return image
    stored = np.round(image * white).astype(kind)
    stored[visible, 3] = np.maximum(stored[visible, 3], 1)  # still visible after rounding
    return stored


@st.composite
def rgba_images(draw, kinds=("uint8", "uint16", "float64")):
    height, width = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    flags = draw(st.lists(st.booleans(), min_size=height * width, max_size=height * width))
    visible = np.reshape(flags, (height, width))
    if not visible.any():
        visible[draw(st.integers(0, height - 1)), draw(st.integers(0, width - 1))] = True
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return rgba_image(rng, (height, width), visible, draw(st.sampled_from(kinds))), visible


@settings(max_examples=30, deadline=None)
@given(
    drawn=rgba_images(),
    mode=st.sampled_from(["uniform", "replace", "weighted"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_transparent_pixels_are_never_sampled(drawn, mode, seed):
    image, visible = drawn
    n_visible = int(visible.sum())
    n_samples = min(n_visible, 5) if mode == "uniform" else 5
    sample = sample_pixels(
        image, n_samples, rng=seed, replace=mode == "replace", weighted=mode == "weighted"
    )
    assert sample.n_pixels == n_visible
    assert np.all(sample.colors[:, 0] <= 0.5)  # never the transparent pure red
    assert sample.weights.sum() == pytest.approx(1.0)


def test_an_image_without_visible_pixels_cannot_be_sampled():
    image = np.zeros((3, 4, 4), dtype=np.uint8)
    with pytest.raises(ValueError, match="every pixel of source is fully transparent"):
        sample_pixels(image, 2, rng=0, name="source")
    image[0, 0, 3] = 1
    with pytest.raises(ValueError, match=r"number of non-transparent pixels of source \(1\)"):
        sample_pixels(image, 2, rng=0, name="source")


@pytest.fixture(scope="module")
def solved():
    """Colours of a warm and a cool palette, solved once with the exact kernel."""
    rng = np.random.default_rng(7)
    warm = rng.uniform([0.5, 0.2, 0.0], [1.0, 0.6, 0.3], size=(60, 3))
    cool = rng.uniform([0.0, 0.3, 0.5], [0.3, 0.7, 1.0], size=(50, 3))
    return sketchot.sinkhorn(None, None, warm, cool, 0.1, "exact")


@settings(max_examples=40, deadline=None)
@given(drawn=rgba_images(), out=st.sampled_from([np.float64, np.uint8]))
def test_map_image_passes_alpha_through_and_maps_colours_as_without_it(solved, drawn, out):
    image, _ = drawn
    mapped = map_image(solved, image, dtype=out).image
    assert mapped.shape == image.shape and mapped.dtype == out
    expected_alpha = as_float(image[..., 3]) if out is np.float64 else as_uint8(image[..., 3])
    np.testing.assert_array_equal(mapped[..., 3], expected_alpha)
    # the colours do not depend on alpha: identical to mapping the RGB image
    np.testing.assert_array_equal(
        mapped[..., :3], map_image(solved, image[..., :3], dtype=out).image
    )


def test_save_image_writes_rgba_and_refuses_formats_without_alpha(tmp_path):
    rng = np.random.default_rng(3)
    visible = rng.random((5, 6)) > 0.3
    image = rgba_image(rng, (5, 6), visible, "uint8")
    path = save_image(image, tmp_path / "out.png")
    assert Image.open(path).mode == "RGBA"
    np.testing.assert_array_equal(load_image(path, dtype=None), image)
    with pytest.raises(
        ValueError, match=r"result has an alpha channel, which Pillow cannot write as"
    ):
        save_image(image, tmp_path / "out.jpg", name="result")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]


def test_color_transfer_keeps_alpha_and_leaves_transparent_colours_out(tmp_path):
    """The exact entropic map is a convex combination of sampled target colours: the visible
    target has red <= 0.5, so every recoloured pixel does, unless the transparent pure-red
    pixels (40% of the target) entered the palette."""
    rng = np.random.default_rng(11)
    source = rgba_image(rng, (12, 10), rng.random((12, 10)) > 0.25, "uint8")
    target_visible = rng.random((9, 11)) > 0.4
    target = rgba_image(rng, (9, 11), target_visible, "uint8")
    Image.fromarray(source, mode="RGBA").save(tmp_path / "source.png")
    run = sketchot.transfer_colors(
        tmp_path / "source.png", target, backend="exact", n_samples=40, rng=0, inverse=True
    )
    assert run.image.shape == (12, 10, 4) and run.inverse_image.shape == (9, 11, 4)
    np.testing.assert_array_equal(run.image[..., 3], source[..., 3] / 255.0)
    np.testing.assert_array_equal(run.inverse_image[..., 3], target[..., 3] / 255.0)
    red_limit = target[target_visible, 0].max() / 255.0
    assert run.image[..., 0].max() <= red_limit + 1e-12  # rounding of the convex combination
    figure = color_transfer_figure([("source", source), ("result", run.image)], rng=0)
    assert len(figure.axes) == 4


def test_color_spread_ignores_transparent_pixels():
    rng = np.random.default_rng(5)
    visible = rng.random((6, 7)) > 0.5
    image = rgba_image(rng, (6, 7), visible, "float64")
    other = rng.random((20, 3))
    assert color_spread(image, other) == color_spread(image[visible][:, :3], other)
