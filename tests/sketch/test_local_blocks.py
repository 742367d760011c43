"""The block-local expansion of clouds split in blocks of whole clusters
(:mod:`sketchot.sketch.local.blocks`): sums of block products against dense log-sum-exps,
and the truncation's reference taken from every block."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from sketchot.sketch.local import blocks as blocks_module
from sketchot.sketch.local.blocks import BlockExpansion, ClusterBounds
from sketchot.sketch.local.truncation import _every_pair_skipped, _kept_pairs


def _blocks(expansion, points, labels, centers, n_blocks):
    """``[(rows, block)]``: the clusters cut by their first coordinate into ``n_blocks``."""
    order = np.argsort(centers[:, 0])
    out = []
    for ids in np.array_split(order, n_blocks):
        ids = np.sort(ids)
        rows = np.flatnonzero(np.isin(labels, ids))
        out.append(
            (rows, expansion.block(points[rows], np.searchsorted(ids, labels[rows]), centers[ids]))
        )
    return out


def _summed(expansion, outs, inns, log_w, truncate, means, n, lower=True):
    """``(log sums, means)`` of every output row over every input block."""
    bounds = ClusterBounds.concat([expansion.bounds(b, log_w[rows]) for rows, b in inns])
    logs, sums = np.full(n, np.nan), np.full((n, expansion.d), np.nan)
    for rows, out in outs:
        below = expansion.lower_bounds(out, bounds) if lower else None
        total = None
        for in_rows, inn in inns:
            term = expansion.product(
                out, inn, log_w[in_rows], means=means, truncate=truncate / len(inns), lower=below
            )
            total = term if total is None else BlockExpansion.combine(total, term)
        scale, Z = total
        logs[rows] = scale + np.log(Z[:, 0])
        if means:
            sums[rows] = Z[:, 1:] / Z[:, :1]
    return logs, sums


@pytest.fixture(scope="module", params=[(0.01, 2.0), (0.003, 4.0)], ids=["reg1e-2", "reg3e-3"])
def problem(request):
    reg, tau = request.param
    rng = np.random.default_rng(20261129)
    # clusters of both kinds: expanded ones and small ones handled exactly
    X, Y = rng.random((3000, 3)), rng.random((2500, 3)) * 0.8
    center = (X.sum(0) + Y.sum(0)) / 5500
    Xc, Yc = X - center, Y - center
    expansion = BlockExpansion(reg, 3, tau=tau, rtol=1e-6)
    lx, cx = expansion.cover(Xc, 0)
    ly, cy = expansion.cover(Yc, 1)
    outs = _blocks(expansion, Xc, lx, cx, 3)
    inns = _blocks(expansion, Yc, ly, cy, 4)
    log_w = rng.normal(size=2500) * 30.0  # weights over ~e^100
    log_w[[5, 77]] = -np.inf  # zero weights
    logits = log_w[None, :] - ((Xc[:, None, :] - Yc[None]) ** 2).sum(-1) / reg
    true = logsumexp(logits, axis=1)
    means = np.exp(logits - true[:, None]) @ Yc
    bound = expansion.entry_error_bound(float(((Xc[:, None] - Yc[None]) ** 2).sum(-1).max()) / reg)
    return expansion, outs, inns, log_w, true, means, bound


@pytest.mark.parametrize("truncate", [0.0, 1e-6])
def test_sums_over_blocks_are_the_kernel_to_its_certified_entry_error(problem, truncate):
    expansion, outs, inns, log_w, true, means, bound = problem
    logs, sums = _summed(expansion, outs, inns, log_w, truncate, True, true.size)
    # every entry within (1 +- bound), and a truncated row misses at most `truncate` of its sum
    assert np.max(np.abs(np.expm1(logs - true))) <= bound + truncate
    # the means: weighted averages of entries each within the bound (first order, 2x),
    # times the coordinates' reach (< 1 here), plus the offsets' fit over the radius
    assert np.max(np.abs(sums - means)) <= 50 * (bound + truncate)


def test_the_reference_from_every_block_skips_what_the_whole_product_skips(problem):
    """With the row bounds of every block the truncation skips far pairs; without them a
    block's own bound would keep them. A bound far above the rows' sums skips every pair,
    which shows it is the one read."""
    expansion, outs, inns, log_w, true, _, _ = problem
    _rows, out = outs[0]
    in_rows, inn = inns[0]
    _scale, Z = expansion.product(
        out, inn, log_w[in_rows], truncate=1e-3, lower=np.full(out.n_clusters, 1e4)
    )
    assert np.all(Z[:, 0] == 0.0)
    logs, _ = _summed(expansion, outs, inns, log_w, 1e-6, False, true.size)
    assert np.all(np.isfinite(logs))


def test_bounds_concatenate_in_order(problem):
    expansion, _, inns, log_w, *_ = problem
    parts = [expansion.bounds(b, log_w[rows]) for rows, b in inns]
    joined = ClusterBounds.concat(parts)
    assert joined.n_clusters == sum(b.n_clusters for _, b in inns)
    np.testing.assert_array_equal(joined.center[: parts[0].n_clusters], parts[0].center)


def test_bad_input_is_refused_by_name(problem):
    expansion, outs, inns, log_w, *_ = problem
    _rows, out = outs[0]
    in_rows, inn = inns[0]
    with pytest.raises(ValueError, match="log_w must have shape"):
        expansion.product(out, inn, log_w)
    with pytest.raises(ValueError, match="lower must have shape"):
        expansion.product(out, inn, log_w[in_rows], truncate=1e-6, lower=np.zeros(3))
    with pytest.raises(ValueError, match="labels must be"):
        expansion.block(np.zeros((4, 3)), np.array([0, 1, 2, 7]), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="tau must be <= 4"):
        BlockExpansion(0.01, 3, tau=5.0)
    with pytest.raises(ValueError, match="d = 9"):
        BlockExpansion(0.01, 9)


def test_a_block_whose_pairs_are_all_skipped_adds_nothing():
    """Weights far from 1 (a warm start's potentials, here about ``-2000``) and clusters
    large enough to be expanded: a far input block skips every pair of some rows of a group
    whose other rows it keeps; its term must add nothing to the near blocks' (those rows
    hold ``scale = -inf``: a finite scale over ``Z = 0`` swamped the sum)."""
    rng = np.random.default_rng(5)
    X, Y = rng.random((4000, 3)), rng.random((3000, 3))
    center = (X.sum(0) + Y.sum(0)) / 7000
    Xc, Yc = X - center, Y - center
    expansion = BlockExpansion(0.01, 3, tau=4.0, rtol=1e-6)
    lx, cx = expansion.cover(Xc, 0)
    ly, cy = expansion.cover(Yc, 1)
    outs = _blocks(expansion, Xc, lx, cx, 2)
    inns = _blocks(expansion, Yc, ly, cy, 4)
    assert outs[0][1].side.n_small < outs[0][1].n_clusters  # expanded clusters
    log_w = -2000.0 + rng.normal(size=3000) * 3.0
    D = ((Xc[:, None] - Yc[None]) ** 2).sum(-1)
    true = logsumexp(log_w[None, :] - D / 0.01, axis=1)
    logs, _ = _summed(expansion, outs, inns, log_w, 1e-6, False, true.size)
    bound = expansion.entry_error_bound(float(D.max()) / 0.01)
    assert np.all(np.isfinite(logs))
    assert np.max(np.abs(np.expm1(logs - true))) <= bound + 1e-6


def test_the_sum_of_two_empty_terms_adds_nothing_to_a_third():
    """Two terms that skip a row (``scale = -inf``, ``Z = 0``) add up to an empty row, not
    to ``scale = 0`` over ``Z = 0``, which swamped a later term of scale ``-2500``."""
    empty = (np.array([-np.inf, 1.0]), np.array([[0.0], [2.0]]))
    both = BlockExpansion.combine(empty, empty)
    assert both[0][0] == -np.inf
    far = (np.array([-2500.0, -np.inf]), np.array([[3.0], [0.0]]))
    scale, Z = BlockExpansion.combine(both, far)
    np.testing.assert_allclose(scale + np.log(Z[:, 0]), [-2500.0 + np.log(3.0), 1.0 + np.log(4.0)])


@pytest.fixture(scope="module")
def long_problem():
    """Clouds four times longer than wide, cut in five blocks a side along their length:
    most block pairs lie beyond the truncation's reach at ``reg = 3e-3``."""
    rng = np.random.default_rng(11)
    X, Y = rng.random((3000, 3)), rng.random((2500, 3))
    X[:, 0] *= 4.0
    Y[:, 0] *= 4.0
    center = (X.sum(0) + Y.sum(0)) / 5500
    Xc, Yc = X - center, Y - center
    expansion = BlockExpansion(0.003, 3, tau=4.0, rtol=1e-6)
    lx, cx = expansion.cover(Xc, 0)
    ly, cy = expansion.cover(Yc, 1)
    log_w = rng.normal(size=2500) * 5.0
    D = ((Xc[:, None] - Yc[None]) ** 2).sum(-1)
    true = logsumexp(log_w[None, :] - D / 0.003, axis=1)
    bound = expansion.entry_error_bound(float(D.max()) / 0.003)
    outs = _blocks(expansion, Xc, lx, cx, 5)
    inns = _blocks(expansion, Yc, ly, cy, 5)
    return expansion, outs, inns, log_w, true, bound


