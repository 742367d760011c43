from types import SimpleNamespace

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.kernels.stacked import StackedExactKernel, stacked_log_kernel
from sketchot.solver import batch as batch_module
from sketchot.solver.batch import FLOAT32_MIN_TOL, BatchResult, by_spread, chunk_size, pass_dtype
from sketchot.solver.engine import iterate
from sketchot.solver.problem import make_problem


def pairs(seed, B=12, n=20, m=25, d=2, weighted=True):
    rng = np.random.default_rng(seed)
    X = rng.random((B, n, d))
    Y = rng.random((B, m, d)) * rng.uniform(0.5, 2.0, size=(B, 1, 1)) + 0.3
    if not weighted:
        return X, Y, None, None
    a, b = rng.random((B, n)) + 0.1, rng.random((B, m)) + 0.1
    return X, Y, a / a.sum(axis=1, keepdims=True), b / b.sum(axis=1, keepdims=True)


def centred(f):
    return f - f.mean()


@pytest.mark.parametrize("reg", [0.1, 0.01])
def test_each_pair_agrees_with_sinkhorn_exact(reg):
    X, Y, a, b = pairs(0)
    res = sketchot.sinkhorn_batch(X, Y, a, b, reg=reg, tol=1e-12, max_iter=5000)
    assert isinstance(res, BatchResult) and len(res) == 12 and res.converged.all()
    for k in range(len(res)):
        ref = sketchot.sinkhorn(a[k], b[k], X[k], Y[k], reg=reg, backend="exact", tol=1e-12,
                                max_iter=5000, anderson=0)  # fmt: skip
        # both solve the same problem to an L2 marginal residual of 1e-12: they agree far
        # below the 1e-8 asked (measured about 1e-11)
        assert res.value[k] == pytest.approx(ref.value, rel=1e-8)
        assert res.value_linear[k] == pytest.approx(ref.value_linear, rel=1e-8)
        np.testing.assert_allclose(res.marginals[1][k], ref.marginals[1], atol=1e-10)
        np.testing.assert_allclose(res.marginals[0][k], ref.marginals[0], atol=1e-10)
        # potentials are defined up to a constant: compare f = reg log u centred
        np.testing.assert_allclose(
            centred(reg * res.potentials[0][k]), centred(reg * ref.potentials[0]), atol=1e-8
        )
    assert (res.errors <= res.tol).all() and res.norm == "l2"


def test_each_pair_agrees_with_pots_solve_sample():
    X, Y, a, b = pairs(1, B=6)
    res = sketchot.solve_sample_batch(X, Y, 0.05, a, b, tol=1e-12, max_iter=5000)
    for k in range(len(res)):
        pot = ot.solve_sample(X[k], Y[k], a[k], b[k], reg=0.05, max_iter=5000, tol=1e-12)
        # POT's value convention is sinkhorn's (<P, M> + reg KL(P | a b^T)); both at 1e-12
        assert res.value[k] == pytest.approx(float(pot.value), rel=1e-8)
        assert res.value_linear[k] == pytest.approx(float(pot.value_linear), rel=1e-8)


def test_pairs_converge_on_their_own():
    """Pairs of different spreads need different numbers of iterations; converged pairs
    leave the stack, and every pair meets the target by its own residual."""
    rng = np.random.default_rng(2)
    scales = np.array([0.2, 0.2, 0.5, 0.5, 1.0, 1.0])[:, None, None]
    X, Y = rng.random((6, 30, 2)) * scales, rng.random((6, 30, 2)) * scales + 0.1
    res = sketchot.sinkhorn_batch(X, Y, reg=0.01, tol=1e-9, round_iter=20, max_iter=5000)
    assert res.converged.all() and (res.errors <= 1e-9).all()
    assert res.n_iter.min() < res.n_iter.max()
    # the default rule: the accuracy's L1 share; the checks are exhaustive (exact kernels)
    default = sketchot.sinkhorn_batch(X, Y, reg=0.01, max_iter=5000)
    assert default.norm == "l1" and default.accuracy_met.all()
    assert (default.true_kernel_error <= default.accuracy).all()


