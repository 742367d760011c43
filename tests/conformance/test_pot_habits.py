"""POT's documented defaults and conventions, each beside sketchot's answer on the same data.

One test per habit (issue 42, item 3): POT 0.9.7's call and sketchot's on the same small
clouds, asserting the same answer to a stated tolerance, or the difference that
``docs/user_guide/coming_from_pot.rst`` ("POT's functions and defaults") documents.
Sources: POT's docstrings of ``ot.solve_sample`` (``reg=None``: exact OT), ``ot.sinkhorn``
and ``ot.sinkhorn2`` (``reg`` required; ``b`` of shape ``(m, k)``; "returns a float of the
input's type"), and POT's backend convention (float32 in, float32 out; values of tensors
differentiable, ``ot.backend.Backend.set_gradients``).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchot

# A tight tolerance makes the entropic values match POT's to float64 rounding and makes the
# envelope gradient exact up to O(tol) (it holds at the optimum).
TOL = 1e-12


def clouds(n: int = 12, m: int = 9, d: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((n, d)), rng.random((m, d)) + 0.3


# ------------------------------------------------------------------ reg defaults
def test_solve_sample_without_reg_is_pots_exact_transport():
    """POT: ``ot.solve_sample(X, Y)`` (``reg=None``) solves exact OT. sketchot: the same call
    goes to POT's solver and returns POT's result, saying so in ``notes``."""
    X, Y = clouds()
    ours, pots = sketchot.solve_sample(X, Y), ot.solve_sample(X, Y)
    assert ours.notes == ["reg=None: exact transport solved by POT (ot.solve_sample)"]
    # the same solver on the same data: the same bits
    assert ours.value == pots.value and ours.value_linear == pots.value_linear
    np.testing.assert_array_equal(ours.plan, pots.plan)
    # and not the entropic solve at reg = 1 that sketchot used to return silently
    entropic = sketchot.solve_sample(X, Y, reg=1.0, tol=TOL).value
    assert abs(entropic - pots.value) > 0.1


def test_solve_sample_without_reg_passes_pots_options():
    """``unbalanced``, ``metric`` and ``max_iter`` mean what they mean in POT's exact solve."""
    X, Y = clouds()
    for kwargs in ({"unbalanced": 0.5}, {"metric": "euclidean"}, {"max_iter": 10_000}):
        ours, pots = sketchot.solve_sample(X, Y, **kwargs), ot.solve_sample(X, Y, **kwargs)
        assert ours.value == pots.value, kwargs
    ours = sketchot.solve_sample(X, Y, metric="minkowski", p=1.5)
    M = ot.dist(X, Y, metric="minkowski", p=1.5)
    assert ours.value == ot.solve(M).value


def test_solve_sample_without_reg_on_tensors_is_pots():
    """On tensors, POT's exact solve returns a differentiable ``value`` (POT's gradients);
    sketchot's call returns that same result."""
    torch = pytest.importorskip("torch")
    X, Y = clouds()
    ours_in, pots_in = (torch.tensor(X, requires_grad=True) for _ in range(2))
    ours = sketchot.solve_sample(ours_in, torch.tensor(Y)).value
    pots = ot.solve_sample(pots_in, torch.tensor(Y)).value
    ours.backward()
    pots.backward()
    assert float(ours.detach()) == float(pots.detach())
    torch.testing.assert_close(ours_in.grad, pots_in.grad, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"tol": 1e-6}, "tol"), ({"backend": "nystrom"}, "backend"),
     ({"rng": 0}, "rng"), ({"metric": lambda A, B: ot.dist(A, B)}, "callable")],
)  # fmt: skip
def test_solve_sample_without_reg_refuses_sketchots_options(kwargs, named):
    """sketchot's solver options mean nothing to POT's exact solver: refused, naming them."""
    X, Y = clouds()
    with pytest.raises(TypeError, match=rf"without reg.*{named}|{named}.*without reg"):
        sketchot.solve_sample(X, Y, **kwargs)