def test_a_block_out_of_reach_is_settled_from_the_bounds_with_the_same_answer(
    long_problem, monkeypatch
):
    """A block pair whose cluster pairs the truncation would all skip returns the empty term
    without the product's setup; every term is the same, to the bit, as the product that
    forms and skips them, and the sums stay within the certified error."""
    expansion, outs, inns, log_w, true, bound = long_problem
    calls = []
    real_apply = blocks_module._apply

    def counting_apply(*args, **kwargs):
        calls.append(1)
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(blocks_module, "_apply", counting_apply)
    bounds = ClusterBounds.concat([expansion.bounds(b, log_w[rows]) for rows, b in inns])
    terms = {}
    for a, (_, out) in enumerate(outs):
        below = expansion.lower_bounds(out, bounds)
        for b, (in_rows, inn) in enumerate(inns):
            terms[a, b] = expansion.product(out, inn, log_w[in_rows], truncate=2e-7, lower=below)
    settled = len(terms) - len(calls)
    assert settled >= 8  # the far pairs of 5 x 5 blocks along a line
    monkeypatch.setattr(blocks_module, "_every_pair_skipped", lambda *a, **k: False)
    for a, (_, out) in enumerate(outs):
        below = expansion.lower_bounds(out, bounds)
        for b, (in_rows, inn) in enumerate(inns):
            scale, Z = expansion.product(out, inn, log_w[in_rows], truncate=2e-7, lower=below)
            np.testing.assert_array_equal(terms[a, b][0], scale)
            np.testing.assert_array_equal(terms[a, b][1], Z)
    monkeypatch.undo()
    logs, _ = _summed(expansion, outs, inns, log_w, 1e-6, False, true.size)
    assert np.max(np.abs(np.expm1(logs - true))) <= bound + 1e-6


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    log_reg=st.floats(np.log(0.002), np.log(0.05)),
    shift=st.floats(0.0, 3.0),
    weight_spread=st.floats(0.0, 30.0),
    truncate=st.sampled_from([1e-12, 1e-6, 1e-2]),
    exact_below=st.sampled_from([0, 8]),
)
def test_a_block_settled_from_the_bounds_is_one_whose_every_pair_is_skipped(
    seed, log_reg, shift, weight_spread, truncate, exact_below
):
    """Invariant: whenever the block test says every pair of an input block is skipped, the
    per-pair rule of the truncation (``_kept_pairs``, with the same row bounds: from this
    block and a near one) keeps none."""
    rng = np.random.default_rng(seed)
    reg = float(np.exp(log_reg))
    expansion = BlockExpansion(reg, 3, tau=2.0, rtol=1e-6, exact_below=exact_below)
    X, near_points = rng.random((120, 3)), rng.random((100, 3))
    Y = rng.random((100, 3)) * 0.5 + [shift, 0.0, 0.0]
    out, inn, near = (expansion.block(P, *expansion.cover(P, rng)) for P in (X, Y, near_points))
    log_w = weight_spread * rng.normal(size=100)
    b = expansion.bounds(inn, log_w)
    lower = expansion.lower_bounds(
        out, ClusterBounds.concat([b, expansion.bounds(near, np.zeros(100))])
    )
    side = out.side
    pair_sq = ((side.centers[:, None] - b.center[None]) ** 2).sum(-1)
    keep = _kept_pairs(
        pair_sq, side.centers, side.cluster_radius, b, reg, truncate,
        exact_first=inn.side.n_small, lower=lower,
    )  # fmt: skip
    settled = _every_pair_skipped(
        side.centers, side.cluster_radius, b.center, b, reg, truncate, lower,
        exact_first=inn.side.n_small,
    )  # fmt: skip
    if settled:
        assert not keep.any()
