"""Image helpers: loading every Pillow mode, sampling, distinct colours, atomic saving."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from sketchot.color import (
    ColorIndex,
    color_spread,
    distinct_colors,
    images,
    load_image,
    load_image_pair,
    sample_pixels,
    save_image,
)

HEIGHT, WIDTH = 5, 7


def reference_rgb() -> np.ndarray:
    """A small uint8 RGB picture with distinct, known values."""
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(HEIGHT, WIDTH, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------- loading
def test_load_rgb_png_exactly(tmp_path):
    pixels = reference_rgb()
    Image.fromarray(pixels, mode="RGB").save(tmp_path / "rgb.png")
    loaded = load_image(tmp_path / "rgb.png")
    assert loaded.shape == (HEIGHT, WIDTH, 3) and loaded.dtype == np.float64
    np.testing.assert_array_equal(loaded, pixels / 255.0)


def test_load_rgba_keeps_alpha(tmp_path):
    pixels = reference_rgb()
    alpha = np.arange(HEIGHT * WIDTH, dtype=np.uint8).reshape(HEIGHT, WIDTH, 1) * 7
    rgba = np.concatenate([pixels, alpha], axis=2)
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "a.png")
    np.testing.assert_array_equal(load_image(tmp_path / "a.png"), rgba / 255.0)
    np.testing.assert_array_equal(load_image(tmp_path / "a.png", dtype=None), rgba)
    np.testing.assert_array_equal(load_image(rgba), rgba / 255.0)


@pytest.mark.parametrize("kind", ["LA", "P with transparency", "RGB with transparency"])
def test_other_transparent_modes_give_an_alpha_channel(tmp_path, kind):
    pixels = reference_rgb()
    if kind == "LA":
        picture = Image.fromarray(pixels[:, :, 0], mode="L").convert("LA")
        picture.putalpha(Image.fromarray(np.where(pixels[:, :, 1] > 127, 255, 0).astype(np.uint8)))
    elif kind == "P with transparency":
        picture = Image.fromarray(pixels, mode="RGB").quantize(colors=8)
        picture.info["transparency"] = 0  # palette entry 0 is transparent
    else:
        picture = Image.fromarray(pixels, mode="RGB")
        picture.info["transparency"] = tuple(int(v) for v in pixels[0, 0])
    picture.save(tmp_path / "t.png")
    loaded = load_image(tmp_path / "t.png", dtype=None)
    assert loaded.shape == (HEIGHT, WIDTH, 4)
    expected = np.asarray(Image.open(tmp_path / "t.png").convert("RGBA"))
    np.testing.assert_array_equal(loaded, expected)
    assert 0 in loaded[:, :, 3] and 255 in loaded[:, :, 3]


@pytest.mark.parametrize("mode", ["L", "LA"])
def test_load_greyscale_replicates_channels(tmp_path, mode):
    grey = reference_rgb()[:, :, 0]
    picture = Image.fromarray(grey, mode="L").convert(mode)
    picture.save(tmp_path / "grey.png")
    loaded = load_image(tmp_path / "grey.png")
    for channel in range(3):
        np.testing.assert_array_equal(loaded[:, :, channel], grey / 255.0)


def test_load_bilevel(tmp_path):
    bits = reference_rgb()[:, :, 0] > 127
    Image.fromarray(bits).convert("1").save(tmp_path / "bits.png")
    loaded = load_image(tmp_path / "bits.png")
    np.testing.assert_array_equal(loaded[:, :, 1], bits.astype(float))


def test_load_palette(tmp_path):
    pixels = reference_rgb()
    palette_image = Image.fromarray(pixels, mode="RGB").quantize(colors=8)
    palette_image.save(tmp_path / "palette.png")
    assert Image.open(tmp_path / "palette.png").mode == "P"
    expected = np.asarray(palette_image.convert("RGB")) / 255.0
    np.testing.assert_array_equal(load_image(tmp_path / "palette.png"), expected)


def test_load_16_bit_greyscale_keeps_precision(tmp_path):
    # 16-bit values must be divided by 65535, not clipped at 255 as Image.convert("RGB") does
    values = np.linspace(0, 65535, HEIGHT * WIDTH).astype(np.uint16).reshape(HEIGHT, WIDTH)
    Image.fromarray(values).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    loaded = load_image(tmp_path / "deep.png")
    np.testing.assert_allclose(loaded[:, :, 2], values / 65535.0, rtol=0, atol=1e-12)
    assert loaded.max() == 1.0


def test_load_32_bit_integer_and_float_modes(tmp_path):
    values = np.arange(HEIGHT * WIDTH, dtype=np.int32).reshape(HEIGHT, WIDTH) * 1000
    Image.fromarray(values, mode="I").save(tmp_path / "int.tif")
    np.testing.assert_allclose(load_image(tmp_path / "int.tif")[:, :, 0], values / 65535.0)
    floats = np.linspace(0, 1, HEIGHT * WIDTH, dtype=np.float32).reshape(HEIGHT, WIDTH)
    Image.fromarray(floats, mode="F").save(tmp_path / "float.tif")
    np.testing.assert_allclose(load_image(tmp_path / "float.tif")[:, :, 1], floats)


def test_load_cmyk_jpeg(tmp_path):
    Image.fromarray(reference_rgb(), mode="RGB").convert("CMYK").save(tmp_path / "c.jpg")
    loaded = load_image(tmp_path / "c.jpg")
    assert loaded.shape == (HEIGHT, WIDTH, 3)
    assert loaded.min() >= 0.0 and loaded.max() <= 1.0


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (np.full((2, 3, 3), 255, dtype=np.uint8), 1.0),
        (np.full((2, 3, 3), 65535, dtype=np.uint16), 1.0),
        (np.full((2, 3), 0.25), 0.25),
        (np.full((2, 3, 1), 0.5, dtype=np.float32), 0.5),
        (np.full((2, 3, 4), 51, dtype=np.uint8), 0.2),
    ],
)
def test_load_arrays(array, expected):
    loaded = load_image(array)
    assert loaded.shape == (2, 3, 4 if array.shape[-1] == 4 else 3)
    np.testing.assert_allclose(loaded, expected)


def test_load_errors_name_the_argument(tmp_path, zero_pixel_png):
    with pytest.raises(FileNotFoundError, match=r"source: file .*missing\.png.* does not exist"):
        load_image(tmp_path / "missing.png", name="source")
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ValueError, match=r"target: .*not an image file Pillow can read"):
        load_image(tmp_path / "text.png", name="target")
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        load_image(tmp_path / "empty.png")
    with pytest.raises(ValueError, match="zero pixels"):
        load_image(zero_pixel_png)
    with pytest.raises(ValueError, match="is a folder"):
        load_image(tmp_path)
    with pytest.raises(ValueError, match="zero pixels"):
        load_image(np.zeros((0, 4, 3)))
    out_of_range = np.full((2, 2, 3), 0.5)
    out_of_range[0, 0, 0] = -0.5
    with pytest.raises(ValueError, match=r"values in \[-0.5, 0.5\]"):
        load_image(out_of_range)
    with pytest.raises(ValueError, match="shape"):
        load_image(np.zeros((2, 2, 5)))
    with pytest.raises(TypeError, match="integer dtype int64"):
        load_image(np.zeros((2, 2, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="image file path or a numeric array"):
        load_image(np.array([["a"]]))


def test_truncated_file_is_a_value_error(tmp_path):
    Image.fromarray(reference_rgb(), mode="RGB").save(tmp_path / "full.png")
    data = (tmp_path / "full.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot read image"):
        load_image(tmp_path / "cut.png")


def test_load_image_pair_reads_both_files_and_names_the_missing_ones(tmp_path):
    source, target = reference_rgb(), reference_rgb()[::-1]
    save_image(source, tmp_path / "sun_source.png")
    save_image(target, tmp_path / "sun_target.png")
    loaded = load_image_pair(tmp_path, "sun")
    np.testing.assert_array_equal(loaded[0], source / 255.0)
    np.testing.assert_array_equal(load_image_pair(tmp_path, "sun", dtype=None)[1], target)
    with pytest.raises(FileNotFoundError, match=r"moon_source\.png, .*moon_target\.png"):
        load_image_pair(tmp_path, "moon")


def test_color_spread_matches_its_definition():
    rng = np.random.default_rng(0)
    X, Y = rng.random((40, 3)), 0.5 * rng.random((30, 3)) + 0.2
    spread = color_spread(X.reshape(8, 5, 3), Y)
    pairs = X[:, None, :] - Y[None, :, :]
    assert spread["mean_sq_distance"] == pytest.approx(np.mean(np.sum(pairs**2, axis=2)))
    c = np.vstack([X, Y]).mean(axis=0)
    norms = [np.linalg.norm(Z - c, axis=1).max() for Z in (X, Y)]
    assert spread["half_width"] == pytest.approx(norms[0] * norms[1])


# ------------------------------------------------------------------------------ sampling
def test_sample_pixels_uniform_is_reproducible_and_valid():
    image = reference_rgb()
    first = sample_pixels(image, 20, rng=3)
    again = sample_pixels(image, 20, rng=3)
    np.testing.assert_array_equal(first.colors, again.colors)
    assert first.colors.shape == (20, 3) and first.n_pixels == HEIGHT * WIDTH
    np.testing.assert_allclose(first.weights, 1 / 20)
    # without replacement every sampled colour comes from a different pixel
    pixels = (image.reshape(-1, 3) / 255.0).tolist()
    assert all(color in pixels for color in first.colors.tolist())


def test_sample_pixels_all_without_replacement_is_a_permutation():
    image = reference_rgb()
    sample = sample_pixels(image, HEIGHT * WIDTH, rng=0)
    np.testing.assert_array_equal(
        np.sort(sample.colors, axis=0), np.sort(image.reshape(-1, 3) / 255.0, axis=0)
    )


def test_sample_pixels_with_replacement_allows_more_than_pixels():
    sample = sample_pixels(reference_rgb(), 5 * HEIGHT * WIDTH, rng=0, replace=True)
    assert len(sample) == 5 * HEIGHT * WIDTH


def test_sample_pixels_weighted_gives_the_exact_histogram_when_small():
    image = np.zeros((4, 5, 3), dtype=np.uint8)
    image[:1] = (255, 0, 0)  # 5 red pixels, 15 black
    sample = sample_pixels(image, 10, rng=0, weighted=True)
    assert len(sample) == 2
    weights = dict(zip(map(tuple, sample.colors.tolist()), sample.weights, strict=True))
    assert weights == {(0.0, 0.0, 0.0): 0.75, (1.0, 0.0, 0.0): 0.25}


def test_sample_pixels_weighted_subsample_weights_sum_to_one():
    sample = sample_pixels(reference_rgb(), 10, rng=1, weighted=True)
    assert len(sample) == 10
    assert np.isclose(sample.weights.sum(), 1.0) and np.all(sample.weights > 0)
    assert len({tuple(c) for c in sample.colors.tolist()}) == 10


def test_sample_pixels_errors():
    image = reference_rgb()
    with pytest.raises(ValueError, match=r"n_samples \(36\) is larger than the number of pixels"):
        sample_pixels(image, HEIGHT * WIDTH + 1, rng=0, name="source")
    with pytest.raises(ValueError, match="n_samples must be >= 1"):
        sample_pixels(image, 0, rng=0)
    with pytest.raises(TypeError, match="n_samples must be an integer"):
        sample_pixels(image, 2.5, rng=0)
    with pytest.raises(ValueError, match="replace=True cannot be combined with weighted=True"):
        sample_pixels(image, 3, rng=0, replace=True, weighted=True)
    with pytest.raises(TypeError, match="rng must be"):
        sample_pixels(image, 3, rng="seed")


# ------------------------------------------------------------------------ distinct colours
@settings(max_examples=30, deadline=None)
@given(
    levels=st.sampled_from([255, 256, 65535]),
    seed=st.integers(0, 2**31 - 1),
    size=st.integers(1, 300),
)
def test_distinct_colors_reconstructs_quantised_pixels(levels, seed, size):
    rng = np.random.default_rng(seed)
    top = 255 if levels == 256 else levels  # POT's /256 never reaches 1
    pixels = rng.integers(0, min(top, 6) + 1, size=(size, 3)) / levels
    colors, inverse = distinct_colors(pixels)
    np.testing.assert_array_equal(colors[inverse], pixels)
    assert colors.shape[0] == len({tuple(p) for p in pixels.tolist()})


def test_distinct_colors_continuous_data():
    pixels = np.random.default_rng(0).random((50, 3))
    assert distinct_colors(pixels) is None  # no cheap de-duplication: callers map directly
    doubled = np.vstack([pixels, pixels])
    colors, inverse = distinct_colors(doubled, exhaustive=True)
    assert colors.shape[0] == 50
    np.testing.assert_array_equal(colors[inverse], doubled)


# -------------------------------------------------------------------------------- saving
def test_save_image_round_trip_and_no_temporary_left(tmp_path):
    image = reference_rgb() / 255.0
    path = save_image(image, tmp_path / "out.png")
    np.testing.assert_array_equal(load_image(path), image)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]
    # same permissions as a file written with open() (the temporary file starts private)
    (tmp_path / "plain.txt").write_text("x")
    assert path.stat().st_mode & 0o777 == (tmp_path / "plain.txt").stat().st_mode & 0o777


def test_save_image_errors_leave_no_file(tmp_path):
    image = reference_rgb() / 255.0
    with pytest.raises(FileNotFoundError, match=r"output folder .* does not exist"):
        save_image(image, tmp_path / "missing" / "out.png")
    with pytest.raises(ValueError, match="cannot tell the image format"):
        save_image(image, tmp_path / "out.unknown")
    with pytest.raises(ValueError, match="float images must lie in"):
        save_image(image * 2, tmp_path / "out.png")
    assert list(tmp_path.iterdir()) == []


def test_save_image_failure_during_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = save_image(np.zeros((2, 2, 3)), tmp_path / "out.png")
    before = path.read_bytes()

    def broken_save(self, fp, format=None, **params):
        fp.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_image(np.ones((2, 2, 3)), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]


# --------------------------------------------------------------------- EXIF orientation
#: How a camera stores an upright picture under each EXIF orientation tag (from the EXIF
#: specification, written with numpy independently of Pillow): the loader must undo it.
STORED_UNDER_ORIENTATION = {
    1: lambda up: up,
    2: lambda up: up[:, ::-1],  # mirrored left-right
    3: lambda up: up[::-1, ::-1],  # turned half a turn
    4: lambda up: up[::-1, :],  # mirrored top-bottom
    5: lambda up: up.transpose(1, 0, 2),  # mirrored about the main diagonal
    6: lambda up: np.rot90(up, k=1),  # turned a quarter counter-clockwise: display turns back
    7: lambda up: up[::-1, ::-1].transpose(1, 0, 2),  # mirrored about the anti-diagonal
    8: lambda up: np.rot90(up, k=-1),  # turned a quarter clockwise
}


@pytest.mark.parametrize("orientation", sorted(STORED_UNDER_ORIENTATION))
def test_exif_orientation_is_applied_on_load(tmp_path, orientation):
    upright = reference_rgb()  # 5 x 7, every pixel distinct enough to catch any flip
    stored = np.ascontiguousarray(STORED_UNDER_ORIENTATION[orientation](upright))
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(stored).save(tmp_path / "photo.png", exif=exif)
    loaded = load_image(tmp_path / "photo.png", dtype=None)
    np.testing.assert_array_equal(loaded, upright)


def test_portrait_jpeg_with_orientation_6_loads_portrait(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6
    landscape = np.zeros((30, 40, 3), dtype=np.uint8)  # as the sensor stored it
    Image.fromarray(landscape).save(tmp_path / "portrait.jpg", exif=exif)
    assert load_image(tmp_path / "portrait.jpg").shape == (40, 30, 3)


# ------------------------------------------------------- decompression bombs and memory
def test_decompression_bomb_is_a_value_error_naming_file_and_size(bomb_png):
    expected = (
        r"source: '.*bomb\.png' has 100000 x 100000 = 10000000000 pixels, over the limit of "
        f"{Image.MAX_IMAGE_PIXELS} pixels"
    )
    with pytest.raises(ValueError, match=expected):
        load_image(bomb_png, name="source")


def test_files_above_pillows_warning_threshold_are_refused(tmp_path, monkeypatch):
    """Pillow warns above MAX_IMAGE_PIXELS and refuses only above twice that: a file in
    between (a 144-Mpx PNG) used to be decoded. The threshold is lowered here instead of
    writing such a file: 35 pixels, Pillow's warning at 20 and its error at 40."""
    Image.fromarray(reference_rgb()).save(tmp_path / "seven_by_five.png")
    path = tmp_path / "seven_by_five.png"
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20)
    message = (
        r"photo: '.*seven_by_five\.png' has 7 x 5 = 35 pixels, over the limit of 20 pixels "
        r"\(max_pixels; by default Pillow's decompression-bomb threshold .*\); refusing to "
        r"decode it\. To read it anyway pass max_pixels=None \(--max-pixels 0"
    )
    with pytest.raises(ValueError, match=message):
        load_image(path, name="photo")
    with pytest.raises(ValueError, match="over the limit of 34 pixels"):
        load_image(path, max_pixels=34)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DecompressionBombWarning either
        for limit in (35, None, 0):
            np.testing.assert_array_equal(
                load_image(path, max_pixels=limit, dtype=None), reference_rgb()
            )
    # beyond Pillow's own error (2 x 20 < 35 + 10): the override still reads it
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)
    assert load_image(path, max_pixels=None).shape == (HEIGHT, WIDTH, 3)
    assert Image.MAX_IMAGE_PIXELS == 10  # Pillow's setting is left as it was
    with pytest.raises(ValueError, match="max_pixels must be >= 0"):
        load_image(path, max_pixels=-1)
    with pytest.raises(ValueError, match="max_pixels must be an integer, None or 'pillow'"):
        load_image(path, max_pixels="none")


