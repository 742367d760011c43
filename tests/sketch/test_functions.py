import math

import numpy as np
import pytest

from sketchot.sketch import CallableFunction, Exponential, Sigmoid, as_function


def test_exponential_taylor_closed_form():
    f = Exponential(scale=2.0, offset=-1.0)
    expected = [math.exp(2 * 0.3 - 1) * 2.0**j / math.factorial(j) for j in range(6)]
    np.testing.assert_allclose(f.taylor_coefficients(0.3, 5), expected, rtol=1e-14)


@pytest.mark.parametrize("center", [0.0, 0.7, -1.2])
def test_sigmoid_taylor_matches_contour_integral(center):
    """The closed-form recurrence and the Cauchy contour give the same coefficients."""
    closed = Sigmoid(scale=1.5).taylor_coefficients(center, 7)
    contour = CallableFunction(lambda t: 1 / (1 + np.exp(-1.5 * t)), taylor_radius=0.5)
    # trapezoidal rule on 64 nodes, radius 0.5 < pole distance pi/1.5: error ~ (0.5/2.09)^64
    np.testing.assert_allclose(contour.taylor_coefficients(center, 7), closed, atol=1e-12)


def test_sigmoid_is_stable_for_large_arguments():
    values = Sigmoid()(np.array([-1e4, 0.0, 1e4]))
    np.testing.assert_allclose(values, [0.0, 0.5, 1.0])


def test_as_function_resolves_names_and_callables():
    assert isinstance(as_function("exp"), Exponential)
    assert isinstance(as_function("sigmoid"), Sigmoid)
    assert isinstance(as_function(np.tanh), CallableFunction)
    with pytest.raises(ValueError, match="'exp', 'sigmoid' or a callable"):
        as_function("relu")
    with pytest.raises(TypeError, match="callable"):
        as_function(3)


def test_callable_must_be_elementwise():
    with pytest.raises(ValueError, match="element-wise"):
        CallableFunction(lambda t: np.sum(t))(np.ones(3))


def test_taylor_of_non_analytic_callable_is_a_clear_error():
    with pytest.raises(ValueError, match="complex"):
        CallableFunction(np.floor).taylor_coefficients(0.0, 3)
