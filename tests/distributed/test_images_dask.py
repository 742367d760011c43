"""Colour transfer of an image held as a Dask array (:func:`sketchot.map_image` chunk by
chunk on the workers, :mod:`sketchot.distributed.images`) against the in-memory mapping of
the same image, on a real LocalCluster (``client`` of ``conftest.py``)."""

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("dask.distributed")
pytest.importorskip("PIL")

import dask  # noqa: E402

import sketchot  # noqa: E402
from sketchot.color import transfer_colors  # noqa: E402


def photo_like(seed, shape):
    """uint8 RGB image with repeated colours (a palette of 300 colours plus noise)."""
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, size=(300, 3))
    picked = palette[rng.integers(0, 300, size=shape)]
    return np.clip(picked + rng.integers(-3, 4, size=(*shape, 3)), 0, 255).astype(np.uint8)


# polyts_local: the default ('auto') choice on photographs, whose kernel holds a lock and a
# cache that must not travel (they did, and the workers could not unpickle the result)
@pytest.fixture(scope="module", params=["nystrom", "polyts_local"])
def fitted(request):
    source, target = photo_like(0, (61, 47)), photo_like(1, (40, 30))
    return source, transfer_colors(source, target, backend=request.param, n_samples=300, rng=0)


def map_tolerance(run):
    """A colour's map is a ratio of two kernel products of colours in [0, 1]: it moves by at
    most about twice their relative error (the kernel's certified ``product_rtol``; 0 for an
    operator whose products do not depend on the batch: ``None`` or 0) when the batch
    changes, plus rounding."""
    return 4.0 * (run.result.kernel.info.product_rtol or 0.0) + 1e-12


@pytest.mark.parametrize("dtype", [np.float64, np.uint8])
@pytest.mark.parametrize("chunks", [(20, 15), (61, 47)])
def test_a_dask_image_maps_as_in_memory(client, fitted, dtype, chunks):
    """Every chunk through the in-memory mapping on the workers: the same image as the
    in-memory call (a pixel's map depends on its colour only, up to how the colours are
    batched: rounding for Nystrom, within the certified product error for the block-local
    kernel, whose expansion of new points depends on the batch), the same clipped pixels;
    colours are counted per chunk (at least the image's distinct colours)."""
    source, run = fitted
    expected = sketchot.map_image(run.result, source, dtype=dtype)
    image = da.from_array(source, chunks=(*chunks, 3))
    mapped = sketchot.map_image(run.result, image, dtype=dtype)
    assert isinstance(mapped.image, da.Array) and mapped.image.chunks[:2] == image.chunks[:2]
    assert mapped.n_pixels == expected.n_pixels
    out, n_colors, n_clipped, n_fallbacks = dask.compute(
        mapped.image, mapped.n_colors, mapped.n_clipped, mapped.n_fallbacks
    )
    assert out.dtype == np.dtype(dtype) and out.shape == source.shape
    if np.dtype(dtype) == np.uint8:  # a rounding-level difference may move one 8-bit step
        assert np.abs(out.astype(int) - expected.image.astype(int)).max() <= 1
    else:
        np.testing.assert_allclose(out, expected.image, rtol=0, atol=map_tolerance(run))
    if run.result.backend == "nystrom":  # (the block-local map may cross [0, 1] elsewhere)
        assert n_clipped == expected.n_clipped
    assert n_colors >= expected.n_colors and n_fallbacks >= expected.n_fallbacks


def test_rgba_float_chunks_and_the_inverse_map(client, fitted):
    """An alpha channel is copied as it is; the inverse map runs the same way."""
    source, run = fitted
    alpha = np.linspace(0, 1, source[..., 0].size).reshape(*source.shape[:2], 1)
    rgba = np.concatenate([source / 255.0, alpha], axis=2)
    expected = sketchot.map_image(run.result, rgba, inverse=True)
    mapped = sketchot.map_image(run.result, da.from_array(rgba, chunks=(25, 20, 2)), inverse=True)
    out = mapped.image.compute()
    np.testing.assert_allclose(out, expected.image, rtol=0, atol=map_tolerance(run))
    np.testing.assert_array_equal(out[..., 3], rgba[..., 3])


