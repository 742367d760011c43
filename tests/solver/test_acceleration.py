"""Anderson mixing: the fixed point is unchanged, the iterations are fewer, bad steps restart."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.solver.acceleration import AndersonMixer, BlockAndersonMixer


def symmetric_contraction(rng, m, gap):
    """``x -> G x + c`` with symmetric ``G``, eigenvalues in ``[0, 1 - gap]`` (Sinkhorn's
    linearisation has this spectrum); the fixed point is ``(I - G)^{-1} c``."""
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    G = (Q * np.linspace(0.0, 1.0 - gap, m)) @ Q.T
    c = rng.standard_normal(m)
    return G, c, np.linalg.solve(np.eye(m) - G, c)


def iterations_to(mixer, G, c, fixed, tol=1e-10, max_iter=5000):
    x = np.zeros_like(c)
    for iteration in range(1, max_iter + 1):
        x = mixer.step(x, G @ x + c)
        if np.linalg.norm(x - fixed) < tol * np.linalg.norm(fixed):
            return iteration
    return max_iter


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gap=st.floats(1e-3, 0.5))
def test_mixing_keeps_the_fixed_point_and_never_needs_more_iterations(seed, gap):
    rng = np.random.default_rng(seed)
    G, c, fixed = symmetric_contraction(rng, 30, gap)
    active = np.ones(30, bool)
    plain = iterations_to(AndersonMixer(0, active), G, c, fixed)
    mixed = iterations_to(AndersonMixer(5, active), G, c, fixed)
    # GMRES-like on a symmetric spectrum: never slower than the plain iteration's rate
    assert mixed <= plain


def test_mixing_is_much_faster_on_a_small_gap():
    # plain: (1 - gap)^k = 1e-10 takes ~2300 steps at gap 1e-2; memory 5 on 60 evenly spread
    # eigenvalues measured 294 (full GMRES would contract like 1 - 2 sqrt(gap): ~115)
    G, c, fixed = symmetric_contraction(np.random.default_rng(0), 60, 1e-2)
    active = np.ones(60, bool)
    assert iterations_to(AndersonMixer(5, active), G, c, fixed) < 0.2 * iterations_to(
        AndersonMixer(0, active), G, c, fixed
    )


def test_inactive_entries_are_passed_through_and_bad_steps_restart():
    active = np.array([True, False, True])
    mixer = AndersonMixer(3, active)
    x = np.array([0.0, -np.inf, 0.0])
    for k in range(3):
        g = np.array([1.0 + k, -np.inf, 0.5])
        out = mixer.step(x, g)
        assert out[1] == -np.inf and np.all(np.isfinite(out[active]))
        x = out
    g = np.array([np.nan, -np.inf, 0.0])  # a non-finite map value: plain step, fresh history
    assert mixer.step(x, g) is g
    assert mixer.restarts == 1


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_block_mixer_is_one_mixer_per_block(seed):
    """Each block its own coefficients, history and restarts: the iterates of
    :class:`AndersonMixer` run block by block, to rounding, whatever the other blocks (a
    block whose map breaks restarts alone)."""
    rng = np.random.default_rng(seed)
    blocks, m = 4, 12
    maps = [symmetric_contraction(rng, m, 0.05)[:2] for _ in range(blocks)]
    active = np.ones(blocks * m, bool)
    active[[3, 17]] = False
    alone = [AndersonMixer(3, active[k * m : (k + 1) * m]) for k in range(blocks)]
    together = BlockAndersonMixer(3, active, blocks)
    xs = [np.where(active[k * m : (k + 1) * m], 0.0, -np.inf) for k in range(blocks)]
    x = np.concatenate(xs)
    # 10 steps: nearer the fixed point the least squares are ill-conditioned, and rounding
    # (sums in another order) grows about 8x a step as between any two implementations: over
    # 2000 seeds at most 7e-11 at step 9, 1.5e-9 at step 10 and 1e-8 at step 11
    for step in range(10):
        gs = [np.where(np.isfinite(xk), np.tanh(G @ np.nan_to_num(xk, neginf=0.0)) + c, -np.inf)
              for xk, (G, c) in zip(xs, maps, strict=True)]  # fmt: skip
        if step == 6:
            gs[2] = gs[2] + 1e3  # block 2's residual jumps: it restarts alone, the others go on
        xs = [mixer.step(xk, gk) for mixer, xk, gk in zip(alone, xs, gs, strict=True)]
        x = together.step(x, np.concatenate(gs))
        expected = np.concatenate(xs)
        np.testing.assert_allclose(x[active], expected[active], rtol=1e-9, atol=1e-9)
        assert np.all(x[~active] == -np.inf)
    assert together.restarts == sum(mixer.restarts for mixer in alone) == 1


@pytest.mark.parametrize(
    "backend, reg, params",
    [
        ("exact", 0.01, {}),  # stabilised path
        ("polyts", 0.01, {"variant": "local"}),  # log-domain passes
        ("nystrom", 0.1, {"rank": 120, "anderson": 5}),  # multiplicative: only when asked
    ],
)
def test_solver_paths_reach_the_same_plan_with_fewer_iterations(backend, reg, params):
    rng = np.random.default_rng(3)
    X, Y = rng.random((300, 3)), rng.random((250, 3))
    kw = dict(reg=reg, backend=backend, tol=1e-11, max_iter=5000, rng=0, accuracy=None, **params)
    mixed = sketchot.sinkhorn(None, None, X, Y, **kw)
    plain = sketchot.sinkhorn(None, None, X, Y, **{**kw, "anderson": 0})
    assert mixed.converged and plain.converged
    assert mixed.n_iter < plain.n_iter / 2  # measured: 3x (reg 0.1) to 10x (reg 0.01) fewer
    # marginal errors 1e-11 on both: potentials agree up to the constant shift
    shift = np.mean(mixed.potentials[0] - plain.potentials[0])
    np.testing.assert_allclose(mixed.potentials[0] - shift, plain.potentials[0], atol=1e-6)
    assert mixed.value_linear == pytest.approx(plain.value_linear, rel=1e-8)


def test_auto_mixes_the_log_domain_paths_only():
    """``'auto'``: the low-rank multiplicative path keeps POT's iterates (and so the Dask
    solve's), the log-domain paths mix."""
    rng = np.random.default_rng(4)
    X, Y = rng.random((200, 3)), rng.random((150, 3))
    kw = dict(reg=0.1, tol=1e-11, rng=0, accuracy=None)
    auto = sketchot.sinkhorn(None, None, X, Y, backend="nystrom", rank=80, **kw)
    plain = sketchot.sinkhorn(None, None, X, Y, backend="nystrom", rank=80, anderson=0, **kw)
    assert auto.n_iter == plain.n_iter
    np.testing.assert_array_equal(auto.potentials[1], plain.potentials[1])
    exact = sketchot.sinkhorn(None, None, X, Y, backend="exact", **kw)
    exact_plain = sketchot.sinkhorn(None, None, X, Y, backend="exact", anderson=0, **kw)
    assert exact.n_iter < exact_plain.n_iter


@pytest.mark.parametrize("value", [-1, 2.5, "yes", True])
def test_anderson_rejects_what_is_not_a_memory(value):
    X = np.random.default_rng(5).random((20, 2))
    with pytest.raises((TypeError, ValueError), match="anderson"):
        sketchot.sinkhorn(None, None, X, X, reg=0.1, backend="exact", anderson=value)
