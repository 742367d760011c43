import numpy as np
import pytest
import scipy.sparse as sp

from sketchot.sketch import CountSketch


def brute_force_count_sketch(u, hashes, signs, m):
    """The definition: C(u)_j = sum_{i : h(i) = j} s(i) u_i."""
    out = np.zeros(m)
    for i, value in enumerate(u):
        out[hashes[i]] += signs[i] * value
    return out


def test_matches_definition_on_tiny_input():
    rng = np.random.default_rng(0)
    U = rng.standard_normal((5, 7))
    sketch = CountSketch(7, 4, rng=1)
    expected = np.array([brute_force_count_sketch(u, sketch.hashes, sketch.signs, 4) for u in U])
    np.testing.assert_allclose(sketch.transform(U), expected, rtol=0, atol=1e-14)


def test_sparse_input_equals_dense():
    rng = np.random.default_rng(1)
    U = rng.standard_normal((30, 50)) * (rng.random((30, 50)) < 0.1)
    sketch = CountSketch(50, 8, rng=2)
    np.testing.assert_allclose(sketch.transform(sp.csr_matrix(U)), sketch.transform(U), atol=1e-14)


def test_hash_and_sign_ranges():
    sketch = CountSketch(1000, 13, rng=3)
    assert sketch.hashes.min() >= 0 and sketch.hashes.max() < 13
    assert set(np.unique(sketch.signs)) == {-1.0, 1.0}


def test_inner_product_is_unbiased():
    rng = np.random.default_rng(4)
    u, v = rng.standard_normal(6), rng.standard_normal(6)
    seeds = np.random.SeedSequence(5).spawn(4000)
    estimates = []
    for seed in seeds:
        sketch = CountSketch(6, 3, rng=seed)
        cu, cv = sketch.transform(np.vstack([u, v]))
        estimates.append(cu @ cv)
    estimates = np.array(estimates)
    # 5 standard errors of the Monte-Carlo mean: fails with probability ~6e-7 if unbiased.
    standard_error = estimates.std(ddof=1) / np.sqrt(estimates.size)
    assert abs(estimates.mean() - u @ v) < 5 * standard_error


def test_same_seed_is_bit_identical_and_other_seeds_differ():
    U = np.random.default_rng(6).standard_normal((10, 20))
    a = CountSketch(20, 5, rng=7).transform(U)
    b = CountSketch(20, 5, rng=7).transform(U)
    c = CountSketch(20, 5, rng=8).transform(U)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 5), "input_dim must be >= 1"),
        ((5, 0), "sketch_dim must be >= 1"),
        ((2.5, 5), "input_dim must be an integer"),
    ],
)
def test_bad_parameters(args, message):
    with pytest.raises((ValueError, TypeError), match=message):
        CountSketch(*args)


def test_bad_input():
    sketch = CountSketch(4, 3, rng=0)
    with pytest.raises(ValueError, match="U must have 4 columns"):
        sketch.transform(np.ones((2, 5)))
    with pytest.raises(ValueError, match="finite"):
        sketch.transform(np.array([[1.0, np.nan, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="2-D"):
        sketch.transform(np.ones(4))
