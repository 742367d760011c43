"""The label-masked kernel (:class:`sketchot.da.LabelledKernel`) and its geometry against the
dense masked kernel ``K o A``: products, fused passes, rows, and the true-kernel
evaluations the solver certifies with, for any labels (-1 included)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchot import policy
from sketchot.da import LabelledGeometry, LabelledKernel
from sketchot.gibbs import GibbsGeometry
from sketchot.kernels import RatioStep, build_kernel

REG = 0.7


def dense_masked(Xs, Xt, ys, yt):
    K = np.exp(-((Xs[:, None, :] - Xt[None, :, :]) ** 2).sum(-1) / REG)
    allowed = (ys[:, None] == yt[None, :]) | (ys[:, None] == -1) | (yt[None, :] == -1)
    return K * allowed, allowed


labels = st.integers(min_value=-1, max_value=2)


@settings(max_examples=15, deadline=None)
@given(
    ys=st.lists(labels, min_size=1, max_size=12),
    yt=st.lists(labels, min_size=1, max_size=9),
    seed=st.integers(0, 2**16),
    backend=st.sampled_from(["exact", "nystrom"]),
)
def test_products_are_the_masked_kernels(ys, yt, seed, backend):
    """Exact base: the products equal ``(K o A) V`` to rounding; a low-rank base: equal to
    the dense product of its own masked entries (the mask adds no error of its own)."""
    rng = np.random.default_rng(seed)
    ys, yt = np.array(ys), np.array(yt)
    Xs, Xt = rng.random((ys.size, 2)), rng.random((yt.size, 2))
    params = {"n_landmarks": min(5, ys.size + yt.size)} if backend == "nystrom" else {}
    base = build_kernel(GibbsGeometry(Xs, Xt, REG), backend, rng=0, policy=policy, **params)
    kernel = LabelledKernel(base, LabelledGeometry(Xs, Xt, REG, "sqeuclidean", ys, yt))
    true, allowed = dense_masked(Xs, Xt, ys, yt)
    own = base.to_dense() * allowed  # the base's entries, masked
    V, U = rng.random((yt.size, 3)), rng.random((ys.size, 2))
    np.testing.assert_allclose(kernel.matmat(V), own @ V, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(kernel.rmatmat(U), own.T @ U, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(kernel.to_dense(), own, rtol=1e-12, atol=1e-15)
    if backend == "exact":
        np.testing.assert_allclose(own, true, rtol=1e-12, atol=1e-15)
    # the fused passes of K' = L R^T with L = K', R = I
    v, a = rng.random(yt.size) + 0.1, np.full(ys.size, 1.0 / ys.size)
    rows = kernel.fused_pass("rows", v, a)
    products = own @ v
    healthy = products > 0
    np.testing.assert_allclose(rows.products, products, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(rows.bad, ~healthy)  # a row with no allowed column is bad
    expected = np.where(healthy, a / np.where(healthy, products, 1.0), 0.0)
    np.testing.assert_allclose(rows.ratios, expected, rtol=1e-12)
    np.testing.assert_allclose(rows.projection, own.T @ expected, rtol=1e-12, atol=1e-15)
    b = np.full(yt.size, 1.0 / yt.size)
    cols = kernel.fused_pass("cols", rows.projection, b, step=RatioStep(0.5))
    assert cols.projection is cols.ratios
    np.testing.assert_array_equal(cols.products, rows.projection)
    np.testing.assert_allclose(
        kernel.project("rows", U[:2, 0], index=[0, ys.size - 1])
        if ys.size > 1
        else kernel.project("rows", U[:1, 0], index=[0]),
        own[[0, ys.size - 1] if ys.size > 1 else [0]].T @ U[: min(2, ys.size), 0],
        rtol=1e-12,
        atol=1e-15,
    )


@settings(max_examples=15, deadline=None)
@given(
    ys=st.lists(labels, min_size=1, max_size=10),
    yt=st.lists(labels, min_size=1, max_size=10),
    seed=st.integers(0, 2**16),
)
def test_geometry_evaluates_the_true_masked_kernel(ys, yt, seed):
    """What the solver certifies with: ``log(K' e^w)`` on rows and columns (``-inf`` for a
    row with no allowed pair), products, rows, log rows."""
    rng = np.random.default_rng(seed)
    ys, yt = np.array(ys), np.array(yt)
    Xs, Xt = rng.random((ys.size, 2)), rng.random((yt.size, 2))
    g = LabelledGeometry(Xs, Xt, REG, "sqeuclidean", ys, yt)
    true, _ = dense_masked(Xs, Xt, ys, yt)
    log_v, log_u = rng.normal(size=yt.size), rng.normal(size=ys.size)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(
            g.log_matvec(slice(None), log_v), np.log(true @ np.exp(log_v)), rtol=1e-12
        )
        index = np.arange(yt.size)[::2]
        np.testing.assert_allclose(
            g.log_matvec(index, log_u, transpose=True),
            np.log(true[:, index].T @ np.exp(log_u)),
            rtol=1e-12,
        )
        # -cost / reg: absolute rounding of the centred expansion near a zero cost
        np.testing.assert_allclose(g.log_block(slice(None)), np.log(true), rtol=1e-12, atol=1e-13)
    V = rng.random((yt.size, 2))
    np.testing.assert_allclose(g.matmat(slice(None), V), true @ V, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(g.block(slice(None)), true, rtol=1e-12, atol=1e-15)
    # the clouds' cost: the solver multiplies it by kernel entries, 0 on forbidden pairs
    plain = GibbsGeometry(Xs, Xt, REG).cost_block(slice(None))
    np.testing.assert_array_equal(g.cost_block(slice(None)), plain)


def test_a_labelled_geometry_is_not_sampled():
    g = LabelledGeometry(np.zeros((2, 1)), np.ones((2, 1)), 1.0, "sqeuclidean",
                         np.array([0, 1]), np.array([1, -1]))  # fmt: skip
    with pytest.raises(NotImplementedError, match="pass a backend"):
        g.sample(1, np.random.default_rng(0))
