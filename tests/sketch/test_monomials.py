import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sketchot.sketch import monomial_count, monomial_features, stacked_monomial_features

finite = st.floats(-2.0, 2.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    d=st.integers(1, 5),
    degree=st.integers(0, 5),
    data=st.data(),
)
def test_inner_products_are_powers_of_the_dot_product(d, degree, data):
    """<phi_j(u), phi_j(v)> = (u . v)^j: the multinomial theorem, exact up to rounding."""
    U = data.draw(arrays(np.float64, (3, d), elements=finite))
    V = data.draw(arrays(np.float64, (2, d), elements=finite))
    got = monomial_features(U, degree) @ monomial_features(V, degree).T
    # rounding: C(d + j - 1, j) terms, each a product of about 2 j factors of size <= 2 sqrt(d)
    scale = (np.linalg.norm(U, axis=1)[:, None] * np.linalg.norm(V, axis=1)[None, :]) ** degree
    np.testing.assert_allclose(got, (U @ V.T) ** degree, rtol=0, atol=1e-12 * (1 + scale.max()))


@pytest.mark.parametrize(("d", "degree", "count"), [(3, 0, 1), (3, 1, 3), (3, 2, 6), (3, 5, 21)])
def test_count_is_the_number_of_columns(d, degree, count):
    assert monomial_count(d, degree) == count == math.comb(d + degree - 1, degree)
    assert monomial_features(np.ones((2, d)), degree).shape == (2, count)


def test_stacked_features_weight_each_degree_and_follow_float32():
    rng = np.random.default_rng(0)
    U, V = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    weights = np.array([2.0, -1.0, 0.5])
    left = stacked_monomial_features(U, 3, weights=weights)
    right = stacked_monomial_features(V, 3)
    t = U @ V.T
    np.testing.assert_allclose(left @ right.T, 2 * t - t**2 + 0.5 * t**3, rtol=1e-12, atol=1e-12)
    single = stacked_monomial_features(U, 3, dtype=np.float32)
    assert single.dtype == np.float32
    # float32 keeps about 7 digits of features of size <= (max |u_i|)^3 sqrt(6) ~ 10
    np.testing.assert_allclose(single, stacked_monomial_features(U, 3), rtol=1e-5, atol=1e-5)
    assert stacked_monomial_features(U, 0).shape == (4, 0)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="degree must be >= 0"):
        monomial_features(np.ones((2, 2)), -1)
    with pytest.raises(ValueError, match="U must be a 2-D array"):
        monomial_features(np.ones(3), 2)
    with pytest.raises(ValueError, match=r"weights must have shape \(2,\); got shape \(3,\)"):
        stacked_monomial_features(np.ones((2, 2)), 2, weights=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="n_features must be >= 1"):
        monomial_count(0, 2)