@pytest.mark.parametrize("name", ["sinkhorn", "sinkhorn2"])
def test_sinkhorn_requires_reg_as_pot(name):
    """POT: ``ot.sinkhorn(a, b, M)`` is a ``TypeError`` (``reg`` is required). sketchot's
    ``reg`` used to default to 1 silently; now a ``TypeError`` names it."""
    X, Y = clouds()
    a, b = ot.unif(len(X)), ot.unif(len(Y))
    with pytest.raises(TypeError, match="reg"):
        getattr(ot, name)(a, b, ot.dist(X, Y))
    with pytest.raises(TypeError, match=r"needs reg.*ot\.sinkhorn\(a, b, M, reg\)"):
        getattr(sketchot, name)(a, b, X, Y)


def test_sinkhorn_unbalanced_requires_reg_as_pot():
    """POT's ``ot.sinkhorn_unbalanced(a, b, M, reg, reg_m)``: both required, as sketchot's."""
    X, Y = clouds()
    with pytest.raises(TypeError, match="reg"):
        ot.sinkhorn_unbalanced(ot.unif(len(X)), ot.unif(len(Y)), ot.dist(X, Y))
    with pytest.raises(TypeError, match="reg"):
        sketchot.sinkhorn_unbalanced(None, None, X, Y)


