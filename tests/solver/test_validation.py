"""Every bad input gets a clear error that names the argument."""

import numpy as np
import pytest

from sketchot import make_kernel, sinkhorn, sinkhorn_kernel

RNG = np.random.default_rng(0)
X = RNG.random((10, 3))
Y = RNG.random((8, 3))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"Y": RNG.random((8, 2))}, ValueError, "Y must have 3 columns"),
        ({"X": np.ones(5)}, ValueError, "X must be a 2-D array"),
        ({"X": np.ones((0, 3))}, ValueError, "X must be non-empty"),
        (
            {"X": np.array([[np.nan, 0, 0]] + [[0, 0, 0]] * 9)},
            ValueError,
            "X must contain only finite",
        ),
        ({"Y": np.full((8, 3), np.inf)}, ValueError, "Y must contain only finite"),
        ({"X": [["a", "b", "c"]]}, TypeError, "X must be a real numeric array"),
        ({"a": -np.ones(10)}, ValueError, "a must be non-negative"),
        ({"a": np.ones(9) / 9}, ValueError, r"a must have one weight per row of X \(10\)"),
        # (m, k) is k targets (POT's several histograms: tests/solver/test_targets.py)
        ({"b": np.ones((8, 1, 1))}, ValueError, "b must be a 1-D array"),
        ({"b": np.full(8, np.nan)}, ValueError, "b must contain only finite"),
        ({"b": np.ones(8)}, ValueError, "same total mass"),
        ({"a": np.zeros(10)}, ValueError, "a must have a positive total mass"),
        ({"reg": 0.0}, ValueError, "reg must be > 0"),
        ({"reg": -1.0}, ValueError, "reg must be > 0"),
        ({"reg": np.nan}, ValueError, "reg must be finite"),
        ({"reg": "1"}, TypeError, "reg must be a real number"),
        # issue 42: Python reads "1" and True as 1.0; NumPy's own message for "float8"
        ({"reg_m": "1"}, TypeError, r"reg_m must be None, a real number .* got '1' \(str\)"),
        ({"reg_m": (1.0, False)}, TypeError, r"reg_m must be .*\(the b side: False \(bool\)\)"),
        ({"dtype": "float8"}, TypeError, "dtype must be numpy.float64 or numpy.float32"),
        ({"backend": "greenkhorn"}, ValueError, "backend must be .auto. or one of"),
        ({"max_iter": 0}, ValueError, "max_iter must be >= 1"),
        ({"tol": 0.0}, ValueError, "tol must be > 0"),
        ({"safeguard": "ignore"}, ValueError, "safeguard must be one of"),
        ({"log_domain": "yes"}, ValueError, "log_domain must be"),
        (
            {"backend": "rff", "log_domain": True},
            ValueError,
            r"log_domain=True needs a kernel with the .absorb. or .log_products. capability",
        ),
        ({"backend": "rff", "n_features": 0}, ValueError, "n_features must be >= 1"),
        ({"backend": "nystrom", "n_landmarks": 19}, ValueError, "n_landmarks must be <= 18"),
        ({"backend": "polyts", "degree": -1}, ValueError, "degree must be >= 0"),
        ({"backend": "polyts", "sketch_dim": 0}, ValueError, "sketch_dim must be >= 1"),
        ({"backend": "polyts", "coreset_size": 0}, ValueError, "coreset_size must be >= 1"),
        ({"backend": "polyts", "coefficients": "svd"}, ValueError, "coefficients must be one of"),
        (
            {"backend": "exact", "n_features": 3},
            TypeError,
            "unexpected keyword argument.*n_features",
        ),
    ],
)
def test_bad_input(kwargs, error, message):
    args = {"a": None, "b": None, "X": X, "Y": Y, "reg": 1.0, "backend": "exact"}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        sinkhorn(**args)


def test_integer_pixels_are_accepted():
    pixels = np.random.default_rng(1).integers(0, 256, size=(12, 3), dtype=np.uint8)
    result = sinkhorn(None, None, pixels, pixels[::-1], reg=5000.0, backend="exact")
    assert result.converged and result.kernel.geometry.X.dtype == np.float64


def test_sinkhorn_kernel_checks_its_kernel():
    with pytest.raises(TypeError, match="kernel must be a sketchot KernelOperator"):
        sinkhorn_kernel(None, None, np.ones((3, 3)))
    op = make_kernel(X, Y, 1.0, "exact")
    with pytest.raises(ValueError, match=r"a must have one weight per row of X \(10\)"):
        sinkhorn_kernel(np.ones(3) / 3, None, op)
