import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sketchot.sketch import TensorSketch


def brute_force_tensor_sketch(u, sketch):
    """The definition: sum over (i_1..i_k) with H = sum h_j(i_j) mod m of prod s_j(i_j) u_{i_j}."""
    m = sketch.sketch_dim
    out = np.zeros(m)
    factors = sketch.count_sketches
    for indices in itertools.product(range(u.size), repeat=len(factors)):
        bucket = sum(cs.hashes[i] for cs, i in zip(factors, indices, strict=True)) % m
        sign = np.prod([cs.signs[i] for cs, i in zip(factors, indices, strict=True)])
        out[bucket] += sign * np.prod(u[list(indices)])
    return out


@pytest.mark.parametrize(("degree", "m"), [(1, 4), (2, 5), (3, 4), (3, 7)])
def test_matches_definition(degree, m):
    rng = np.random.default_rng(degree * 10 + m)
    U = rng.standard_normal((3, 4))
    sketch = TensorSketch(4, degree, m, rng=rng)
    expected = np.array([brute_force_tensor_sketch(u, sketch) for u in U])
    np.testing.assert_allclose(sketch.transform(U), expected, atol=1e-12)


def test_equals_full_fft_computation():
    """scikit-learn's PolynomialCountSketch style: real part of ifft(product of full FFTs)."""
    rng = np.random.default_rng(1)
    U = rng.standard_normal((6, 9))
    sketch = TensorSketch(9, 3, 11, rng=2)
    counts = [cs.transform(U) for cs in sketch.count_sketches]
    full = np.real(np.fft.ifft(np.prod([np.fft.fft(c, axis=1) for c in counts], axis=0), axis=1))
    np.testing.assert_allclose(sketch.transform(U), full, atol=1e-12)


def test_all_degrees_is_the_recursion_over_prefixes():
    """Degree j of the recursion equals the TensorSketch built from the first j CountSketches."""
    rng = np.random.default_rng(3)
    U = rng.standard_normal((8, 5))
    sketch = TensorSketch(5, 4, 6, rng=4)
    every = sketch.transform_all_degrees(U)
    for j in range(1, 5):
        prefix = TensorSketch(5, j, 6, rng=0)
        prefix.count_sketches = sketch.count_sketches[:j]
        prefix._stacked = sketch._stacked[:, : j * 6]
        np.testing.assert_allclose(every[:, j - 1], prefix.transform(U), atol=1e-12)


def test_degree_zero_is_constant_one():
    out = TensorSketch(3, 0, 5, rng=0).transform(np.ones((4, 3)))
    assert out.shape == (4, 1) and np.all(out == 1.0)


@pytest.mark.parametrize("degree", [2, 3])
def test_inner_product_is_unbiased(degree):
    rng = np.random.default_rng(5)
    u, v = rng.standard_normal(4) / 2, rng.standard_normal(4) / 2
    estimates = []
    for seed in np.random.SeedSequence(degree).spawn(3000):
        tu, tv = TensorSketch(4, degree, 8, rng=seed).transform(np.vstack([u, v]))
        estimates.append(tu @ tv)
    estimates = np.array(estimates)
    # E[<T(u), T(v)>] = <u, v>^k; 5 Monte-Carlo standard errors (false alarm ~6e-7).
    standard_error = estimates.std(ddof=1) / np.sqrt(estimates.size)
    assert abs(estimates.mean() - (u @ v) ** degree) < 5 * standard_error


@settings(max_examples=40, deadline=None)
@given(
    u=arrays(np.float64, 5, elements=st.floats(-10, 10)),
    scale=st.floats(-3, 3),
    degree=st.integers(1, 4),
)
def test_homogeneous_of_degree_k(u, scale, degree):
    """T^(k)(c u) = c^k T^(k)(u): the sketch is a k-linear form of u."""
    sketch = TensorSketch(5, degree, 7, rng=degree)
    np.testing.assert_allclose(
        sketch.transform((scale * u)[None]),
        scale**degree * sketch.transform(u[None]),
        rtol=1e-9,
        atol=1e-9 * (1 + np.abs(u).max() ** degree) * (1 + abs(scale) ** degree),
    )


def test_bad_parameters():
    with pytest.raises(ValueError, match="degree must be >= 0"):
        TensorSketch(3, -1, 5)
    with pytest.raises(ValueError, match="sketch_dim must be >= 1"):
        TensorSketch(3, 2, 0)
    with pytest.raises(ValueError, match="U must have 3 columns"):
        TensorSketch(3, 2, 5, rng=0).transform(np.ones((2, 4)))