def test_chunks_change_nothing():
    X, Y, a, b = pairs(3, B=10)
    whole = sketchot.sinkhorn_batch(X, Y, a, b, reg=0.05, tol=1e-12)
    per_pair = 24 * 20 * 25
    assert chunk_size(10, 20, 25, 3 * per_pair) == 3
    chunked = sketchot.sinkhorn_batch(X, Y, a, b, reg=0.05, tol=1e-12, max_bytes=3 * per_pair)
    # the same iterations up to when each chunk stops and absorbs: 1e-12 residuals
    np.testing.assert_allclose(chunked.value, whole.value, rtol=1e-10)
    with pytest.raises(MemoryError, match="raise max_bytes"):
        sketchot.sinkhorn_batch(X, Y, reg=0.05, max_bytes=per_pair - 1)


@settings(max_examples=6, deadline=None)
@given(st.permutations(list(range(5))))
def test_permuting_pairs_permutes_results(order):
    X, Y, a, b = pairs(4, B=5)
    base = sketchot.sinkhorn_batch(X, Y, a, b, reg=0.05, tol=1e-12)
    perm = sketchot.sinkhorn_batch(X[order], Y[order], a[order], b[order], reg=0.05, tol=1e-12)
    # each pair's fixed point, reached to 1e-12 whatever its neighbours
    np.testing.assert_allclose(perm.value, base.value[order], rtol=1e-10)


def test_zero_weights_and_tiny_reg_stay_finite():
    X, Y, a, b = pairs(5, B=4)
    a[:, :3] = 0.0
    a /= a.sum(axis=1, keepdims=True)
    # reg 1e-3 on the unit square: exp(-C / reg) underflows; the absorbed iteration holds
    res = sketchot.sinkhorn_batch(X, Y, a, b, reg=1e-3, max_iter=3000)
    assert np.isfinite(res.value).all() and np.isfinite(res.value_linear).all()
    assert np.isneginf(res.potentials[0][:, :3]).all()
    assert (res.marginals[0][:, :3] == 0).all()
    ref = sketchot.sinkhorn(a[0], b[0], X[0], Y[0], reg=1e-3, backend="exact", max_iter=3000)
    # both stop at the accuracy's L1 rule (1e-4): values agree to about that
    assert res.value[0] == pytest.approx(ref.value, rel=1e-3)


