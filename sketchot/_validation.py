"""Input checks shared by every layer.

Each check raises ``ValueError`` or ``TypeError`` with a message that names the argument,
says what was expected and shows what was received, so that bad input never surfaces later
as an obscure numpy traceback or as a silent NaN.
"""

from __future__ import annotations

import numbers
import os
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
import scipy.sparse as sp

FLOAT_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))


def describe(value: Any) -> str:
    """Short description of a received value for error messages."""
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    if sp.issparse(value):
        return f"a sparse matrix of shape {value.shape}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def check_dtype(dtype: Any, name: str = "dtype") -> np.dtype:
    """Return ``np.dtype(dtype)`` if it is float64 or float32; ``None`` (the public default,
    which the builders that know where the points live resolve first:
    :func:`sketchot.kernels.device.default_dtype`) is float64."""
    if dtype is None:
        return np.dtype(np.float64)
    try:
        resolved = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(
            f"{name} must be numpy.float64 or numpy.float32; got {describe(dtype)}"
        ) from exc
    if resolved not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be numpy.float64 or numpy.float32; got {resolved}")
    return resolved


def _field(name: str) -> str:
    """The field of ``name`` in a :class:`RenamableError`'s message."""
    return "{" + name + "}"


def refuse_masked(value: Any, name: str, remedy: str, **names: str) -> None:
    """Raise ``TypeError`` for a numpy masked array with masked entries.

    ``numpy.asarray`` drops the mask and keeps whatever lies under it, so the masked values
    would silently enter the computation. ``remedy`` says how to proceed; it may name
    arguments by the fields ``names`` lists (``{X}``), so that the error, a
    :class:`RenamableTypeError`, can be re-raised in a caller's terms.
    """
    if np.ma.isMaskedArray(value) and np.ma.is_masked(value):
        count = int(np.count_nonzero(np.ma.getmaskarray(value)))
        raise RenamableTypeError(
            f"{_field(name)} is a numpy masked array with {count} masked entries, and sketchot "
            f"does not read masks (the values under them would be used); {remedy}",
            **{name: name, **names},
        )


def check_matrix(
    value: Any,
    name: str,
    *,
    n_features: int | None = None,
    allow_sparse: bool = False,
    feature_name: str | None = None,
) -> np.ndarray | sp.csr_array:
    """Validate a 2-D, non-empty, finite numeric matrix and return it as float64.

    Integer and boolean inputs (pixel arrays, say) are converted; complex, object and string
    inputs are rejected, and so are masked arrays with masked entries (see
    :func:`refuse_masked`). ``n_features`` checks the number of columns; ``feature_name`` names
    the argument that fixed that number, for the error message. Errors are
    :class:`RenamableError`s naming ``name`` and ``feature_name``.
    """
    n = _field(name)
    names = {name: name}
    if allow_sparse and sp.issparse(value):
        matrix = sp.csr_array(value, dtype=np.float64)
        if not np.all(np.isfinite(matrix.data)):
            raise RenamableValueError(
                f"{n} must contain only finite values; got NaN or inf", **names
            )
    else:
        if sp.issparse(value):
            raise RenamableTypeError(f"{n} must be a dense array; got {describe(value)}", **names)
        refuse_masked(
            value,
            name,
            f"drop the rows with masked entries ({n}[~{n}.mask.any(axis=1)]) and their "
            "weights, or fill them and give those rows zero weight",
        )
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise RenamableTypeError(
                f"{n} must be a 2-D numeric array (rows of one length); got {describe(value)}",
                **names,
            ) from exc
        if array.dtype.kind not in "biuf":
            raise RenamableTypeError(
                f"{n} must be a real numeric array; got dtype {array.dtype} from {describe(value)}",
                **names,
            )
        if array.ndim != 2:
            raise RenamableValueError(
                f"{n} must be a 2-D array of shape (n_samples, n_features); "
                f"got {array.ndim}-D input of shape {array.shape}",
                **names,
            )
        matrix = np.ascontiguousarray(array, dtype=np.float64)
        if not np.all(np.isfinite(matrix)):
            bad = int(np.size(matrix) - np.count_nonzero(np.isfinite(matrix)))
            raise RenamableValueError(
                f"{n} must contain only finite values; got {bad} NaN or inf entries", **names
            )
    if matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise RenamableValueError(f"{n} must be non-empty; got shape {matrix.shape}", **names)
    if n_features is not None and matrix.shape[1] != n_features:
        if feature_name:
            names[feature_name] = feature_name
        source = f" (the dimension of {_field(feature_name)})" if feature_name else ""
        raise RenamableValueError(
            f"{n} must have {n_features} columns{source}; got {matrix.shape[1]} "
            f"(shape {matrix.shape})",
            **names,
        )
    return matrix


