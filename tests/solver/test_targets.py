"""Several targets on one kernel (``b`` of shape ``(m, k)``, :mod:`sketchot.solver.targets`):
the same answers as ``k`` separate solves, per-target convergence and certification, POT's
conventions for the returned values, refusals by name."""

import warnings

import numpy as np
import ot
import pytest
from backend_params import contract_params
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot.kernels import available_backends
from sketchot.solver import TargetsResult

#: Both solves stop at POT's criterion ``tol`` (the L2 column residual relative to the
#: mass): the values of two iterates within ``tol`` of the same fixed point differ by a few
#: ``tol`` times the largest potential (the cost's range, here at most 3 for [0, 1]^3)
TOL = 1e-10
VALUE_RTOL = 1e-7


@pytest.fixture
def problem():
    """A colour-like source (120 points) and 4 histograms on 90 target points, one with
    empty bins (zero weights)."""
    rng = np.random.default_rng(20261128)
    X = rng.random((120, 3))
    Y = rng.beta(2.0, 5.0, size=(90, 3))
    B = rng.random((90, 4)) ** 2
    B[:20, 1] = 0.0
    B /= B.sum(axis=0)
    a = np.full(120, 1 / 120)
    return a, B, X, Y


def _separate(a, B, X, Y, reg, **kwargs):
    return [sketchot.sinkhorn(a, B[:, j], X, Y, reg=reg, **kwargs) for j in range(B.shape[1])]


@pytest.mark.parametrize("reg", [0.5, 0.05, 0.01])
def test_several_targets_equal_separate_solves(problem, reg):
    a, B, X, Y = problem
    together = sketchot.sinkhorn(a, B, X, Y, reg=reg, backend="exact", tol=TOL)
    alone = _separate(a, B, X, Y, reg, backend="exact", tol=TOL)
    assert isinstance(together, TargetsResult) and together.n_targets == 4
    assert together.converged.all()
    np.testing.assert_allclose(
        together.value_linear, [r.value_linear for r in alone], rtol=VALUE_RTOL
    )
    np.testing.assert_allclose(together.value, [r.value for r in alone], rtol=VALUE_RTOL)
    # the plans agree: their marginals, to the stopping rule's residual
    for j, single in enumerate(alone):
        np.testing.assert_allclose(together.marginals[0][:, j], single.marginals[0], atol=1e-9)
        np.testing.assert_allclose(together.marginals[1][:, j], single.marginals[1], atol=1e-9)
    assert together.potentials[0].shape == (120, 4) and together.potentials[1].shape == (90, 4)


def test_the_default_stopping_rule_certifies_each_target(problem):
    """tol=None: each target stops at the accuracy's rule and its own true-kernel check (the
    exact kernel's is exhaustive) meets accuracy."""
    a, B, X, Y = problem
    res = sketchot.sinkhorn(a, B, X, Y, reg=0.02, backend="exact", accuracy=1e-4)
    assert res.accuracy_met.all() and len(res.true_kernel) == 4
    assert all(check.exhaustive for check in res.true_kernel)
    assert max(check.bound for check in res.true_kernel) <= 1e-4
    alone = _separate(a, B, X, Y, 0.02, backend="exact", accuracy=1e-4)
    # both within the accuracy of the same plan: values within its first-order effect
    np.testing.assert_allclose(res.value_linear, [r.value_linear for r in alone], rtol=1e-3)


def test_small_reg_runs_the_epsilon_schedule_and_stays_certified(problem):
    """max_cost / reg above the schedule's threshold: all targets annealed together, each
    certified (similar targets share the absorbed kernel)."""
    a, B, X, Y = problem
    B = 0.5 * B + 0.5 / 90  # alike targets: their scalings share the offsets
    res = sketchot.sinkhorn(a, B, X, Y, reg=2e-4, backend="exact")
    assert len(res.iteration_info["stages"]) > 1
    assert res.iteration_info["alone"] == []
    assert res.accuracy_met.all(), [c.bound for c in res.true_kernel]
    alone = _separate(a, B, X, Y, 2e-4, backend="exact")
    np.testing.assert_allclose(res.value_linear, [r.value_linear for r in alone], rtol=2e-3)


def test_targets_too_far_apart_are_solved_alone_and_said_so():
    """At a tiny reg, targets on disjoint parts of the support have scalings that no shared
    offsets represent: they are solved alone, and the note says which."""
    rng = np.random.default_rng(3)
    X, Y = rng.random((150, 2)), rng.random((100, 2))
    B = np.zeros((100, 2))
    B[Y[:, 0] < 0.3, 0] = 1.0
    B[Y[:, 0] > 0.7, 1] = 1.0
    B /= B.sum(axis=0)
    res = sketchot.sinkhorn(None, B, X, Y, reg=2e-4, backend="exact")
    alone = _separate(None, B, X, Y, 2e-4, backend="exact")
    assert res.accuracy_met.all()
    np.testing.assert_allclose(res.value_linear, [r.value_linear for r in alone], rtol=2e-3)
    if res.iteration_info["alone"]:
        assert any("solved alone" in note for note in res.notes)