@pytest.mark.parametrize(
    "seed, reg, log_domain_tol",
    [(0, 1e-3, {}), (0, 1e-3, {"log_domain": True, "tol": 1e-6}), (4, 3e-3, {})],
)
def test_pairs_that_break_down_are_solved_alone(seed, reg, log_domain_tol, monkeypatch):
    """5 x 10 points at reg 1e-3: Anderson's extrapolations break the stack's absorbed
    passes down within its first round. Before, every pair of the stack then left
    unconverged (errors 0.01-0.35, none converged); the pairs above tol are now solved one
    by one by the single-problem solver, and agree with ``sinkhorn``'s. Seed 4 at reg 3e-3:
    a lone solve stopped at the batch's own target left its plan's column error at 1.6e-4
    (ALONE_MARGIN)."""
    alone = []
    solve_one = batch_module.sinkhorn_matrix
    monkeypatch.setattr(batch_module, "sinkhorn_matrix",
                        lambda *args, **kw: alone.append(1) or solve_one(*args, **kw))  # fmt: skip
    X, Y, a, b = pairs(seed, B=4, n=5, m=10)
    res = sketchot.sinkhorn_batch(X, Y, a, b, reg=reg, max_iter=3000, **log_domain_tol)
    assert alone  # the stack did break down
    assert res.converged.all() and (res.errors <= res.tol).all()
    for k in range(4):
        ref = sketchot.sinkhorn(a[k], b[k], X[k], Y[k], reg=reg, backend="exact", max_iter=3000)
        # both stop at an L1 marginal rule of 1e-4 or tighter: values to about that
        assert res.value[k] == pytest.approx(ref.value, rel=1e-3)
        # the stored marginals are the returned potentials' plan's
        M = ((X[k][:, None, :] - Y[k][None, :, :]) ** 2).sum(axis=2)
        log_u, log_v = res.potentials[0][k], res.potentials[1][k]
        plan = np.exp(log_u[:, None] + log_v[None, :] - M / reg)
        np.testing.assert_allclose(plan.sum(axis=1), res.marginals[0][k], rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(plan.sum(axis=0), res.marginals[1][k], rtol=1e-9, atol=1e-15)


def test_stacked_operator_is_the_block_diagonal_kernel():
    X, Y, _, _ = pairs(6, B=3, n=4, m=5)
    kernel = StackedExactKernel(stacked_log_kernel(X, Y, 0.5), 0.5)
    dense = np.zeros((12, 15))
    for k in range(3):
        dense[4 * k : 4 * k + 4, 5 * k : 5 * k + 5] = np.exp(-ot.dist(X[k], Y[k]) / 0.5)
    rng = np.random.default_rng(0)
    v, u = rng.random(15), rng.random(12)
    # the centred squared distances: rounding only
    np.testing.assert_allclose(kernel.to_dense(), dense, rtol=1e-12)
    np.testing.assert_allclose(kernel.matvec(v), dense @ v, rtol=1e-12)
    np.testing.assert_allclose(kernel.rmatvec(u), dense.T @ u, rtol=1e-12)
    linear = kernel.fused_pass("rows", v, u)
    log = kernel.fused_pass("rows", np.log(v), np.log(u), log=True)
    np.testing.assert_allclose(np.exp(log.ratios), linear.ratios, rtol=1e-12)
    np.testing.assert_allclose(np.exp(log.projection), linear.projection, rtol=1e-12)
    np.testing.assert_allclose(kernel.project("rows", u), dense.T @ u, rtol=1e-12)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda X, Y: sketchot.sinkhorn_batch(X[0], Y), ValueError, r"shape \(B, n, d\)"),
        (lambda X, Y: sketchot.sinkhorn_batch(X, Y[:3]), ValueError, "same number of pairs"),
        (lambda X, Y: sketchot.sinkhorn_batch(X, Y, b=np.ones((4, 25))), ValueError,
         r"same mass pair by pair \(balanced transport\); pair 0"),
        (lambda X, Y: sketchot.sinkhorn_batch(X, Y, a=np.ones((4, 3))), ValueError,
         r"a must be weights of shape \(4, 20\)"),
        (lambda X, Y: sketchot.sinkhorn_batch(X, Y, anderson=-1), ValueError, "anderson"),
        (lambda X, Y: sketchot.sinkhorn_batch(X, Y, rank=5), TypeError, "does not take rank"),
        (lambda X, Y: sketchot.sinkhorn_batch(X, Y, reg=0.0), ValueError, "reg must be > 0"),
    ],
)  # fmt: skip
def test_validation_names_the_argument(call, error, message):
    X, Y, _, _ = pairs(7, B=4, weighted=False)
    with pytest.raises(error, match=message):
        call(X, Y)


def test_verbose_reports_progress(capsys):
    X, Y, _, _ = pairs(8, B=4, weighted=False)
    sketchot.sinkhorn_batch(X, Y, reg=0.1, verbose=True)
    assert "pairs 4/4, 4 converged" in capsys.readouterr().out


def test_without_anderson_each_pair_runs_its_own_iterates():
    X, Y, a, b = pairs(9, B=5)
    # reg 0.1: POT's start is underflow-free for the stack as for each pair (at smaller reg
    # the stack, whose test sees the largest cost and B n rows, may open with one exact
    # log-domain iteration where a lone pair does not: one iteration ahead)
    res = sketchot.sinkhorn_batch(X, Y, a, b, reg=0.1, anderson=0, max_iter=30, tol=1e-15)
    for k in range(5):
        ref = sketchot.sinkhorn(a[k], b[k], X[k], Y[k], reg=0.1, backend="exact", anderson=0,
                                max_iter=30, tol=1e-15, warn=False, errors="warn")  # fmt: skip
        # the same 30 iterations from the same start (absorptions at other times: rounding)
        assert res.n_iter[k] == ref.n_iter == 30
        assert res.value[k] == pytest.approx(ref.value, rel=1e-10)