def test_image_too_large_for_memory_is_refused_before_decoding(tmp_path, monkeypatch):
    Image.fromarray(reference_rgb()).save(tmp_path / "photo.png")
    monkeypatch.setattr(images, "available_memory", lambda: 100)  # bytes
    with pytest.raises(MemoryError, match=r"target '.*photo\.png' \(7 x 5 pixels.*needs about"):
        load_image(tmp_path / "photo.png", name="target")


def test_available_memory_reads_this_machine():
    available = images.available_memory()
    assert available is None or available > 0


def test_stored_dtype_keeps_integers_and_float_is_exactly_scaled(tmp_path):
    pixels = reference_rgb()
    Image.fromarray(pixels).save(tmp_path / "rgb.png")
    stored = load_image(tmp_path / "rgb.png", dtype=None)
    assert stored.dtype == np.uint8
    np.testing.assert_array_equal(stored, pixels)
    np.testing.assert_array_equal(load_image(tmp_path / "rgb.png"), pixels / 255.0)
    with pytest.raises(ValueError, match=r"dtype must be numpy\.float64 or None"):
        load_image(pixels, dtype=np.float32)


# ----------------------------------------------------------------------- 16-bit PNG files
def png16_scanlines(values: np.ndarray) -> bytes:
    """Filtered scanlines of a 16-bit PNG (Pillow cannot write 16-bit RGB), rows cycling
    through the five filter types so that the reader's unfiltering is exercised too."""
    height, width, channels = values.shape
    bpp = 2 * channels
    rows = values.astype(">u2").reshape(height, width * channels).view(np.uint8)
    data, previous = bytearray(), np.zeros(width * bpp, dtype=np.int64)
    for number, row in enumerate(rows.astype(np.int64)):
        kind = number % 5
        left = np.concatenate([np.zeros(bpp, np.int64), row[:-bpp]])
        up_left = np.concatenate([np.zeros(bpp, np.int64), previous[:-bpp]])
        if kind == 0:
            predicted = np.zeros_like(row)
        elif kind == 1:
            predicted = left
        elif kind == 2:
            predicted = previous
        elif kind == 3:
            predicted = (left + previous) // 2
        else:
            estimate = left + previous - up_left
            gaps = [np.abs(estimate - guess) for guess in (left, previous, up_left)]
            predicted = np.where(
                (gaps[0] <= gaps[1]) & (gaps[0] <= gaps[2]),
                left,
                np.where(gaps[1] <= gaps[2], previous, up_left),
            )
        data += bytes([kind]) + ((row - predicted) % 256).astype(np.uint8).tobytes()
        previous = row
    return bytes(data)