def test_each_target_stops_on_its_own(problem):
    """A target started at its solution converges at the first check and keeps its
    potentials; the others run on."""
    a, B, X, Y = problem
    first = sketchot.sinkhorn(a, B, X, Y, reg=0.05, backend="exact", tol=TOL)
    log_u, log_v = (p.copy() for p in first.potentials)
    log_u[:, 1:] = 0.0
    log_v[:, 1:] = 0.0
    again = sketchot.sinkhorn(
        a, B, X, Y, reg=0.05, backend="exact", tol=TOL, warmstart=(log_u, log_v), check_every=1
    )
    assert again.n_iter[0] == 1 and np.all(again.n_iter[1:] > 1)
    # unchanged but for the rounding of the shared offsets' frame (exp, then log)
    np.testing.assert_allclose(
        again.potentials[1][:, 0], first.potentials[1][:, 0], rtol=1e-14, atol=1e-14
    )
    assert again.converged.all()


def test_unbalanced_targets_equal_separate_solves(problem):
    a, B, X, Y = problem
    B = B * np.array([1.0, 2.0, 0.5, 1.5])  # other masses: allowed with a finite reg_m
    together = sketchot.sinkhorn_unbalanced(a, B, X, Y, 0.05, 0.5, backend="exact", tol=TOL)
    alone = [
        sketchot.sinkhorn_unbalanced(a, B[:, j], X, Y, 0.05, 0.5, backend="exact", tol=TOL)
        for j in range(4)
    ]
    assert together.converged.all() and together.accuracy_met.all()
    np.testing.assert_allclose(together.value, [r.value for r in alone], rtol=VALUE_RTOL)
    np.testing.assert_allclose(together.mass, [r.mass for r in alone], rtol=VALUE_RTOL)


def _kernel_of(backend, X, Y, reg):
    """The backend's kernel on the colours, or on a regular grid for a backend that takes
    grids only (``None`` when it builds on neither)."""
    params = contract_params(backend)
    try:
        return sketchot.make_kernel(X, Y, reg, backend, rng=1, **params)
    except (ValueError, NotImplementedError, TypeError):
        pass
    side = np.linspace(0.0, 1.0, 10)
    grid = np.stack(np.meshgrid(side, side, indexing="ij"), axis=-1).reshape(-1, 2)
    try:
        return sketchot.make_kernel(grid, grid, reg, backend, rng=1, **params)
    except (ValueError, NotImplementedError, TypeError):
        return None


@pytest.mark.parametrize("backend", available_backends())
def test_every_backend_solves_several_targets_as_separate_solves(backend):
    """Every registered kernel: ``k`` targets on it equal ``k`` solves on the same kernel."""
    rng = np.random.default_rng(7)
    X, Y = rng.random((120, 3)), rng.beta(2.0, 5.0, size=(90, 3))
    kernel = _kernel_of(backend, X, Y, 0.5)
    if kernel is None:
        pytest.skip(f"backend {backend!r} builds on neither the colours nor a grid")
    m = kernel.shape[1]
    B = rng.random((m, 3)) + 0.1
    B /= B.sum(axis=0)
    a = np.full(kernel.shape[0], 1 / kernel.shape[0])
    with warnings.catch_warnings():
        # an approximation may miss the accuracy, or give impossible values (a signed
        # kernel's repairs): both ways alike
        warnings.simplefilter("ignore")
        together = sketchot.sinkhorn_kernel(a, B, kernel, tol=TOL, rng=0, errors="warn")
        alone = [
            sketchot.sinkhorn_kernel(a, B[:, j], kernel, tol=TOL, rng=0, errors="warn")
            for j in range(3)
        ]
    assert together.converged.all() == all(r.converged for r in alone)
    np.testing.assert_allclose(together.value_linear, [r.value_linear for r in alone], rtol=1e-6)
    # each target certified against the exact kernel, as its separate solve is
    np.testing.assert_allclose(
        [c.bound for c in together.true_kernel],
        [r.true_kernel.bound for r in alone],
        rtol=1e-3,
        atol=1e-8,
    )


def test_auto_chooses_and_certifies_every_target(problem):
    a, B, X, Y = problem
    res = sketchot.sinkhorn(a, B, X, Y, reg=0.1, rng=0)
    assert res.reason and res.accuracy_met.all()