def test_per_pair_mixing_reaches_the_plain_iterations_solutions():
    X, Y, a, b = pairs(10, B=8)
    mixed = sketchot.sinkhorn_batch(X, Y, a, b, reg=0.02, tol=1e-12, max_iter=5000)
    plain = sketchot.sinkhorn_batch(X, Y, a, b, reg=0.02, tol=1e-12, max_iter=5000, anderson=0)
    assert mixed.converged.all() and plain.converged.all()
    # the same fixed points, both at an L2 residual of 1e-12
    np.testing.assert_allclose(mixed.value, plain.value, rtol=1e-9)
    np.testing.assert_allclose(mixed.marginals[0], plain.marginals[0], atol=1e-10)
    for k in range(8):
        np.testing.assert_allclose(centred(mixed.potentials[0][k]),
                                   centred(plain.potentials[0][k]), atol=1e-6)  # fmt: skip
    # and mixing pays: fewer iterations for every pair
    assert (mixed.n_iter < plain.n_iter).all()


def test_with_mixing_each_pair_runs_its_own_iterates():
    """Per-pair Anderson: a pair's iterates do not depend on the other pairs of the stack
    (12 iterations, none converged: the same in a stack of 5 as alone)."""
    X, Y, a, b = pairs(11, B=5)
    options = dict(reg=0.01, max_iter=12, tol=1e-15, round_iter=12)
    together = sketchot.sinkhorn_batch(X, Y, a, b, **options)
    for k in range(5):
        alone = sketchot.sinkhorn_batch(X[k : k + 1], Y[k : k + 1], a[k : k + 1], b[k : k + 1],
                                        **options)  # fmt: skip
        assert together.n_iter[k] == alone.n_iter[0] == 12
        assert together.value[k] == pytest.approx(alone.value[0], rel=1e-10)
        assert together.errors[k] == pytest.approx(alone.errors[0], rel=1e-6)


def test_each_pair_is_certified_by_its_own_plan():
    """The reported marginals, values and errors are each pair's own, from its plan; a pair
    that misses the target says so while the others converge."""
    rng = np.random.default_rng(12)
    X, Y = rng.random((4, 30, 2)), rng.random((4, 35, 2))
    X[3] *= 8.0  # far larger costs at the same reg: many more iterations
    reg = 0.02
    res = sketchot.sinkhorn_batch(X, Y, reg=reg, max_iter=40)
    assert res.converged[:3].all() and not res.converged[3]
    assert res.status[3] == "max_iter reached" and res.n_iter[3] == 40
    assert (res.errors[:3] <= res.tol).all() and res.errors[3] > res.tol
    for k in range(4):
        C = ot.dist(X[k], Y[k])
        P = np.exp(res.potentials[0][k][:, None] + res.potentials[1][k][None, :] - C / reg)
        np.testing.assert_allclose(res.marginals[0][k], P.sum(axis=1), rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(res.marginals[1][k], P.sum(axis=0), rtol=1e-10, atol=1e-15)
        assert res.value_linear[k] == pytest.approx(float((P * C).sum()), rel=1e-10)
        # the L1 rule: each pair's column residual is its reported error
        col_error = np.abs(P.sum(axis=0) - res.b[k]).sum() / res.a[k].sum()
        assert res.errors[k] == pytest.approx(col_error, rel=1e-6, abs=1e-14)
        assert res.true_kernel_error[k] >= col_error * (1 - 1e-9) - 1e-14  # rounding
    assert res.accuracy_met[:3].all()


def test_pairs_whose_start_would_underflow_start_from_c_transforms():
    """At reg 2e-3 on the unit square POT's start underflows the absorbed kernel: those pairs
    start from the c-transforms (no log-domain pass), the others from POT's start, and all
    converge to sinkhorn's solutions."""
    rng = np.random.default_rng(13)
    X, Y = rng.random((3, 25, 2)), rng.random((3, 30, 2))
    X[0] *= 0.05
    Y[0] *= 0.05  # a small pair: its costs over reg stay within float64's range
    res = sketchot.sinkhorn_batch(X, Y, reg=2e-3, tol=1e-10, max_iter=5000)
    assert res.converged.all()
    for k in range(3):
        ref = sketchot.sinkhorn(None, None, X[k], Y[k], reg=2e-3, backend="exact", tol=1e-10,
                                max_iter=5000)  # fmt: skip
        assert res.value[k] == pytest.approx(ref.value, rel=1e-7)


def test_chunks_of_similar_spreads_return_the_pairs_in_order():
    """Pairs are chunked by spread (the slowest pair of a round sets its length): the
    results come back in the caller's order whatever the chunking."""
    rng = np.random.default_rng(14)
    scales = rng.permutation(np.linspace(0.2, 2.0, 9))[:, None, None]
    X, Y = rng.random((9, 15, 2)) * scales, rng.random((9, 18, 2)) * scales
    order = by_spread(X, Y, chunk=3)
    assert np.all(np.diff(scales[order, 0, 0]) > 0)  # the spreads grow with the scales
    whole = sketchot.sinkhorn_batch(X, Y, reg=0.05, tol=1e-12)
    chunked = sketchot.sinkhorn_batch(X, Y, reg=0.05, tol=1e-12, max_bytes=3 * 24 * 15 * 18)
    np.testing.assert_allclose(chunked.value, whole.value, rtol=1e-10)
    for k in range(9):
        ref = sketchot.sinkhorn_batch(X[k : k + 1], Y[k : k + 1], reg=0.05, tol=1e-12)
        assert chunked.value[k] == pytest.approx(ref.value[0], rel=1e-10)


@pytest.mark.parametrize(
    "setting",
    [dict(seed=15, n=20, m=25, reg=0.02), dict(seed=0, n=5, m=10, reg=1e-3)],
    ids=["plain", "with pairs solved alone"],
)
def test_threads_change_nothing(setting):
    """Chunks are solved by worker threads; the chunking does not depend on their number,
    so the results are the same bits with 1 or 2 threads, the pairs solved alone after a
    breakdown (5 x 10 points at reg 1e-3) included."""
    n, m = setting["n"], setting["m"]
    X, Y, a, b = pairs(setting["seed"], B=10, n=n, m=m)
    per_chunk = 24 * n * m * 2  # two pairs a chunk: five chunks
    with sketchot.thread_limit(1):
        one = sketchot.sinkhorn_batch(X, Y, a, b, reg=setting["reg"], max_bytes=per_chunk)
    with sketchot.thread_limit(2):
        two = sketchot.sinkhorn_batch(X, Y, a, b, reg=setting["reg"], max_bytes=per_chunk)
    for name in ("value", "value_linear", "errors", "n_iter"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))
    np.testing.assert_array_equal(one.potentials[1], two.potentials[1])


