"""Exceptions and warnings of the solver."""

from __future__ import annotations

from .._validation import RenamableValueError


class NonPositiveKernelError(FloatingPointError):
    """A scaling denominator ``K~ v`` or ``K~^T u`` was not positive (``safeguard='raise'``)."""


class InvalidResultError(ValueError):
    """The result is impossible (negative or non-finite cost, mass or plan entries; mapped
    points outside the target cloud's bounding box). Pass ``errors='warn'`` to get it anyway."""


class LinearRangeError(RenamableValueError):
    """The plain multiplicative iteration cannot represent a side's step: a KL penalty's
    numerators ``w^(1 / rho)`` leave float64's normal range (``reg_m`` far below ``reg``).
    ``backend='auto'``, barycenters and warm losses pass over such a kernel to one with a
    log-stable iteration."""


class KernelSafeguardWarning(UserWarning):
    """The approximate kernel needed repairs during a Sinkhorn solve."""


class AccuracyWarning(UserWarning):
    """The scalings miss the requested accuracy against the TRUE kernel."""


class InvalidResultWarning(UserWarning):
    """An impossible result returned because ``errors='warn'``."""
