"""NumPy users' habits with ``sketchot.sinkhorn_divergence`` and ``SinkhornDivergence``: a
gradient flow that moves its array in place (``X -= step * res.grad_X``), gradients read
after the array moved, read-only and non-contiguous arrays, float32 clouds, the same call
twice. Each answer is compared with a fresh solve of the data as it is at the call (the
fresh solve itself is checked against the dense reference in ``tests/test_loss.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import sketchot

# exact kernel to tol 1e-12: warm and fresh solves meet within ~1e-12 of the same potentials
TIGHT = {"backend": "exact", "tol": 1e-12, "max_iter": 100_000}
REG = 0.02


def clouds(seed: int, n: int = 60, m: int = 50):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 2)), 0.3 * rng.standard_normal((m, 2)) + [2.0, 1.0]


def fresh(X, Y, *weights, **options):
    return sketchot.sinkhorn_divergence(X.copy(), Y.copy(), *weights, reg=REG, **TIGHT, **options)


def assert_same(res, ref, rtol=1e-8):
    assert res.value == pytest.approx(ref.value, rel=rtol, abs=1e-12)
    scale = np.abs(ref.grad_X).max()
    np.testing.assert_allclose(res.grad_X, ref.grad_X, rtol=rtol, atol=1e-9 * scale)
    np.testing.assert_allclose(res.grad_Y, ref.grad_Y, rtol=rtol, atol=1e-9 * scale)


def test_a_gradient_flow_in_place_equals_a_fresh_solve_each_step():
    """``X -= step * loss(X, Y).grad_X`` with one ``SinkhornDivergence``: before issue 42 the
    second call returned the first's value (its "nothing moved" test compared X with its own
    view): 5.85 where a fresh solve gave 0.00065."""
    X, Y = clouds(0)
    loss = sketchot.SinkhornDivergence(REG, **TIGHT)
    values = []
    for _ in range(6):
        res = loss(X, Y)
        assert_same(res, fresh(X, Y))
        values.append(res.value)
        X -= 0.5 * len(X) * res.grad_X
    assert values[-1] < 0.01 * values[0]


def test_gradients_read_after_the_array_moved_are_those_of_the_call():
    """``grad_X`` is computed when first read: from the call's clouds, not the caller's
    array as it is by then (``debias=False``: the gradient ``2 (r x - P y)`` shows a moved
    ``x``; the debiased balanced one cancels a shift of its own cloud)."""
    X, Y = clouds(1)
    ref = fresh(X, Y, debias=False)
    res = sketchot.sinkhorn_divergence(X, Y, reg=REG, debias=False, **TIGHT)
    X += 1.0
    Y *= 2.0
    assert_same(res, ref, rtol=1e-12)  # the same solve on equal copies


def test_the_result_holds_no_view_of_the_callers_arrays():
    X, Y = clouds(2)
    a, b = np.full(len(X), 1 / len(X)), np.full(len(Y), 1 / len(Y))
    res = sketchot.sinkhorn_divergence(X, Y, a, b, reg=REG, **TIGHT)
    for result in res.results.values():
        g = result.kernel.geometry
        for held in (g.X, g.Y, result.a, result.b):
            assert not any(np.shares_memory(held, mine) for mine in (X, Y, a, b))


def test_moved_weights_are_seen():
    """Weights changed in place between calls (``a *= ...``): the object solves again."""
    X, Y = clouds(3)
    a, b = np.full(len(X), 1 / len(X)), np.full(len(Y), 1 / len(Y))
    loss = sketchot.SinkhornDivergence(REG, **TIGHT)
    loss(X, Y, a, b)
    a[: len(a) // 2] *= 1.5
    a /= a.sum()
    assert_same(loss(X, Y, a, b), fresh(X, Y, a, b))


def test_read_only_arrays():
    """``arr.flags.writeable = False`` (memory-mapped data, shared arrays): accepted, the
    same numbers as writable copies, and the caller's arrays untouched."""
    X, Y = clouds(4)
    ref = fresh(X, Y)
    for arr in (X, Y):
        arr.flags.writeable = False
    assert_same(sketchot.sinkhorn_divergence(X, Y, reg=REG, **TIGHT), ref, rtol=1e-12)
    loss = sketchot.SinkhornDivergence(REG, **TIGHT)
    assert_same(loss(X, Y), ref, rtol=1e-12)
    assert_same(loss(X + 0.1, Y), fresh(X + 0.1, Y))


@pytest.mark.parametrize("layout", ["fortran", "sliced", "float32"])
def test_non_contiguous_and_float32_arrays(layout):
    X, Y = clouds(5)
    if layout == "fortran":
        P = np.asfortranarray(X)
    elif layout == "sliced":
        big = np.zeros((2 * len(X), 3))
        big[::2, 1:] = X
        P = big[::2, 1:]
    else:
        X = X.astype(np.float32)
        P = X
    res = sketchot.sinkhorn_divergence(P, Y, reg=REG, **TIGHT)
    assert_same(res, fresh(np.ascontiguousarray(X, dtype=np.float64), Y), rtol=1e-12)


def test_the_same_call_twice_gives_the_same_bits():
    X, Y = clouds(6)
    first = sketchot.sinkhorn_divergence(X, Y, reg=REG, **TIGHT)
    second = sketchot.sinkhorn_divergence(X, Y, reg=REG, **TIGHT)
    assert first.value == second.value
    assert np.array_equal(first.grad_X, second.grad_X)
    loss = sketchot.SinkhornDivergence(REG, **TIGHT)
    once, again = loss(X, Y), loss(X, Y)
    assert once.value == again.value and np.array_equal(once.grad_X, again.grad_X)
    assert all(again.warm.values())  # kept: nothing moved