def test_only_the_pairs_out_of_range_are_reabsorbed():
    """At small reg one pair's scalings leave the absorption range many times; the pairs
    whose scalings stay in range are never recomputed (their absorbed entries are the
    previous ones), and the results are each pair's own."""
    rng = np.random.default_rng(16)
    X, Y = rng.random((3, 20, 2)), rng.random((3, 25, 2))
    X[1:] *= 0.02  # tiny costs over reg: scalings stay near their start
    Y[1:] *= 0.02
    calls = []

    class Recording(StackedExactKernel):
        def absorbed(self, alpha, beta, previous=None, blocks=None):
            calls.append(None if blocks is None else blocks.copy())
            return super().absorbed(alpha, beta, previous, blocks)

    reg = 1e-3
    kernel = Recording(stacked_log_kernel(X, Y, reg), reg)
    problem = make_problem(np.full(60, 1 / 20), np.full(75, 1 / 25), kernel.shape, reg)
    state = iterate(kernel, problem, tol=1e-9, max_iter=3000, strategy="absorb", anderson=5)
    partial = [mask for mask in calls if mask is not None]
    assert state.converged and calls[0] is None and partial
    assert all(mask[0] and not mask[1:].any() for mask in partial)
    for k in range(3):
        ref = sketchot.sinkhorn(None, None, X[k], Y[k], reg=reg, backend="exact", tol=1e-9,
                                max_iter=3000)  # fmt: skip
        log_u = state.log_u.reshape(3, -1)[k]
        log_v = state.log_v.reshape(3, -1)[k]
        P = np.exp(log_u[:, None] + log_v[None, :] - ot.dist(X[k], Y[k]) / reg)
        # both stopped at POT's 1e-9 on the column residual: plans agree to about that
        assert float((P * ot.dist(X[k], Y[k])).sum()) == pytest.approx(ref.value_linear, rel=1e-6)