def test_read_only_and_strided_b_give_the_same_bits(problem):
    a, B, X, Y = problem
    wide = np.zeros((90, 8))
    wide[:, ::2] = B
    strided = wide[:, ::2]
    frozen = B.copy()
    frozen.setflags(write=False)
    plain = sketchot.sinkhorn(a, B, X, Y, reg=0.05, backend="exact")
    for other in (strided, frozen, np.asfortranarray(B), B.tolist()):
        res = sketchot.sinkhorn(a, other, X, Y, reg=0.05, backend="exact")
        np.testing.assert_array_equal(res.value_linear, plain.value_linear)
    assert not frozen.flags.writeable and np.array_equal(frozen, B)


def test_the_same_call_twice_gives_the_same_bits(problem):
    a, B, X, Y = problem
    first = sketchot.sinkhorn(a, B, X, Y, reg=0.05, rng=3)
    second = sketchot.sinkhorn(a, B, X, Y, reg=0.05, rng=3)
    np.testing.assert_array_equal(first.value_linear, second.value_linear)
    np.testing.assert_array_equal(first.potentials[0], second.potentials[0])


def test_sinkhorn2_and_solve_sample_return_pots_values(problem):
    a, B, X, Y = problem
    values = sketchot.sinkhorn2(a, B, X, Y, reg=0.05, backend="exact", tol=TOL)
    assert isinstance(values, np.ndarray) and values.shape == (4,)
    res = sketchot.solve_sample(X, Y, a, B, reg=0.05, backend="exact", tol=TOL)
    np.testing.assert_array_equal(res.value_linear, values)
    log = res.log
    assert log["u"].shape == (120, 4) and log["v"].shape == (90, 4)
    np.testing.assert_allclose(np.log(log["u"]), log["log_u"])


def test_solve_on_a_cost_matrix_with_several_targets(problem):
    a, B, X, Y = problem
    M = ot.dist(X, Y)
    for reg_type in ("KL", "entropy"):
        res = sketchot.solve(M, a, B, reg=0.05, reg_type=reg_type, tol=TOL)
        alone = [
            sketchot.solve(M, a, B[:, j], reg=0.05, reg_type=reg_type, tol=TOL) for j in range(4)
        ]
        np.testing.assert_allclose(res.value, [r.value for r in alone], rtol=VALUE_RTOL)
        np.testing.assert_allclose(
            res.value_linear, [r.value_linear for r in alone], rtol=VALUE_RTOL
        )
    res = sketchot.solve(M, a, 2 * B, reg=0.05, unbalanced=0.5, tol=TOL)
    alone = [sketchot.solve(M, a, 2 * B[:, j], reg=0.05, unbalanced=0.5, tol=TOL) for j in range(4)]
    np.testing.assert_allclose(res.value, [r.value for r in alone], rtol=VALUE_RTOL)


def test_columns_of_another_mass_are_refused_by_name(problem):
    a, B, X, Y = problem
    B = B.copy()
    B[:, 2] *= 2.0
    with pytest.raises(ValueError, match=r"b\[:, 2\] sums to 2"):
        sketchot.sinkhorn(a, B, X, Y, reg=0.05)
    with pytest.raises(ValueError, match=r"b\[:, 2\] sums to 2.*unbalanced"):
        sketchot.solve_sample(X, Y, a, B, reg=0.05)


@pytest.mark.parametrize(
    ("b", "error", "match"),
    [
        (np.ones((89, 3)) / 89, ValueError, r"b must have shape \(90, k\).*got shape \(89, 3\)"),
        (np.ones((90, 3, 2)), ValueError, r"b must be"),
        (np.full((90, 2), "x"), TypeError, r"b must be a real array"),
        (-np.ones((90, 2)) / 90, ValueError, r"b\[:, 0\]"),
        (np.full((90, 2), np.nan), ValueError, r"b\[:, 0\]"),
    ],
)
def test_bad_targets_are_refused_by_name(problem, b, error, match):
    a, _, X, Y = problem
    with pytest.raises(error, match=match):
        sketchot.sinkhorn(a, b, X, Y, reg=0.05)


def test_combinations_not_built_are_refused_by_name(problem):
    a, B, X, Y = problem
    with pytest.raises(ValueError, match="without reg"):
        sketchot.solve_sample(X, Y, a, B)
    with pytest.raises(NotImplementedError, match="coarse_to_fine=True"):
        sketchot.sinkhorn(a, B, X, Y, reg=0.05, coarse_to_fine=True)
    with pytest.raises(NotImplementedError, match="log_domain=True"):
        sketchot.sinkhorn(a, B, X, Y, reg=0.5, backend="nystrom", rank=30, log_domain=True)
    with pytest.raises(ValueError, match=r"warmstart\[0\] must have shape \(120, 4\)"):
        sketchot.sinkhorn(a, B, X, Y, reg=0.5, warmstart=(np.zeros(120), np.zeros(90)))