def test_bad_input_is_refused_on_the_client_by_name(client, fitted):
    source, run = fitted
    image = da.from_array(source, chunks=(20, 15, 3))
    with pytest.raises(ValueError, match=r"image must be a Dask array of shape \(height, width"):
        sketchot.map_image(run.result, image[..., :2])
    with pytest.raises(ValueError, match=r"dtype must be numpy\.float64 or numpy\.uint8"):
        sketchot.map_image(run.result, image, dtype=np.int32)
    with pytest.raises(TypeError, match="result must be a sketchot SinkhornResult"):
        sketchot.map_image("not a result", image)


@pytest.mark.parametrize("alpha", [False, True])
def test_a_dask_image_is_sampled_as_in_memory(client, alpha):
    """The same pixels as the in-memory draw with the same generator (row-major ranks over
    the visible pixels; alpha 0 left out), whatever the chunks; only the sample comes back."""
    image = photo_like(3, (53, 41))
    if alpha:
        opacity = np.where(np.random.default_rng(4).random((53, 41, 1)) < 0.3, 0, 255)
        image = np.concatenate([image, opacity.astype(np.uint8)], axis=2)
    image.setflags(write=False)  # a read-only array, as a memory map or a cache gives it
    expected = sketchot.sample_pixels(image, 400, rng=5)
    for chunks in ((10, 7), (53, 41), (10, 7)):  # the first chunking twice: the same bits
        got = sketchot.sample_pixels(da.from_array(image, chunks=(*chunks, -1)), 400, rng=5)
        np.testing.assert_array_equal(got.colors, expected.colors)
        np.testing.assert_array_equal(got.weights, expected.weights)
        assert got.n_pixels == expected.n_pixels
    dask_image = da.from_array(image, chunks=(10, 7, -1))
    with pytest.raises(ValueError, match=r"n_samples \(5000\) is larger than the number"):
        sketchot.sample_pixels(dask_image, 5000, rng=0)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("alpha", [False, True])
def test_a_weighted_sample_of_a_dask_image_is_the_in_memory_one(client, dtype, alpha):
    """``weighted=True``: each chunk counts its distinct colours on its worker, the counts
    are merged in a tree, and the draw over them is the in-memory one (the same colours and
    weights, bit for bit), whatever the chunks (more than MERGE_FAN_IN of them, so that the
    tree has two levels); transparent pixels are left out of the counts."""
    image = photo_like(3, (53, 41)).astype(dtype)
    if dtype == np.uint16:
        image = image * np.uint16(257) + np.uint16(1)  # 16-bit codes beyond 8-bit ones
    if alpha:
        opacity = np.where(np.random.default_rng(4).random((53, 41, 1)) < 0.3, 0, 7)
        image = np.concatenate([image, opacity.astype(dtype)], axis=2)
    image.setflags(write=False)
    for n_samples in (50, 10**5):  # a draw among the colours; every colour (the histogram)
        expected = sketchot.sample_pixels(image, n_samples, rng=5, weighted=True)
        for chunks in ((10, 7), (53, 41)):
            dask_image = da.from_array(image, chunks=(*chunks, -1))
            got = sketchot.sample_pixels(dask_image, n_samples, rng=5, weighted=True)
            np.testing.assert_array_equal(got.colors, expected.colors)
            np.testing.assert_array_equal(got.weights, expected.weights)
            assert got.n_pixels == expected.n_pixels
    assert expected.colors.shape[0] < 53 * 41  # repeated colours: counts above 1 merged