def test_partial_absorption_recomputes_only_its_blocks():
    X, Y, _, _ = pairs(17, B=3, n=4, m=5)
    kernel = StackedExactKernel(stacked_log_kernel(X, Y, 0.5), 0.5)
    rng = np.random.default_rng(0)
    alpha, beta = rng.normal(size=12), rng.normal(size=15)
    first = kernel.absorbed(alpha, beta)
    kept = first.linear().copy()
    alpha2, beta2 = alpha.copy(), beta.copy()
    alpha2[4:8] += 1.0  # pair 1 only
    beta2[5:10] -= 2.0
    second = kernel.absorbed(alpha2, beta2, previous=first, blocks=np.array([False, True, False]))
    whole = StackedExactKernel(stacked_log_kernel(X, Y, 0.5), 0.5).absorbed(alpha2, beta2)
    np.testing.assert_allclose(second.linear(), whole.linear(), rtol=1e-14)
    np.testing.assert_array_equal(second.linear()[[0, 2]], kept[[0, 2]])
    with pytest.raises(ValueError, match="previous absorbed kernel"):
        kernel.absorbed(alpha, beta, blocks=np.array([True, False, False]))


def test_the_passes_precision_depends_on_tol_alone():
    """float32 passes from FLOAT32_MIN_TOL (the default accuracy's 1e-4 included), float64
    below it and on the multiplicative path (no absorption to keep float32 in range)."""
    assert FLOAT32_MIN_TOL == 1e-5
    assert pass_dtype(1e-4, "auto") == np.float32 and pass_dtype(1e-5, True) == np.float32
    assert pass_dtype(9.9e-6, "auto") == np.float64 and pass_dtype(1e-9, "auto") == np.float64
    assert pass_dtype(1e-4, False) == np.float64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float32_stacked_passes_match_float64(dtype):
    """The float32 kernel's passes return float64 values within float32's rounding of the
    float64 kernel's (about sqrt(m) roundings of 6e-8 per sum: 1e-5 relative is loose), and
    the float64 kernel's are unchanged."""
    X, Y, a, _ = pairs(18, B=4, n=30, m=40)
    reg = 0.05
    L = stacked_log_kernel(X, Y, reg)
    rng = np.random.default_rng(1)
    alpha, beta = rng.normal(size=120) - 3.0, rng.normal(size=160)
    exact = StackedExactKernel(L, reg).absorbed(alpha, beta)
    other = StackedExactKernel(L, reg, dtype=dtype).absorbed(alpha, beta)
    assert other.linear().dtype == dtype and other.dtype == dtype
    w = rng.random(160) + 0.5
    ref, got = exact.fused_pass("rows", w, a.ravel()), other.fused_pass("rows", w, a.ravel())
    for name in ("products", "ratios", "projection"):
        value = getattr(got, name)
        assert value.dtype == np.float64
        np.testing.assert_allclose(value, getattr(ref, name), rtol=1e-5)
    u = rng.random(120)
    np.testing.assert_allclose(other.project("rows", u), exact.project("rows", u), rtol=1e-5)


def test_projection_after_a_partial_absorption_reuses_only_the_kept_pairs():
    """After a rows pass, the absorption of one pair, then the projection of the new
    scalings: the kept pairs' projections are the pass's, the re-absorbed pair's and any
    pair whose scaling changed are recomputed; the same bits as a fresh product."""
    X, Y, a, _ = pairs(19, B=3, n=20, m=25)
    reg = 0.05
    L = stacked_log_kernel(X, Y, reg)
    rng = np.random.default_rng(2)
    alpha, beta = rng.normal(size=60), rng.normal(size=75)
    kernel = StackedExactKernel(L, reg)
    first = kernel.absorbed(alpha, beta)
    rows = first.fused_pass("rows", np.ones(75), a.ravel())
    alpha2 = alpha.copy()
    alpha2[20:40] += np.log(rows.ratios[20:40])  # pair 1's scalings moved into its kernel
    second = kernel.absorbed(alpha2, beta, previous=first, blocks=np.array([False, True, False]))
    u = rows.ratios.copy()
    u[20:40] = 1.0
    u[45] *= 2.0  # pair 2's scaling changed too
    fresh = StackedExactKernel(L, reg).absorbed(alpha2, beta).project("rows", u)
    np.testing.assert_array_equal(second.project("rows", u), fresh)
    np.testing.assert_array_equal(second.project("rows", u)[:25], rows.projection[:25])


