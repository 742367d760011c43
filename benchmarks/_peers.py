"""Peer solvers run beside sketchot in the benchmark scripts, and their potentials certified
against the true kernel by sketchot's own check (imported as a sibling of the scripts)."""

from __future__ import annotations

import math
import time

import numpy as np

import sketchot
from sketchot.solver import sampled_true_kernel_check

#: rows and columns of the sampled true-kernel check: sketchot's own default past 4e6 entries
#: (``true_kernel_samples='auto'``), so the peers' errors compare with sketchot's
CHECK_SAMPLES = 256


def geomloss_steps(reg: float, scaling: float, diameter: float) -> int:
    """Sinkhorn iterations of GeomLoss's epsilon-scaling from ``diameter`` down to
    ``blur = sqrt(reg / 2)`` (its ``epsilon_schedule``, one iteration per value).

    Parameters
    ----------
    reg : float
        sketchot's regularisation (cost ``||x - y||^2``).
    scaling : float
        GeomLoss's ratio of successive blur radii.
    diameter : float
        The clouds' diameter (GeomLoss's starting blur).

    Returns
    -------
    int
    """
    blur = math.sqrt(reg / 2)
    return 2 + max(0, math.ceil(math.log(diameter / blur) / math.log(1 / scaling)))


def geomloss_potentials(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    scaling: float,
    backend: str,
    device: str | None = None,
) -> tuple[float, np.ndarray, np.ndarray] | None:
    """GeomLoss's Sinkhorn potentials for sketchot's problem (uniform weights, cost
    ``||x - y||^2``, ``reg``), as sketchot's log-scalings, and the seconds of the solve.

    GeomLoss's cost is ``||x - y||^2 / 2`` at ``eps = blur^2``: ``blur = sqrt(reg / 2)`` is
    the same kernel. Runs ``SamplesLoss('sinkhorn', p=2, debias=False, potentials=True)`` on
    float64 tensors; the KeOps backends compile their formulas on a small call first, outside
    the timing (on CUDA the timing waits for the device).

    Parameters
    ----------
    X, Y : ndarray of shape (n, d) and (m, d)
        The points.
    reg : float
        sketchot's regularisation.
    scaling : float
        GeomLoss's epsilon-scaling ratio (0.5: its default; 0.9: more accurate).
    backend : {'online', 'multiscale', 'tensorized'}
        GeomLoss's backend (the first two are KeOps's).
    device : str, optional
        Torch device of the tensors (default: the CPU).

    Returns
    -------
    tuple of (float, ndarray, ndarray) or None
        ``(seconds, log_u, log_v)``; None when torch, geomloss or (its KeOps backends)
        pykeops cannot be imported.
    """
    try:
        import torch
        from geomloss import SamplesLoss

        if backend != "tensorized":
            import pykeops  # noqa: F401 (GeomLoss imports without it; its KeOps backends fail later)
    except ImportError:
        return None
    loss = SamplesLoss("sinkhorn", p=2, blur=math.sqrt(reg / 2), scaling=scaling,
                       debias=False, potentials=True, backend=backend)  # fmt: skip
    x = torch.as_tensor(X, dtype=torch.float64, device=device)
    y = torch.as_tensor(Y, dtype=torch.float64, device=device)
    cuda = x.device.type == "cuda"
    loss(x[:100], y[:100])  # KeOps compiles its formulas once
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    F, G = loss(x, y)
    if cuda:  # kernels run asynchronously: the time is the device's
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    # P = a b^T exp((F + G - C / 2) / eps) with eps = reg / 2: log u = log a + F / eps
    log_u = math.log(1.0 / len(X)) + F.reshape(-1).cpu().numpy() / (reg / 2)
    log_v = math.log(1.0 / len(Y)) + G.reshape(-1).cpu().numpy() / (reg / 2)
    return seconds, log_u, log_v


def certified(
    X: np.ndarray,
    Y: np.ndarray,
    reg: float,
    log_u: np.ndarray,
    log_v: np.ndarray,
    seed: int,
    samples: int = CHECK_SAMPLES,
) -> float:
    """The upper bound of the true-kernel check of potentials ``(log u, log v)`` (uniform
    weights, balanced), from sketchot's own check on the exact kernel's geometry.

    Parameters
    ----------
    X, Y : ndarray of shape (n, d) and (m, d)
        The points (NumPy).
    reg : float
        sketchot's regularisation.
    log_u, log_v : ndarray
        Log-scalings of the plan ``diag(u) K diag(v)``.
    seed : int
        Seed of the sampled rows and columns.
    samples : int, default=CHECK_SAMPLES
        Rows and columns to sample (all of them when there are fewer).

    Returns
    -------
    float
        Upper confidence bound of the relative L1 marginal error.
    """
    kernel = sketchot.make_kernel(X, Y, reg, "exact", max_dense_bytes=0)
    n, m = len(X), len(Y)
    a, b = np.full(n, 1.0 / n), np.full(m, 1.0 / m)
    check = sampled_true_kernel_check(
        kernel, a, b, log_u, log_v, samples, np.random.default_rng(seed), (1.0, 1.0)
    )
    return float(check.bound)