def test_a_weighted_sample_of_a_float_dask_image_is_refused_by_name(client):
    image = da.from_array(photo_like(3, (20, 20)) / 255.0, chunks=(10, 10, -1))
    with pytest.raises(NotImplementedError, match="weighted=True is not available for a Dask "
                       "image of float64 values"):  # fmt: skip
        sketchot.sample_pixels(image, 10, weighted=True)
    assert sketchot.sample_pixels(image, 10, rng=0).colors.shape == (10, 3)  # uniform: fine


def test_merged_counts_are_the_counts_of_the_concatenation():
    """The tree's merge (any split of the pixels into parts) gives np.unique's codes and
    counts of all of them, as integers."""
    from sketchot.distributed.images import _merge_counts

    rng = np.random.default_rng(7)
    codes = rng.integers(0, 50, size=1000).astype(np.uint64)
    cuts = np.sort(rng.choice(np.arange(1, 1000), size=6, replace=False))
    parts = [np.unique(part, return_counts=True) for part in np.split(codes, cuts)]
    merged_codes, merged_counts = _merge_counts(*parts, (codes[:0], np.zeros(0, np.int64)))
    expected_codes, expected_counts = np.unique(codes, return_counts=True)
    np.testing.assert_array_equal(merged_codes, expected_codes)
    np.testing.assert_array_equal(merged_counts, expected_counts)
    assert merged_counts.dtype == np.int64


@pytest.mark.parametrize("weighted", [False, True])
def test_transfer_colors_of_dask_images_is_the_in_memory_transfer(client, weighted):
    """Sampled on the workers, solved in memory, mapped on the workers: the in-memory
    transfer's sample, solve and image (compact: uint8), the recoloured image lazy."""
    source, target = photo_like(0, (61, 47)), photo_like(1, (40, 30))
    options = {"backend": "nystrom", "n_samples": 300, "rng": 0, "compact": True,
               "weighted": weighted}  # fmt: skip
    expected = transfer_colors(source, target, **options)
    run = transfer_colors(
        da.from_array(source, chunks=(20, 15, 3)), da.from_array(target, chunks=(25, 30, 3)),
        **options,
    )  # fmt: skip
    np.testing.assert_array_equal(run.source_sample.colors, expected.source_sample.colors)
    np.testing.assert_array_equal(run.source_sample.weights, expected.source_sample.weights)
    assert run.result.value == expected.result.value
    assert isinstance(run.image, da.Array)
    assert np.abs(run.image.compute().astype(int) - expected.image.astype(int)).max() <= 1


def test_a_worker_killed_while_mapping_loses_nothing(client):
    """A worker process dies while the chunks are mapped (after some of its tasks held
    results, the fitted result among them); Dask maps the lost chunks again from the graph
    and the image is the one of a run without the fault."""
    import os
    import signal
    import threading
    import time

    source, target = photo_like(5, (400, 300)), photo_like(6, (40, 30))
    run = transfer_colors(source, target, backend="nystrom", n_samples=300, rng=0)
    expected = sketchot.map_image(run.result, source).image
    image = da.from_array(source, chunks=(20, 25, 3))
    box = {}

    def compute():
        try:
            box["image"] = sketchot.map_image(run.result, image).image.compute()
        except BaseException as error:  # reported by the assertion below
            box["error"] = error

    pids = client.run(os.getpid)
    thread = threading.Thread(target=compute)
    thread.start()
    # kill a worker once it holds mapped chunks (of 240; Dask names them 'from-...', the
    # input's chunks 'array-...'; the run takes seconds)
    deadline, victim = time.monotonic() + 30, None
    while victim is None and time.monotonic() < deadline:
        holding = [w for w, keys in client.has_what().items()
                   if any("'from" in str(key) for key in keys)]  # fmt: skip
        victim = holding[0] if holding else None
        time.sleep(0.005)
    assert victim is not None
    held = len(client.has_what()[victim])
    os.kill(pids[victim], signal.SIGKILL)  # its nanny starts a new worker process
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in box, box.get("error")
    assert held > 0
    np.testing.assert_allclose(box["image"], expected, rtol=0, atol=1e-12)
