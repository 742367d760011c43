"""sketchot.pairwise_divergences (sketchot/batch.py): the divergence matrix of many small
clouds on the batch solver (the batch solver itself: tests/solver/test_batch.py)."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
import sketchot.batch
from sketchot import AccuracyWarning


def clouds(seed, K=5, n=30, d=2):
    rng = np.random.default_rng(seed)
    return rng.random((K, n, d)) * rng.uniform(0.5, 1.5, (K, 1, 1)) + rng.random((K, 1, d))


def test_entries_are_sinkhorn_divergences():
    X = clouds(0, K=4)
    rng = np.random.default_rng(1)
    w = rng.random(X.shape[:2]) + 0.1
    w /= w.sum(axis=1, keepdims=True)
    res = sketchot.pairwise_divergences(X, w, reg=0.05, tol=1e-12, max_iter=5000)
    assert res.converged.all() and res.accuracy_met.all()
    for i in range(4):
        for j in range(i + 1, 4):
            ref = sketchot.sinkhorn_divergence(X[i], X[j], w[i], w[j], reg=0.05,
                                               backend="exact", tol=1e-12)  # fmt: skip
            # both converged to POT's 1e-12 on exact kernels: rounding-level agreement
            assert res.matrix[i, j] == pytest.approx(ref.value, rel=1e-8, abs=1e-12)
            assert res.value_error[i, j] < 1e-9
    np.testing.assert_array_equal(res.matrix, res.matrix.T)
    assert np.all(np.diag(res.matrix) == 0) and np.all(res.matrix >= 0)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_permuting_the_clouds_permutes_the_matrix(seed):
    X = clouds(seed % 1000, K=4, n=12)
    order = np.random.default_rng(seed).permutation(4)
    res = sketchot.pairwise_divergences(X, reg=0.1, tol=1e-11)
    permuted = sketchot.pairwise_divergences(X[order], reg=0.1, tol=1e-11)
    # each entry's problems are solved on their own (per-pair stopping): tol-level changes
    np.testing.assert_allclose(permuted.matrix, res.matrix[np.ix_(order, order)], atol=1e-9)


def test_identical_clouds_are_at_zero_and_calls_of_few_pairs_change_nothing(monkeypatch):
    X = clouds(2, K=5)
    X[3] = X[1]
    whole = sketchot.pairwise_divergences(X, reg=0.05, tol=1e-12)
    assert whole.matrix[1, 3] == 0.0 and whole.matrix[3, 1] == 0.0
    others = np.triu(np.ones((5, 5), dtype=bool), 1)
    others[1, 3] = False
    assert np.all(whole.matrix[others] > 0)
    monkeypatch.setattr(sketchot.batch, "PAIRS_PER_CALL", 3)
    split = sketchot.pairwise_divergences(X, reg=0.05, tol=1e-12)
    # a pair's iterates are its own; where it stops depends on its round (1e-12 residuals)
    np.testing.assert_allclose(split.matrix, whole.matrix, rtol=1e-9, atol=1e-12)


def test_negative_entries_beyond_their_error_warn_with_advice_that_works(monkeypatch):
    """Close clouds after 1 iteration: values far from converged, some entries negative.
    With the error estimate forced to 0 (so that no entry can be clipped) the warning names
    max_iter, and raising it as advised removes every negative entry."""
    rng = np.random.default_rng(0)
    X = rng.random((1, 30, 2)) + 0.01 * rng.standard_normal((6, 30, 2))
    monkeypatch.setattr(sketchot.batch, "batch_value_errors", lambda r: np.zeros(len(r)))
    with pytest.warns(AccuracyWarning, match="stopped at max_iter.*raise max_iter"):
        early = sketchot.pairwise_divergences(X, reg=0.1, max_iter=1)
    assert (early.matrix < 0).any() and not early.converged.all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccuracyWarning)
        later = sketchot.pairwise_divergences(X, reg=0.1, max_iter=2000, tol=1e-12)
    assert later.converged.all() and np.all(later.matrix >= 0)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (np.ones((5, 30)), None),
        (np.r_[np.ones((4, 30)), 2 * np.ones((1, 30))], "same mass.*cloud 4"),
        (np.ones((5, 29)), "weights must be weights of shape"),
    ],
)
def test_validation_names_the_argument(weights, message):
    X = clouds(4)
    if message is None:
        assert sketchot.pairwise_divergences(X, weights, reg=0.1).matrix.shape == (5, 5)
        return
    with pytest.raises(ValueError, match=message):
        sketchot.pairwise_divergences(X, weights, reg=0.1)
    with pytest.raises(ValueError, match="clouds must be a non-empty stack"):
        sketchot.pairwise_divergences(X[0], reg=0.1)


def test_tensors_in_tensors_out():
    torch = pytest.importorskip("torch")
    X = clouds(5, K=3)
    res = sketchot.pairwise_divergences(torch.from_numpy(X), reg=0.1)
    assert isinstance(res.matrix, torch.Tensor) and res.matrix.shape == (3, 3)
    np.testing.assert_allclose(
        res.matrix.numpy(), sketchot.pairwise_divergences(X, reg=0.1).matrix, rtol=1e-12
    )
