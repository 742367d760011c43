"""The fused Triton passes (:mod:`sketchot.fused`) against dense NumPy/SciPy sums: under
Triton's interpreter on CPU tensors (``fused_interpreter``), compiled on a CUDA device where
there is one (the same tests, the same tolerances)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

torch = pytest.importorskip("torch")

#: float64 passes sum the same exponentials in another order: agreement to rounding
RTOL64 = 1e-12
#: float32: each logit carries ~1e-7 of its magnitude (here <= 60) in rounding, the norm
#: form (d > 8) the cancellation of |x|^2 + |y|^2 - 2 x.y on top
ATOL32 = {3: 2e-5, 12: 3e-4}


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    """Where the fused program runs: the interpreter on the CPU, compiled on CUDA."""
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        return "cuda"
    request.getfixturevalue("fused_interpreter")
    return "cpu"


def clouds(n, m, d, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, d)), rng.beta(2.0, 5.0, size=(m, d)), rng.normal(size=m)


def fused_points(device, dtype, *arrays):
    from sketchot.fused import FusedPoints

    return [FusedPoints(torch.as_tensor(a, device=device), dtype) for a in arrays]


def cost(X, Y, sqrt=False):
    C = ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    return np.sqrt(C) if sqrt else C


@pytest.mark.parametrize("d", [3, 12], ids=["differences", "norms"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("sqrt", [False, True], ids=["sqeuclidean", "euclidean"])
def test_one_pass_gives_the_log_sums_the_softmax_averages_and_the_products(device, d, dtype, sqrt):
    from sketchot.fused import TILE_CANDIDATES, fused_rows

    X, Y, log_w = clouds(150, 170, d)
    log_w[[3, 40]] = -np.inf  # zero weights
    V = np.random.default_rng(1).standard_normal((170, 3))
    reg = 0.05
    rows, cols = fused_points(device, getattr(torch, dtype), X, Y)
    logits = log_w[None, :] - cost(X, Y, sqrt) / reg
    lse, top, sums = fused_rows(rows, cols, reg, sqrt=sqrt, log_w=torch.as_tensor(log_w),
                                values=torch.as_tensor(V))  # fmt: skip
    lse, top, sums = (t.double().cpu().numpy() for t in (lse, top, sums))
    expected = logsumexp(logits, axis=1)
    softmax = np.exp(logits - expected[:, None]) @ V
    atol = 0.0 if dtype == "float64" else ATOL32[d]
    rtol = RTOL64 if dtype == "float64" else 0.0
    np.testing.assert_allclose(lse, expected, rtol=rtol, atol=atol)
    np.testing.assert_allclose(top, logits.max(axis=1), rtol=rtol, atol=atol)
    # the log-sum-exp passes in every candidate tile: per-entry state, the loop or tl.dot
    # (the squared cost's cases: each tile compiles on a GPU, and the square root is tiled
    # alike)
    for tile in TILE_CANDIDATES if not sqrt else TILE_CANDIDATES[:1]:
        try:
            alone, _, _ = fused_rows(rows, cols, reg, sqrt=sqrt, log_w=torch.as_tensor(log_w),
                                     tile=tile)  # fmt: skip
        except Exception:  # a tile a GPU's compiler refuses is skipped, as the timing does
            if device == "cpu" or tile == TILE_CANDIDATES[0]:
                raise
            continue
        np.testing.assert_allclose(alone.double().cpu().numpy(), expected, rtol=rtol,
                                   atol=atol, err_msg=str(tile))  # fmt: skip
    np.testing.assert_allclose(sums / np.exp(lse - top)[:, None], softmax, rtol=rtol,
                               atol=(atol or RTOL64) * np.abs(V).max())  # fmt: skip
    # no log weights: exp(t) s is the linear product K V
    _, top, sums = fused_rows(rows, cols, reg, sqrt=sqrt, values=torch.as_tensor(V))
    K = np.exp(-cost(X, Y, sqrt) / reg)
    product = (torch.exp(top)[:, None] * sums).double().cpu().numpy()
    # signed sums: their rounding is relative to sum_j K_ij |V_j|, not to the sum itself
    scale = K @ np.abs(V)
    assert np.all(np.abs(product - K @ V) <= (RTOL64 if dtype == "float64" else 1e-4) * scale)


def test_rows_without_weight_and_empty_sides(device):
    from sketchot.fused import MAX_COLUMNS, fused_rows

    X, Y, _ = clouds(20, 30, 3)
    rows, cols = fused_points(device, torch.float64, X, Y)
    nothing = torch.full((30,), -np.inf, dtype=torch.float64)
    empty = fused_points(device, torch.float64, np.zeros((0, 3)))[0]
    lse, top, sums = fused_rows(rows, cols, 0.1, log_w=nothing)
    assert torch.all(fused_rows(rows, empty, 0.1)[0] == -np.inf)  # an empty sum
    assert torch.all(lse == -np.inf) and torch.all(top == -np.inf) and sums is None
    assert fused_rows(empty, cols, 0.1)[0].shape == (0,)
    with pytest.raises(ValueError, match="values must have at most"):
        fused_rows(rows, cols, 0.1, values=torch.zeros((30, MAX_COLUMNS + 1)))


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 90), m=st.integers(1, 140), d=st.integers(1, 10),
    reg=st.floats(1e-3, 10.0), shift=st.floats(-300.0, 300.0),
)  # fmt: skip
def test_log_sums_bracket_the_largest_logit_and_follow_a_shift(device, n, m, d, reg, shift):
    """Invariants of any sizes: ``max_j <= l_i <= max_j + log m``, and a constant added to
    every log weight moves every ``l_i`` by that constant (to rounding of the shift)."""
    from sketchot.fused import fused_rows

    X, Y, log_w = clouds(n, m, d, seed=n * m + d)
    rows, cols = fused_points(device, torch.float64, X, Y)
    lse, top, _ = fused_rows(rows, cols, reg, log_w=torch.as_tensor(log_w))
    moved, _, _ = fused_rows(rows, cols, reg, log_w=torch.as_tensor(log_w + shift))
    lse, top, moved = (t.cpu().numpy() for t in (lse, top, moved))
    slack = 1e-12 * (1 + np.abs(top))
    assert np.all(lse >= top - slack) and np.all(lse <= top + np.log(m) + slack)
    np.testing.assert_allclose(moved - shift, lse, rtol=0, atol=1e-12 * (1 + abs(shift)))


def test_a_timed_pass_is_positive_and_keeps_its_fastest_tile(device):
    from sketchot.fused import TILE_CANDIDATES, chosen_tiles, fused_pass_seconds

    X, Y, _ = clouds(60, 50, 3)
    assert fused_pass_seconds(*fused_points(device, torch.float64, X, Y), 0.1, False) > 0
    # the fastest candidate is kept for the passes that follow (no tl.dot in d <= 8)
    tile = chosen_tiles()[("torch.float64", True, False)]
    assert tile in TILE_CANDIDATES and not tile[3]


def test_only_tensors_where_triton_runs_take_the_fused_passes(fused_interpreter, monkeypatch):
    from sketchot._arrays import array_context
    from sketchot.gibbs import make_cost

    sq = make_cost("sqeuclidean")
    tensors = array_context(X=torch.zeros((2, 2)))
    assert fused_interpreter.fused_available(tensors, sq)
    assert not fused_interpreter.fused_available(tensors, make_cost("cityblock"))
    assert not fused_interpreter.fused_available(array_context(X=np.zeros((2, 2))), sq)
    monkeypatch.setattr(fused_interpreter, "ENABLED", False)  # gpu.py's baseline switch
    assert not fused_interpreter.fused_available(tensors, sq)
    monkeypatch.setattr(fused_interpreter, "ENABLED", True)
    fused_interpreter.CPU_INTERPRETER = False  # the default: CPU tensors take NumPy's blocks
    assert not fused_interpreter.fused_available(tensors, sq)
