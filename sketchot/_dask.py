"""Recognising Dask arrays without importing Dask.

sketchot works without Dask; Dask is imported only when a Dask array is passed (then the
computation goes to :mod:`sketchot.distributed`). Detection is by the type's module, so a plain
``import sketchot`` or an in-memory solve never puts ``dask`` in ``sys.modules``.
"""

from __future__ import annotations

from typing import Any

# sketchot is installed from a clone (not from PyPI): the packages themselves work anywhere
INSTALL_HINT = (
    'pip install "dask[array]>=2024.1" "distributed>=2024.1" '
    '(or pip install ".[dask]" in a clone of sketchot)'
)


def is_dask_array(value: Any) -> bool:
    """Whether ``value`` is a Dask collection with chunks (``dask.array.Array`` or alike)."""
    return type(value).__module__.startswith("dask") and hasattr(value, "chunks")


def any_dask(*values: Any) -> bool:
    """Whether any of ``values`` is a Dask array."""
    return any(is_dask_array(value) for value in values)


def require_dask() -> None:
    """Raise a clear ImportError naming the extra when Dask (array + distributed) is missing."""
    try:
        import dask.array  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"Dask arrays were passed to sketchot but dask[array] is not installed; "
            f"install the optional dependency: {INSTALL_HINT}"
        ) from exc
