"""The absorbed exact kernel ``exp(alpha_i + beta_j - c(x_i, y_j) / reg)``: its entries,
built from one product of augmented factors (squared Euclidean) or entry by entry (another
cost, infinite offsets), against the formula evaluated directly."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from sketchot.gibbs import GibbsGeometry
from sketchot.kernels import ExactKernel
from sketchot.kernels.exact import LOG_FLOOR


def absorbed_entries(metric: str, alpha, beta, reg=0.02, n=60, m=45, seed=3):
    rng = np.random.default_rng(seed)
    X, Y = 3.0 * rng.random((n, 2)) + 5.0, 3.0 * rng.random((m, 2)) + 4.0  # off-centre
    kernel = ExactKernel(GibbsGeometry(X, Y, reg, metric), max_dense_bytes=1 << 30)
    built = kernel.absorbed(alpha(n, rng), beta(m, rng))
    cost = cdist(X, Y, metric)
    exponent = built.alpha[:, None] + built.beta[None, :] - cost / reg
    return built, np.exp(np.maximum(exponent, LOG_FLOOR[np.dtype(np.float64)]))


def offsets(scale):
    return lambda size, rng: scale * rng.normal(size=size)


def with_zero_weights(size, rng):
    out = rng.normal(size=size)
    out[::7] = -np.inf
    return out


@pytest.mark.parametrize(
    ("metric", "alpha", "stored_by_factors"),
    [
        ("sqeuclidean", offsets(1.0), True),
        ("sqeuclidean", offsets(100.0), True),  # offsets of the size of cost / reg
        ("sqeuclidean", with_zero_weights, False),
        ("euclidean", offsets(1.0), False),
    ],
)
def test_absorbed_entries_equal_the_formula(metric, alpha, stored_by_factors):
    """Relative 1e-11: the exponents are sums of terms up to ``|x|^2 / reg`` ~ 1e3 here
    (centred points 3-4 apart) and offsets up to a few hundred, rounded to about 1e-13
    absolute."""
    built, expected = absorbed_entries(metric, alpha, offsets(1.0))
    assert (built._factors is not None) == stored_by_factors
    stored = built.matmat(np.eye(built.shape[1]))
    np.testing.assert_allclose(stored, expected, rtol=1e-11, atol=0)


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean"])
def test_float32_absorbed_entries_are_the_rounded_formula(metric):
    """A float32 kernel stores the float64 entries rounded once: relative 2^-24 (6e-8) of the
    formula, 1e-7 allowed."""
    rng = np.random.default_rng(5)
    X, Y = rng.random((40, 2)), rng.random((30, 2))
    kernel = ExactKernel(GibbsGeometry(X, Y, 0.05, metric), dtype=np.float32)
    built = kernel.absorbed(rng.normal(size=40), rng.normal(size=30))
    assert built.is_dense and built._dense.dtype == np.float32
    exponent = built.alpha[:, None] + built.beta[None, :] - cdist(X, Y, metric) / 0.05
    np.testing.assert_allclose(built._dense, np.exp(exponent), rtol=1e-7, atol=0)
