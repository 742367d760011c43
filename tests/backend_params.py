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