def test_float32_passes_report_float64_sums_of_each_plan():
    """Default accuracy at small reg (float32 passes): every reported marginal, value and
    error is the float64 sum of the pair's own plan exp(log u + log v - C / reg), and each
    converged pair meets tol in that float64 check."""
    rng = np.random.default_rng(20)
    X, Y = rng.random((6, 40, 3)), rng.random((6, 50, 3)) * 0.8 + 0.2
    reg = 0.01 * float(np.mean([ot.dist(x, y).mean() for x, y in zip(X, Y, strict=True)]))
    res = sketchot.sinkhorn_batch(X, Y, reg=reg)
    assert res.converged.all() and res.tol == pytest.approx(1e-4) and res.norm == "l1"
    for k in range(6):
        C = ot.dist(X[k], Y[k])
        P = np.exp(res.potentials[0][k][:, None] + res.potentials[1][k][None, :] - C / reg)
        np.testing.assert_allclose(res.marginals[0][k], P.sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(res.marginals[1][k], P.sum(axis=0), rtol=1e-12)
        assert res.value_linear[k] == pytest.approx(float((P * C).sum()), rel=1e-12)
        col_error = np.abs(P.sum(axis=0) - res.b[k]).sum() / res.a[k].sum()
        assert res.errors[k] == pytest.approx(col_error, rel=1e-9) and col_error <= res.tol
    # the float64 solve of the same problems (tol below FLOAT32_MIN_TOL) agrees to the
    # accuracy asked: values within 1e-3 relative (both plans within 1e-4 of the marginals)
    tight = sketchot.sinkhorn_batch(X, Y, reg=reg, tol=1e-9)
    np.testing.assert_allclose(res.value, tight.value, rtol=1e-3)


def test_a_pair_that_misses_the_float64_check_stays(monkeypatch):
    """float32 passes forced below their floor (tol 1e-9, FLOAT32_MIN_TOL lowered): the
    float32 residual nominates pairs that the float64 check refuses; they stay and end
    unconverged at max_iter, saying so, with their float64 errors (never the float32)."""
    monkeypatch.setattr(batch_module, "FLOAT32_MIN_TOL", 0.0)
    X, Y, a, b = pairs(21, B=4, n=30, m=35)
    res = sketchot.sinkhorn_batch(X, Y, a, b, reg=0.05, tol=1e-9, max_iter=300)
    for k in range(4):
        C = ot.dist(X[k], Y[k])
        P = np.exp(res.potentials[0][k][:, None] + res.potentials[1][k][None, :] - C / 0.05)
        col_error = np.linalg.norm(P.sum(axis=0) - b[k])  # POT's L2 rule at an explicit tol
        assert res.errors[k] == pytest.approx(col_error, rel=1e-6, abs=1e-15)
    np.testing.assert_array_equal(res.converged, res.errors <= 1e-9)
    assert not res.converged.all() and (res.n_iter[~res.converged] == 300).all()


def test_a_round_that_loses_a_pair_keeps_its_start():
    """A breakdown's last iterate may be non-finite for some pairs; those keep the
    potentials they started the round from (a later round starts from finite ones), zero
    weights' -inf stays allowed, the other pairs take the round's."""
    a = np.full((3, 2), 0.5)
    a[2, 0] = 0.0
    b = np.full((3, 2), 0.5)
    log_u, log_v = np.zeros((3, 2)), np.ones((3, 2))
    new_u = np.array([[1.0, 2.0], [np.nan, 3.0], [-np.inf, 4.0]])
    new_v = np.array([[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]])
    active = np.array([0, 1, 2])
    state = SimpleNamespace(log_u=new_u.ravel(), log_v=new_v.ravel())
    batch_module._keep_finite(log_u, log_v, active, state, a, b)
    np.testing.assert_array_equal(log_u, [[1.0, 2.0], [0.0, 0.0], [-np.inf, 4.0]])
    np.testing.assert_array_equal(log_v, [[5.0, 6.0], [1.0, 1.0], [9.0, 10.0]])
