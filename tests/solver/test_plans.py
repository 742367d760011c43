"""sketchot.solver.plans: the primal-dual gap shared by the loss and the divergence matrix,
and the plan summary's three forms (stored absorbed kernel, log form, linear products; the
plan products of every backend: tests/kernels/test_contract.py)."""

import numpy as np
import pytest
from backend_params import contract_clouds, contract_params
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot
from sketchot._parallel import thread_limit
from sketchot.kernels import available_backends
from sketchot.solver import make_problem, plan_summary, plans
from sketchot.solver.engine import iterate
from sketchot.solver.plans import first_moments, value_error_estimate


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shift=st.floats(-50.0, 50.0))
def test_balanced_gap_ignores_the_potentials_gauge(seed, shift):
    """Balanced potentials are defined up to (f + s, g - s): the estimate is the same."""
    rng = np.random.default_rng(seed)
    f, g = rng.normal(size=(3, 7)), rng.normal(size=(3, 5))
    ea, eb = rng.random(3), rng.random(3)
    np.testing.assert_allclose(
        value_error_estimate(f + shift, g - shift, ea, eb), value_error_estimate(f, g, ea, eb),
        rtol=1e-9, atol=1e-9 * abs(shift),
    )  # fmt: skip


def test_the_estimate_by_hand_and_empty_sides():
    f = np.array([[1.0, 3.0, np.nan]])  # midpoint 2: max |f - 2| = 1
    g = np.array([[-1.0, -4.0]])  # max |g + 2| = 2
    assert value_error_estimate(f, g, 0.1, 0.01)[0] == 0.1 * 1 + 0.01 * 2
    assert value_error_estimate(f, g, 0.1, 0.01, balanced=False)[0] == 0.1 * 3 + 0.01 * 4
    assert value_error_estimate(np.full((1, 2), np.nan), g, 1.0, 1.0)[0] == 0.0


# ------------------------------------------------------------------ plan summaries
# Tolerances: the summaries below differ only in the order of float64 sums over at most
# 300 x 250 entries (relative rounding ~1e-13) or in exp(a + b) against exp(a) exp(b).


def _absorbed_state(reg=0.003, n=300, m=250, seed=0):
    """An exact kernel at a small reg and the absorbed iterate it converged to."""
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 2)), rng.random((m, 2)) * 0.8
    kernel = sketchot.make_kernel(X, Y, reg, "exact")
    problem = make_problem(np.full(n, 1 / n), np.full(m, 1 / m), kernel.shape, reg)
    state = iterate(kernel, problem, tol=1e-9, max_iter=2000, strategy="absorb")
    assert state.converged and state.absorbed is not None
    return kernel, state


def _assert_same_summary(summary, reference, rtol=1e-10):
    np.testing.assert_allclose(summary.row_marginal, reference.row_marginal, rtol=rtol)
    np.testing.assert_allclose(summary.col_marginal, reference.col_marginal, rtol=rtol)
    assert summary.cost == pytest.approx(reference.cost, rel=rtol)
    assert summary.mass == pytest.approx(reference.mass, rel=rtol)
    for name in ("row_moments", "col_moments"):
        scale = np.abs(getattr(reference, name)).max()
        np.testing.assert_allclose(
            getattr(summary, name), getattr(reference, name), rtol=rtol, atol=rtol * scale
        )


def test_summary_from_the_stored_absorbed_kernel_equals_the_log_form():
    """The plan read from the absorbed kernel's stored entries (two BLAS products) is the
    plan recomputed entry by entry in log form."""
    kernel, state = _absorbed_state()
    assert plans._stored_scalings(state.absorbed, state.log_u, state.log_v) is not None
    stored = plan_summary(kernel, state.log_u, state.log_v, absorbed=state.absorbed)
    _assert_same_summary(stored, plans._log_form_summary(kernel, state.log_u, state.log_v))


def test_summary_refuses_absorbed_offsets_far_from_the_scalings():
    """Scalings far from the absorbed offsets (or a float32 store) fall back to the log
    form: exp of the difference would overflow."""
    kernel, state = _absorbed_state()
    far = state.log_u + 1000.0
    assert plans._stored_scalings(state.absorbed, far, state.log_v) is None
    g = kernel.geometry
    single = sketchot.make_kernel(g.X, g.Y, g.reg, "exact", dtype=np.float32)
    absorbed = single.absorbed(state.absorbed.alpha, state.absorbed.beta)
    assert absorbed.is_dense
    assert plans._stored_scalings(absorbed, state.log_u, state.log_v) is None