@pytest.mark.parametrize(("channels", "color_type"), [(3, 2), (4, 6)])
def test_16_bit_rgb_png_is_read_at_16_bits(tmp_path, write_png, channels, color_type):
    rng = np.random.default_rng(4)
    values = rng.integers(0, 65536, size=(HEIGHT + 5, WIDTH, channels), dtype=np.uint16)
    data = png16_scanlines(values)
    write_png(tmp_path / "deep.png", WIDTH, HEIGHT + 5, 16, color_type, data)
    stored = load_image(tmp_path / "deep.png", dtype=None)
    assert stored.dtype == np.uint16
    np.testing.assert_array_equal(stored, values)  # alpha too, at 16 bits
    np.testing.assert_array_equal(load_image(tmp_path / "deep.png"), values / 65535.0)


def test_16_bit_file_read_at_8_bits_warns(tmp_path, write_png):
    values = np.full((HEIGHT, WIDTH, 2), 40000, dtype=np.uint16)  # grey + alpha, 16 bits
    write_png(tmp_path / "grey_alpha.png", WIDTH, HEIGHT, 16, 4, png16_scanlines(values))
    with pytest.warns(UserWarning, match="precision was reduced to 8 bits"):
        load_image(tmp_path / "grey_alpha.png")


# ----------------------------------------------------------------------- colour codes
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_color_index_matches_distinct_colors(dtype):
    rng = np.random.default_rng(5)
    step = 37 if dtype == np.uint8 else 9000  # 7 levels per channel: many repeated colours
    pixels = (rng.integers(0, 7, size=(500, 3)) * step).astype(dtype)
    table = ColorIndex.build(pixels, counts=True, chunk=64)
    colors, inverse = distinct_colors(pixels / float(np.iinfo(dtype).max))
    np.testing.assert_array_equal(table.colors(), colors)
    np.testing.assert_array_equal(table.index(pixels), inverse)
    np.testing.assert_array_equal(table.counts, np.bincount(inverse))


def test_weighted_sample_of_integers_equals_the_float_one():
    image = (reference_rgb() // 64) * 64  # repeated colours
    from_integers = sample_pixels(image, 6, rng=2, weighted=True)
    from_floats = sample_pixels(image / 255.0, 6, rng=2, weighted=True)
    np.testing.assert_array_equal(from_integers.colors, from_floats.colors)
    np.testing.assert_array_equal(from_integers.weights, from_floats.weights)