# ---------------------------------------------------------------------- dtypes
def test_float32_points_give_float32_results_as_pot():
    """POT: float32 in, float32 out (plan, potentials, value). sketchot: the same dtypes (the
    iteration runs in float64; only what is returned is cast). Values agree to float32's
    rounding (rtol 1e-5: POT iterates in float32, about 1e-7 per operation)."""
    X, Y = (c.astype(np.float32) for c in clouds())
    ours = sketchot.solve_sample(X, Y, reg=0.1, tol=TOL)
    pots = ot.solve_sample(X, Y, reg=0.1, tol=1e-7, max_iter=10_000)
    assert isinstance(ours, sketchot.SinkhornResult)
    for name in ("plan", "value", "value_linear"):
        assert getattr(ours, name).dtype == getattr(pots, name).dtype == np.float32, name
    for mine, theirs in zip(ours.potentials, pots.potentials, strict=True):
        assert mine.dtype == theirs.dtype == np.float32
    assert ours.lazy_plan.matvec(np.ones(len(Y))).dtype == np.float32
    assert ours.marginals[0].dtype == np.float32
    np.testing.assert_allclose(ours.value, pots.value, rtol=1e-5)
    np.testing.assert_allclose(ours.plan, pots.plan, rtol=1e-4, atol=1e-8)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 12), m=st.integers(2, 12), reg=st.sampled_from([0.05, 0.3, 2.0]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_float32_results_are_the_float64_solve_cast(n, m, reg, seed):
    """Only what is returned is cast: float32 points give exactly the float64 solve of the
    same numbers, rounded to float32 (arrays and values)."""
    X, Y = (c.astype(np.float32) for c in clouds(n, m, seed=seed))
    ours = sketchot.solve_sample(X, Y, reg=reg, backend="exact")
    wide = sketchot.solve_sample(X.astype(np.float64), Y.astype(np.float64), reg=reg,
                                 backend="exact")  # fmt: skip
    np.testing.assert_array_equal(ours.plan, wide.plan.astype(np.float32))
    np.testing.assert_array_equal(ours.potentials[1], wide.potentials[1].astype(np.float32))
    assert ours.value == np.float32(wide.value) and ours.host.value == wide.value


def test_float64_results_stay_plain():
    """float64 points: the result object itself, Python float values (no view, no cast)."""
    X, Y = clouds()
    ours = sketchot.solve_sample(X, Y, reg=0.1)
    assert type(ours) is sketchot.SinkhornResult and type(ours.value) is float
    assert ours.plan.dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sinkhorn2_returns_a_scalar_of_the_inputs_dtype_as_pot(dtype):
    """POT's ``sinkhorn2`` returns a NumPy scalar of the input's dtype; so does sketchot's
    (``numpy.float64`` is a ``float``: ``round`` and ``float`` keep working). Same value to
    POT's own convergence (``stopThr`` 1e-9 for float64, float32's rounding otherwise)."""
    X, Y = (c.astype(dtype) for c in clouds())
    a, b = ot.unif(len(X), type_as=X), ot.unif(len(Y), type_as=X)
    ours = sketchot.sinkhorn2(a, b, X, Y, reg=0.1, tol=TOL)
    # float32 iterations stall near 1e-7: stopThr 1e-6 there, POT's default 1e-9 otherwise
    stop = 1e-6 if dtype == np.float32 else 1e-9
    pots = ot.sinkhorn2(a, b, ot.dist(X, Y), 0.1, method="sinkhorn_log", stopThr=stop,
                        numItermax=10_000)  # fmt: skip
    assert type(ours) is type(pots) is np.dtype(dtype).type
    rtol = 1e-5 if dtype == np.float32 else 1e-8
    np.testing.assert_allclose(ours, pots, rtol=rtol)
    assert isinstance(sketchot.sinkhorn2(None, None, X.astype(np.float64), Y, reg=0.1), float)


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_tensor_values_are_0d_tensors_as_pot(dtype_name):
    """POT's torch backend: ``sinkhorn2`` and ``OTResult.value`` are 0-d tensors of the
    inputs' dtype; sketchot's too."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    X, Y = (torch.tensor(c, dtype=dtype) for c in clouds())
    pots = ot.sinkhorn2(ot.unif(len(X), type_as=X), ot.unif(len(Y), type_as=X),
                        ot.dist(X, Y), 0.1)  # fmt: skip
    for value in (sketchot.sinkhorn2(None, None, X, Y, reg=0.1),
                  sketchot.solve_sample(X, Y, reg=0.1).value,
                  sketchot.solve_sample(X, Y, reg=0.1).value_linear):  # fmt: skip
        assert isinstance(value, torch.Tensor) and value.shape == pots.shape == ()
        assert value.dtype == pots.dtype == dtype


# -------------------------------------------------------------------- autograd
def _directional(f, x, direction, h):
    """Central difference of ``f`` at ``x`` along ``direction`` (error O(h^2))."""
    return (f(x + h * direction) - f(x - h * direction)) / (2 * h)


def _value(X, Y, a=None, b=None, **kwargs):
    return sketchot.solve_sample(X, Y, a, b, reg=0.1, backend="exact", tol=TOL, **kwargs).value


@pytest.mark.parametrize("unbalanced", [None, 0.7, (np.inf, 0.7)])
def test_value_gradient_matches_finite_differences(unbalanced):
    """``solve_sample(...).value`` on tensors is differentiable w.r.t. ``X``, ``Y``, ``a``,
    ``b``, and its gradient is that of the value returned: central differences (h = 1e-4,
    truncation ~h^2 / reg^2 = 1e-6 relative; solver noise reg * tol / h = 1e-9) along random
    directions agree to rtol 1e-5. Balanced transport is defined on sum a = sum b only:
    weights are perturbed along mass-preserving directions there."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    X, Y = clouds()
    a = rng.random(len(X)) + 0.5
    b = rng.random(len(Y)) + 0.5
    a, b = a / a.sum(), b / b.sum()
    tensors = [torch.tensor(v, requires_grad=True) for v in (X, Y, a, b)]
    value = _value(*tensors, unbalanced=unbalanced)
    grads = torch.autograd.grad(value, tensors)
    h = 1e-4
    for index, (point, grad) in enumerate(zip((X, Y, a, b), grads, strict=True)):
        direction = rng.standard_normal(point.shape)
        if index >= 2 and unbalanced is None:
            direction -= direction.mean()  # keeps sum a = sum b

        def f(moved, index=index):
            args = [X, Y, a, b]
            args[index] = moved
            return _value(*args, unbalanced=unbalanced)

        fd = _directional(f, point, direction, h)
        exact = float((grad.numpy() * direction).sum())
        assert exact == pytest.approx(fd, rel=1e-5, abs=1e-9), ("XYab"[index], unbalanced)


def test_weight_gradient_holds_for_other_costs():
    """The weights' gradient (dual potentials) does not depend on the cost: with
    ``metric='euclidean'`` it matches central differences as above (the points' gradient is
    refused there, see below)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    X, Y = clouds()
    a = rng.random(len(X)) + 0.5
    a /= a.sum()
    tensor = torch.tensor(a, requires_grad=True)
    kwargs = {"metric": "euclidean", "unbalanced": 0.7}
    (grad,) = torch.autograd.grad(_value(X, Y, tensor, **kwargs), tensor)
    direction = rng.standard_normal(a.shape)
    fd = _directional(lambda w: _value(X, Y, w, **kwargs), a, direction, 1e-4)
    assert float(grad.numpy() @ direction) == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_value_gradient_matches_pots_torch_gradient():
    """POT's ``ot.solve_sample(X, Y, reg=...)`` on tensors: ``value`` differentiable through
    ``ot.dist``; the gradients w.r.t. the points agree with sketchot's (both are the
    envelope gradient at convergence: rtol 1e-6 at POT's tol 1e-12)."""
    torch = pytest.importorskip("torch")
    X, Y = clouds()
    ours_in = [torch.tensor(v, requires_grad=True) for v in (X, Y)]
    pots_in = [torch.tensor(v, requires_grad=True) for v in (X, Y)]
    ours = sketchot.solve_sample(*ours_in, reg=0.1, tol=TOL).value
    pots = ot.solve_sample(*pots_in, reg=0.1, tol=1e-12, max_iter=100_000).value
    assert float(ours.detach()) == pytest.approx(float(pots.detach()), rel=1e-8)
    for mine, theirs in zip(torch.autograd.grad(ours, ours_in),
                            torch.autograd.grad(pots, pots_in), strict=True):  # fmt: skip
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-10)