def check_int(
    value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Validate an integer within ``[minimum, maximum]`` (bounds optional)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {describe(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}; got {value}")
    return value


def check_float(
    value: Any,
    name: str,
    *,
    positive: bool = False,
    minimum: float | None = None,
) -> float:
    """Validate a finite real scalar (optionally strictly positive or bounded below)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {describe(value)}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0; got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return value


def check_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    """Validate that ``value`` is one of the strings in ``choices``."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"{name} must be one of {', '.join(map(repr, choices))}; got {describe(value)}"
        )
    return value


def check_weights(value: Any, name: str, n_points: int, points_name: str) -> np.ndarray:
    """Validate a histogram: 1-D, finite, non-negative, positive total, one weight per point.

    A masked array with masked entries is refused (:func:`refuse_masked`). Errors are
    :class:`RenamableError`s naming ``name`` and ``points_name``.

    ``None`` gives uniform weights ``1 / n_points``.
    """
    if value is None:
        return np.full(n_points, 1.0 / n_points)
    n, points = _field(name), _field(points_name)
    names = {name: name, points_name: points_name}
    refuse_masked(
        value,
        name,
        f"pass zero weights where it is masked ({n}.filled(0)), or drop those entries "
        f"together with their rows of {points}",
        **names,
    )
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        array = np.asarray(None)
    if array.dtype.kind not in "biuf":
        raise RenamableTypeError(
            f"{n} must be a 1-D array of real weights; got {describe(value)}", **names
        )
    if array.ndim != 1:
        raise RenamableValueError(
            f"{n} must be a 1-D array of weights; got shape {array.shape}", **names
        )
    if array.shape[0] != n_points:
        raise RenamableValueError(
            f"{n} must have one weight per row of {points} ({n_points}); "
            f"got {array.shape[0]} weights",
            **names,
        )
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)):
        raise RenamableValueError(f"{n} must contain only finite weights; got NaN or inf", **names)
    if np.any(array < 0):
        raise RenamableValueError(
            f"{n} must be non-negative; got minimum {array.min():.3g}", **names
        )
    if array.sum() <= 0:
        raise RenamableValueError(
            f"{n} must have a positive total mass; got {array.sum():.3g}", **names
        )
    return array


def check_rng(rng: Any) -> np.random.Generator:
    """Turn anything ``numpy.random.default_rng`` accepts into a Generator, with a clear error."""
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng < 0:
        raise ValueError(f"rng must be a non-negative int seed; got {rng}")
    try:
        return np.random.default_rng(rng)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            "rng must be None, a non-negative int seed, a numpy SeedSequence, BitGenerator or "
            "Generator; "
            f"got {describe(rng)}"
        ) from exc


def check_bool(value: Any, name: str) -> bool:
    """A Python or numpy boolean, as ``bool``. Integers such as ``1``/``0`` are rejected
    everywhere in sketchot (they are too easily a different argument in the wrong place)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False; got {describe(value)}")


def unknown_names(names: Any, accepted: Any, elsewhere: Any = ()) -> str:
    """The unknown keyword names, quoted, each with a did-you-mean among ``accepted``.

    A name of ``accepted`` or ``elsewhere`` (an argument of sketchot's other functions that
    this one does not take) is said to be not taken here, never suggested as itself.

    Examples
    --------
    >>> unknown_names(["max_iters"], ["max_iter", "tol"])
    "'max_iters' (did you mean 'max_iter'?)"
    >>> unknown_names(["metric"], ["max_iter"], elsewhere=["metric"])
    "'metric' (not an argument of this function)"
    """
    import difflib

    taken_elsewhere = set(accepted) | set(elsewhere)
    parts = []
    for name in sorted(names):
        if name in taken_elsewhere:
            parts.append(f"{name!r} (not an argument of this function)")
            continue
        close = difflib.get_close_matches(name, sorted(accepted), n=1, cutoff=0.6)
        parts.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return ", ".join(parts)


class RenamableError(Exception):
    """An error whose message names arguments through ``{name}`` fields, so that an entry that
    takes them under other names re-raises it in its caller's terms (:meth:`renamed`):
    :func:`sketchot.solve_sample` takes :func:`sketchot.sinkhorn`'s ``reg_m`` as
    ``unbalanced`` and its ``warmstart`` as ``potentials_init``.

    Raise :class:`RenamableValueError` or :class:`RenamableTypeError`; catch this class.

    Examples
    --------
    >>> error = RenamableValueError("{reg_m} must be > 0; got -1", reg_m="reg_m")
    >>> str(error.renamed(reg_m="unbalanced"))
    'unbalanced must be > 0; got -1'
    """

    def __init__(self, template: str, **names: str) -> None:
        self.template, self.names = template, names
        message = template
        for key, value in names.items():
            message = message.replace("{" + key + "}", value)
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.template,), {"names": self.names})

    def __setstate__(self, state: dict) -> None:
        self.__init__(self.template, **state["names"])

    def renamed(self, **names: str) -> RenamableError:
        """The same error with the arguments ``names`` maps called by the caller's names."""
        known = {key: value for key, value in names.items() if key in self.names}
        return type(self)(self.template, **{**self.names, **known})


class RenamableValueError(RenamableError, ValueError):
    """A ``ValueError`` in the caller's terms (:class:`RenamableError`)."""


class RenamableTypeError(RenamableError, TypeError):
    """A ``TypeError`` in the caller's terms (:class:`RenamableError`)."""


#: The package's directory: frames below it are sketchot's own.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` that names the user's line: the first frame
    outside sketchot, counted from the function that warns (whatever the depth of the
    public entry it was reached from).

    Examples
    --------
    >>> user_stacklevel()   # called from outside the package: its own frame
    1
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level
