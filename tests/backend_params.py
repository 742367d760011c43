"""The contract tests' fixtures: small parameters under which each built-in backend is a
reasonable kernel on ~100 points (a backend not listed, e.g. one a test registers, is
tested at its defaults). Not the backends' facts: the records do not hold them."""

from __future__ import annotations

from typing import Any

CONTRACT_PARAMS: dict[str, dict[str, Any]] = {
    "nystrom": {"n_landmarks": 30},
    "rff": {"n_features": 40},
    "polyts": {"sketch_dim": 8, "degree": 3, "variant": "improved"},
    # the contract compares products computed in different orders at rtol 1e-9: entries to
    # 1e-12 keep the expansion's own error below that
    "polyts_local": {"rtol": 1e-12},
}


def contract_params(backend: str) -> dict[str, Any]:
    """The small parameters of ``backend`` for the contract tests (a copy)."""
    return dict(CONTRACT_PARAMS.get(backend, {}))


#: Grid shapes with the contract clouds' sizes (120 and 90 points in 3-D).
GRID_SHAPES = {120: (4, 5, 6), 90: (3, 5, 6)}


def contract_clouds(backend: str, X: Any, Y: Any) -> tuple[Any, Any]:
    """The clouds the contract tests build ``backend`` on: ``X`` and ``Y`` as given, or, for
    a backend that builds on tensor-product grids only (its record's ``support``), grids
    with as many points in the same box (the source a uniform grid, the target an uneven
    one, listed in a shuffled order: the backend must find both)."""
    import numpy as np

    from sketchot.kernels import get_backend

    if get_backend(backend).support != "grids":
        return X, Y
    from sketchot.grid import RegularGrid

    source = RegularGrid.from_shape(GRID_SHAPES[len(X)], extent=1.0).points()
    axes = [np.linspace(0, 1, n) ** 1.5 for n in GRID_SHAPES[len(Y)]]
    target = RegularGrid(axes).points()[np.random.default_rng(7).permutation(len(Y))]
    return source.astype(np.asarray(X).dtype), target.astype(np.asarray(Y).dtype)