def test_tensors_are_refused_by_name(problem):
    torch = pytest.importorskip("torch")
    a, B, X, Y = problem
    with pytest.raises(TypeError, match=r"several targets .* NumPy arrays; got X from torch"):
        sketchot.sinkhorn(a, B, torch.as_tensor(X), torch.as_tensor(Y), reg=0.5)


def test_dask_is_refused_by_name(problem):
    da = pytest.importorskip("dask.array")
    a, B, X, Y = problem
    with pytest.raises(NotImplementedError, match=r"several targets .* Dask"):
        sketchot.sinkhorn(a, B, da.from_array(X, chunks=60), Y, reg=0.5)


def test_one_column_is_one_target_in_pots_convention(problem):
    """``b`` of shape ``(m, 1)``: POT's ``n_hists = 1``, values of shape ``(1,)``."""
    a, B, X, Y = problem
    res = sketchot.sinkhorn(a, B[:, :1], X, Y, reg=0.5, backend="exact", tol=TOL)
    single = sketchot.sinkhorn(a, B[:, 0], X, Y, reg=0.5, backend="exact", tol=TOL)
    assert isinstance(res, TargetsResult) and res.value_linear.shape == (1,)
    np.testing.assert_allclose(res.value_linear[0], single.value_linear, rtol=VALUE_RTOL)
    with pytest.raises(ValueError, match=r"got shape \(90, 0\)"):
        sketchot.sinkhorn(a, B[:, :0], X, Y, reg=0.5)


def test_an_approximation_that_misses_is_told_to_use_auto_and_auto_meets(problem):
    """The advice of the warning is the one that works: the approximation's error names
    backend='auto', which then meets the accuracy for every target."""
    a, B, X, Y = problem
    with pytest.warns(sketchot.AccuracyWarning, match="backend='auto' sizes the kernel"):
        res = sketchot.sinkhorn(a, B, X, Y, reg=0.2, backend="nystrom", rank=25, rng=0)
    assert not res.accuracy_met.all()
    assert sketchot.sinkhorn(a, B, X, Y, reg=0.2, rng=0).accuracy_met.all()


@settings(max_examples=10, deadline=None)
@given(st.permutations(range(4)))
def test_the_order_of_the_targets_does_not_matter(order):
    """Invariant: permuting the columns of b permutes the answers (each target is solved on
    its own: its stop, its offsets-free values; the rounding of the BLAS products may
    differ by column position)."""
    rng = np.random.default_rng(11)
    X, Y = rng.random((60, 2)), rng.random((50, 2))
    B = rng.random((50, 4)) + 0.05
    B /= B.sum(axis=0)
    plain = sketchot.sinkhorn(None, B, X, Y, reg=0.05, backend="exact")
    moved = sketchot.sinkhorn(None, B[:, list(order)], X, Y, reg=0.05, backend="exact")
    np.testing.assert_allclose(moved.value_linear, plain.value_linear[list(order)], rtol=1e-12)
    np.testing.assert_array_equal(moved.n_iter, plain.n_iter[list(order)])


def test_negative_costs_with_several_targets_are_refused_by_name_and_the_remedy_holds():
    """The one-target path solves ``M - min(M)`` and puts the result back; the targets' path
    has no such step, so negative costs are refused (they were misreported as impossible
    results), and the remedy the message gives is checked: the shifted ``M`` gives the same
    plans, so ``M``'s one-target values are the shifted ones plus ``min(M)`` (mass 1)."""
    rng = np.random.default_rng(0)
    M = ot.dist(rng.random((30, 2)), rng.random((20, 2))) - 0.3
    B = rng.random((20, 3))
    B /= B.sum(axis=0)
    a = ot.unif(30)
    with pytest.raises(ValueError, match=r"^M has negative costs .* pass M - M.min\(\)"):
        sketchot.solve(M, a, B, reg=0.1)
    shifted = sketchot.solve(M - M.min(), a, B, reg=0.1, tol=1e-9)
    for k in range(3):
        alone = sketchot.solve(M, a, B[:, k].copy(), reg=0.1, tol=1e-9)
        # both stop at a 1e-9 residual: the linear costs agree to about that
        assert shifted.value_linear[k] + M.min() == pytest.approx(alone.value_linear, abs=1e-7)
