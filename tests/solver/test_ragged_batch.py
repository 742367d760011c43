"""Ragged batches: clouds of different sizes in one :func:`sketchot.sinkhorn_batch` call
(GeomLoss users batch ragged problems: its issues 26, 33 and 38), padded with points of zero
weight. Each pair must solve its own problem: the same values as a padded stack built by hand
(bit for bit: it is the same computation) and as the pair solved alone."""

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot

REG = 0.05


def ragged(seed, sizes_x=(30, 50, 12), sizes_y=(40, 25, 60), d=2):
    rng = np.random.default_rng(seed)
    X = [rng.random((n, d)) for n in sizes_x]
    Y = [rng.random((m, d)) + 0.3 for m in sizes_y]
    return X, Y


def pad_by_hand(clouds):
    size = max(len(c) for c in clouds)
    stack = np.stack([np.concatenate([c, np.repeat(c[:1], size - len(c), axis=0)]) for c in clouds])
    weights = np.stack(
        [np.r_[np.full(len(c), 1 / len(c)), np.zeros(size - len(c))] for c in clouds]
    )
    return stack, weights


def test_ragged_batch_is_the_padded_stack_with_zero_weights():
    X, Y = ragged(0)
    res = sketchot.sinkhorn_batch(X, Y, reg=REG)
    (Xp, a), (Yp, b) = pad_by_hand(X), pad_by_hand(Y)
    padded = sketchot.sinkhorn_batch(Xp, Yp, a, b, reg=REG)
    np.testing.assert_array_equal(res.value, padded.value)
    np.testing.assert_array_equal(res.potentials[0], padded.potentials[0])
    assert res.sizes.tolist() == [[30, 40], [50, 25], [12, 60]]
    assert padded.sizes is None
    assert any("padded to 50 x 60" in note for note in res.notes)


def test_each_pair_of_a_ragged_batch_solves_its_own_problem():
    X, Y = ragged(1)
    res = sketchot.sinkhorn_batch(X, Y, reg=REG, tol=1e-9)
    assert res.converged.all() and res.accuracy_met.all()
    for k, (Xk, Yk) in enumerate(zip(X, Y, strict=True)):
        n, m = len(Xk), len(Yk)
        # the padding carries nothing: no mass, -inf log-scalings
        assert np.all(res.a[k, n:] == 0) and np.all(res.marginals[0][k, n:] == 0)
        assert np.all(np.isneginf(res.potentials[0][k, n:]))
        assert np.all(np.isneginf(res.potentials[1][k, m:]))
        alone = sketchot.sinkhorn(None, None, Xk, Yk, reg=REG, backend="exact", tol=1e-9)
        # both stop at a 1e-9 marginal residual: values agree to about that
        assert res.value[k] == pytest.approx(alone.value, abs=1e-8)
        # POT on the same pair, its log-domain solver run to 1e-12 (its own test tolerance
        # for sinkhorn2 against emd-like references is 1e-5: ours is tighter)
        M = ot.dist(Xk, Yk)
        pot = ot.sinkhorn2(np.full(n, 1 / n), np.full(m, 1 / m), M, REG, method="sinkhorn_log",
                           stopThr=1e-12, numItermax=20000)  # fmt: skip
        assert res.value_linear[k] == pytest.approx(float(pot), abs=1e-7)


@settings(max_examples=10, deadline=None)
@given(
    st.lists(st.integers(1, 25), min_size=2, max_size=5),
    st.integers(0, 2**16),
)
def test_ragged_pairs_do_not_depend_on_their_neighbours(sizes, seed):
    """A pair's value in a ragged batch is its value in a batch of itself alone (padding
    to another size changes only the rounding of the sums)."""
    X, Y = ragged(seed, sizes, sizes[::-1])
    res = sketchot.sinkhorn_batch(X, Y, reg=0.1, tol=1e-10)
    for k in (0, len(sizes) - 1):
        alone = sketchot.sinkhorn_batch(X[k][None], Y[k][None], reg=0.1, tol=1e-10)
        assert res.value[k] == pytest.approx(alone.value[0], rel=1e-9, abs=1e-12)


def test_ragged_weights_as_sequences_or_padded_rows():
    X, Y = ragged(2)
    rng = np.random.default_rng(2)
    a = [rng.random(len(c)) + 0.1 for c in X]
    a = [w / w.sum() for w in a]
    res = sketchot.sinkhorn_batch(X, Y, a, reg=REG)
    padded = np.zeros((3, 50))
    for k, w in enumerate(a):
        padded[k, : len(w)] = w
    again = sketchot.sinkhorn_batch(X, Y, padded, reg=REG)
    np.testing.assert_array_equal(res.value, again.value)
    np.testing.assert_array_equal(res.a, padded)


def test_ragged_batch_errors_name_the_argument():
    X, Y = ragged(3)
    with pytest.raises(
        ValueError, match=r"^a\[1\] must have one weight per point of X\[1\] \(50\)"
    ):
        sketchot.sinkhorn_batch(X, Y, [np.ones(30) / 30, np.ones(30) / 30, np.ones(12) / 12])
    bad = np.full((3, 50), 1 / 50)
    with pytest.raises(ValueError, match=r"^a must be zero past each cloud's size .* row 0"):
        sketchot.sinkhorn_batch(X, Y, bad, reg=REG)
    with pytest.raises(ValueError, match=r"^Y\[2\] must have 2 columns"):
        sketchot.sinkhorn_batch(X, [Y[0], Y[1], np.ones((4, 3))], reg=REG)
    with pytest.raises(ValueError, match=r"^X\[1\] must contain only finite values"):
        sketchot.sinkhorn_batch([X[0], np.full((3, 2), np.nan), X[2]], Y, reg=REG)
    with pytest.raises(ValueError, match=r"must hold the same number of pairs B"):
        sketchot.sinkhorn_batch(X[:2], Y, reg=REG)


def test_pairwise_divergences_of_clouds_of_different_sizes():
    X, _ = ragged(4, sizes_x=(20, 35, 27, 35))
    res = sketchot.pairwise_divergences(X, reg=0.1, tol=1e-10)
    assert res.accuracy_met.all()
    full = sketchot.sinkhorn_divergence(X[0], X[1], reg=0.1, backend="exact", tol=1e-10)
    # the same divergence (exact kernels on both sides, 1e-10 residuals)
    assert res.matrix[0, 1] == pytest.approx(float(full.value), abs=1e-7)
