"""Masked arrays: numpy.asarray drops the mask, so every public entry point refuses one with
masked entries, naming the argument and saying how to proceed (issue 19)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.da import SketchSinkhornTransport
from sketchot.sketch import GaussianPolySketch, PolyTensorSketch


def _clouds(rng: np.random.Generator, n: int, m: int, d: int):
    return rng.random((n, d)), rng.random((m, d)), np.full(n, 1.0 / n), np.full(m, 1.0 / m)


# (entry point, argument it receives the masked array as, which input is masked)
ENTRY_POINTS = {
    "sinkhorn X": (lambda X, Y, a, b: sketchot.sinkhorn(a, b, X, Y, 1.0, "exact"), "X"),
    "sinkhorn Y": (lambda X, Y, a, b: sketchot.sinkhorn(a, b, X, Y, 1.0, "exact"), "Y"),
    "sinkhorn a": (lambda X, Y, a, b: sketchot.sinkhorn(a, b, X, Y, 1.0, "exact"), "a"),
    "sinkhorn b": (lambda X, Y, a, b: sketchot.sinkhorn(a, b, X, Y, 1.0, "exact"), "b"),
    "sinkhorn2 a": (lambda X, Y, a, b: sketchot.sinkhorn2(a, b, X, Y, 1.0, "exact"), "a"),
    "make_kernel X": (lambda X, Y, a, b: sketchot.make_kernel(X, Y, 1.0, "nystrom"), "X"),
    "make_kernel Y": (lambda X, Y, a, b: sketchot.make_kernel(X, Y, 1.0, "rff"), "Y"),
    "transport Xs": (lambda X, Y, a, b: SketchSinkhornTransport().fit(Xs=X, Xt=Y), "Xs"),
    "transport Xt": (lambda X, Y, a, b: SketchSinkhornTransport().fit(Xs=X, Xt=Y), "Xt"),
    "PolyTensorSketch U": (lambda X, Y, a, b: PolyTensorSketch().fit(X, Y), "U"),
    "GaussianPolySketch Y": (lambda X, Y, a, b: GaussianPolySketch().fit(X, Y), "Y"),
}

# which positional input (X, Y, a, b) each argument name is
POSITION = {"X": 0, "Xs": 0, "U": 0, "Y": 1, "Xt": 1, "a": 2, "b": 3}


@settings(max_examples=40, deadline=None)
@given(
    entry=st.sampled_from(sorted(ENTRY_POINTS)),
    n=st.integers(2, 12),
    m=st.integers(2, 12),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_masked_entries_are_refused_everywhere(entry, n, m, d, seed, data):
    rng = np.random.default_rng(seed)
    call, name = ENTRY_POINTS[entry]
    inputs = list(_clouds(rng, n, m, d))
    target = inputs[POSITION[name]]
    # any non-empty set of masked entries; the data under the mask are plausible values
    flat = data.draw(
        st.lists(st.booleans(), min_size=target.size, max_size=target.size).filter(any)
    )
    inputs[POSITION[name]] = np.ma.masked_array(target, mask=np.reshape(flat, target.shape))
    with pytest.raises(TypeError, match=f"^{name} is a numpy masked array with {sum(flat)} "):
        call(*inputs)


def test_the_error_says_how_to_proceed():
    rng = np.random.default_rng(0)
    X, Y, a, b = _clouds(rng, 5, 4, 2)
    masked_X = np.ma.masked_array(X, mask=[[1, 0]] + [[0, 0]] * 4)
    with pytest.raises(TypeError, match=r"drop the rows with masked entries .* zero weight"):
        sketchot.sinkhorn(a, b, masked_X, Y, 1.0)
    with pytest.raises(TypeError, match=r"pass zero weights where it is masked \(a.filled\(0\)\)"):
        sketchot.sinkhorn(np.ma.masked_array(a, mask=[1, 0, 0, 0, 0]), b, X, Y, 1.0)
    # what the message advises gives the solve on the unmasked points
    kept = ~masked_X.mask.any(axis=1)
    dropped = sketchot.sinkhorn(a[kept] / a[kept].sum(), b, X[kept], Y, 1.0, "exact")
    zeroed = sketchot.sinkhorn(np.where(kept, a, 0) / a[kept].sum(), b, X, Y, 1.0, "exact")
    # the same problem: zero-weight rows carry no mass (rtol: the solver's tol, 1e-9)
    np.testing.assert_allclose(zeroed.plan[kept], dropped.plan, rtol=1e-7, atol=1e-12)


def test_masked_arrays_without_masked_entries_are_plain_data():
    rng = np.random.default_rng(1)
    X, Y, a, b = _clouds(rng, 6, 5, 3)
    plain = sketchot.sinkhorn2(a, b, X, Y, 1.0, "exact")
    masked = sketchot.sinkhorn2(
        np.ma.masked_array(a), b, np.ma.masked_array(X, mask=False), Y, 1.0, "exact"
    )
    assert masked == plain


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_masked_images_are_refused_by_the_colour_functions(seed, data):
    rng = np.random.default_rng(seed)
    image = rng.random((4, 5, 3))
    flat = data.draw(st.lists(st.booleans(), min_size=image.size, max_size=image.size).filter(any))
    masked = np.ma.masked_array(image, mask=np.reshape(flat, image.shape))
    for call in (
        lambda: sketchot.sample_pixels(masked, 3, rng=0, name="source"),
        lambda: sketchot.load_image(masked, name="source"),
        lambda: sketchot.color_transfer(masked, image, n_samples=3, rng=0),
    ):
        with pytest.raises(
            TypeError, match=r"^source is a numpy masked array .* fully transparent instead"
        ):
            call()


# the batches: (entry, its names for the masked input, in (X, Y, a, b) order)
BATCH_ENTRIES = {
    "sinkhorn_batch": (
        lambda X, Y, a, b: sketchot.sinkhorn_batch(X, Y, a, b, reg=1.0),
        ("X", "Y", "a", "b"),
    ),
    "solve_sample_batch": (
        lambda X, Y, a, b: sketchot.solve_sample_batch(X, Y, 1.0, a, b),
        ("X_a", "X_b", "a", "b"),
    ),
    "pairwise_divergences": (
        lambda X, Y, a, b: sketchot.pairwise_divergences(X, a, reg=1.0),
        ("clouds", None, "weights", None),
    ),
}


@settings(max_examples=40, deadline=None)
@given(
    entry=st.sampled_from(sorted(BATCH_ENTRIES)),
    position=st.integers(0, 3),
    B=st.integers(1, 3),
    n=st.integers(2, 6),
    d=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_masked_entries_are_refused_by_the_batches(entry, position, B, n, d, seed, data):
    """Issue 42: sinkhorn_batch, solve_sample_batch and pairwise_divergences read the values
    under the mask (numpy.asarray drops it)."""
    call, names = BATCH_ENTRIES[entry]
    if names[position] is None:  # pairwise_divergences has one stack of clouds
        position -= 1
    rng = np.random.default_rng(seed)
    inputs = [rng.random((B, n, d)), rng.random((B, n, d)), np.full((B, n), 1 / n)]
    inputs.append(inputs[2].copy())
    target = inputs[position]
    flat = data.draw(
        st.lists(st.booleans(), min_size=target.size, max_size=target.size).filter(any)
    )
    inputs[position] = np.ma.masked_array(target, mask=np.reshape(flat, target.shape))
    name = names[position]
    with pytest.raises(TypeError, match=f"^{name} is a numpy masked array with {sum(flat)} "):
        call(*inputs)