def test_value_gradient_float32_and_auto_backend():
    """float32 tensors: the value and its gradients in float32; ``backend='auto'`` solves with
    the exact kernel when a tensor requires grad (and says so in ``backend``)."""
    torch = pytest.importorskip("torch")
    X, Y = (torch.tensor(c, dtype=torch.float32, requires_grad=True) for c in clouds())
    res = sketchot.solve_sample(X, Y, reg=0.1)
    assert res.backend == "exact" and res.value.dtype == torch.float32
    assert "X requires grad" in res.notes[-1]
    res.value.backward()
    assert X.grad.dtype == torch.float32 and torch.isfinite(X.grad).all()


def test_sinkhorn2_refuses_gradients_naming_the_value():
    """``sinkhorn2`` returns ``<P, M>``: not the value whose gradient the envelope theorem
    gives. Refused with the alternative named (POT's torch backend gives <P, M> the
    envelope gradient of the entropic value, a gradient of another number)."""
    torch = pytest.importorskip("torch")
    X, Y = clouds()
    with pytest.raises(TypeError, match=r"X requires grad.*solve_sample\(.*\)\.value"):
        sketchot.sinkhorn2(None, None, torch.tensor(X, requires_grad=True), Y, reg=0.1)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [({"metric": "euclidean"}, TypeError, "metric='sqeuclidean' only"),
     ({"backend": "nystrom", "rng": 0, "reg": 2.0}, TypeError, "'nystrom' approximates"),
     ({"backend": "exact", "max_iter": 2, "errors": "warn"}, RuntimeError, "convergence only")],
)  # fmt: skip
def test_value_gradient_refused_where_it_is_not_the_envelope(kwargs, error, match):
    """Another cost (positions), an approximate kernel, an unconverged iteration: no
    gradient is returned that is not the gradient of the value returned."""
    torch = pytest.importorskip("torch")
    X, Y = clouds()
    with pytest.raises(error, match=match), pytest.warns() if "errors" in kwargs else nullcontext():
        kwargs = {"reg": 0.1, **kwargs}
        sketchot.solve_sample(torch.tensor(X, requires_grad=True), Y, **kwargs)


# ------------------------------------------------------------- several targets
def test_several_targets_give_k_values():
    """POT: ``ot.sinkhorn2(a, b, M, reg)`` with ``b`` of shape ``(m, k)`` returns ``k``
    values; sketchot's ``sinkhorn2`` too (one call on one kernel,
    :mod:`sketchot.solver.targets`). Exact transport (no ``reg``) takes one target: a
    ``ValueError`` names ``b``, the shape expected and the one received."""
    X, Y = clouds()
    a, B = ot.unif(len(X)), np.tile(ot.unif(len(Y))[:, None], (1, 3))
    assert ot.sinkhorn2(a, B, ot.dist(X, Y), 0.1).shape == (3,)
    assert sketchot.sinkhorn2(a, B, X, Y, reg=0.1).shape == (3,)
    assert sketchot.sinkhorn(a, B, X, Y, reg=0.1).value_linear.shape == (3,)
    assert sketchot.solve_sample(X, Y, a, B, reg=0.1).value.shape == (3,)
    match = r"^b must have shape \(m,\) = \(9,\) without reg; got shape \(9, 3\)"
    with pytest.raises(ValueError, match=match):
        sketchot.solve_sample(X, Y, a, B)