def test_summary_of_one_huge_scaling_is_finite():
    """u beyond float64's range with a small v (their sum of logs in range) used to go to
    the linear form and give NaN (inf u times an underflowed K v): it is the log form now."""
    kernel, state = _absorbed_state()
    shift = 720.0 - state.log_u.max()  # log u up to 720: exp overflows
    log_u, log_v = state.log_u + shift, state.log_v - shift
    assert plans._log_form(kernel, log_u, log_v)
    summary = plan_summary(kernel, log_u, log_v)
    assert np.isfinite(summary.cost) and np.all(np.isfinite(summary.row_marginal))
    reference = plans._log_form_summary(kernel, state.log_u, state.log_v)
    _assert_same_summary(summary, reference, rtol=1e-9)


def test_log_form_summary_is_the_same_with_any_number_of_threads():
    kernel, state = _absorbed_state(n=2100, m=2050, reg=0.01)  # above the threaded size
    with thread_limit(1):
        one = plan_summary(kernel, state.log_u, state.log_v)
    with thread_limit(2):
        two = plan_summary(kernel, state.log_u, state.log_v)
    assert one.cost == two.cost
    assert np.array_equal(one.col_marginal, two.col_marginal)
    assert np.array_equal(one.col_moments, two.col_moments)


@pytest.mark.parametrize("fused", [False, True], ids=["blocks", "fused"])
@pytest.mark.usefixtures("device_operators")
def test_a_device_kernels_log_form_summary_stays_on_its_device(fused, request, monkeypatch):
    """An exact kernel on tensors gives the log-form summary and plan products from its own
    'log_means' and log passes (no block of the plan on the host): the host's entry-by-entry
    summary to rounding (sums in other orders over 300 x 250 entries; scalings near e^720)."""
    torch = pytest.importorskip("torch")
    from sketchot._arrays import array_context

    if fused:
        request.getfixturevalue("fused_interpreter")
    kernel, state = _absorbed_state()
    shift = 720.0 - state.log_u.max()  # exp(log u) overflows: the log form
    log_u, log_v = state.log_u + shift, state.log_v - shift
    g = kernel.geometry
    on_device = sketchot.gibbs.GibbsGeometry(g.X, g.Y, g.reg)
    on_device.context = array_context(X=torch.as_tensor(g.X))
    device = sketchot.kernels.exact.build_exact(on_device, max_dense_bytes=0)
    assert device.on_device and device.fused == fused
    assert plans._log_form(device, log_u, log_v)

    def no_host_blocks(*args, **kwargs):
        raise AssertionError("a block of the plan was computed on the host")

    monkeypatch.setattr(plans, "_log_form_summary", no_host_blocks)
    monkeypatch.setattr(plans, "_log_blocks", no_host_blocks)
    summary = plan_summary(device, log_u, log_v)
    monkeypatch.undo()
    _assert_same_summary(summary, plans._log_form_summary(kernel, log_u, log_v), rtol=1e-9)
    V = np.random.default_rng(6).standard_normal((250, 2))
    np.testing.assert_allclose(
        plans.LazyPlan(device, log_u, log_v).matmat(V),
        plans.LazyPlan(kernel, log_u, log_v).matmat(V), rtol=1e-9, atol=1e-12,
    )  # fmt: skip
    rows = first_moments(device, log_u, log_v, summary.row_marginal)
    np.testing.assert_allclose(rows, summary.row_moments, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", available_backends())
def test_first_moments_are_the_plans_products(colours, backend):
    """P Yc and P^T Xc through each backend's products (the means of one product where the
    kernel declares 'log_means', else one log product per coordinate for log-domain
    approximations, both tried) equal the dense plan's, to 1e-9 relative (rounding of sums
    over 120 x 90 entries)."""
    X, Y = contract_clouds(backend, *colours)
    kernel = sketchot.make_kernel(X, Y, 0.5, backend, rng=1, **contract_params(backend))
    rng = np.random.default_rng(4)
    log_u, log_v = rng.normal(size=120), rng.normal(size=90)
    plan = np.exp(log_u)[:, None] * kernel.to_dense() * np.exp(log_v)[None, :]
    g = kernel.geometry
    rows = first_moments(kernel, log_u, log_v, plan.sum(1))
    cols = first_moments(kernel, log_u, log_v, plan.sum(0), transpose=True)
    np.testing.assert_allclose(rows, plan @ g.Yc, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cols, plan.T @ g.Xc, rtol=1e-9, atol=1e-12)
    if "log_means" in kernel.info.capabilities:
        kernel.info.capabilities -= {"log_means"}  # the per-coordinate products
        per_coordinate = first_moments(kernel, log_u, log_v, plan.sum(1))
        np.testing.assert_allclose(per_coordinate, rows, rtol=1e-9, atol=1e-12)
