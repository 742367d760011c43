"""How much memory there is, and refusing allocations that cannot fit before they start."""

from __future__ import annotations

import os

from ._defaults import DEFAULT_MAX_DENSE_BYTES

#: Fraction of the available memory one build may plan to use.
USABLE_FRACTION = 0.5


def available_bytes() -> int:
    """Bytes of memory available now (``MemAvailable`` on Linux; physical memory elsewhere)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def check_fits(n_bytes: float, what: str, parameter: str) -> None:
    """Raise ``MemoryError`` naming ``parameter`` when ``n_bytes`` exceed the usable budget."""
    budget = USABLE_FRACTION * available_bytes()
    if n_bytes > budget:
        raise MemoryError(
            f"{what} would need about {_size(n_bytes)}, more than the {_size(budget)} budget "
            f"({USABLE_FRACTION:.0%} of the memory available now); lower {parameter}"
        )


def _size(n_bytes: float) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"


def total_memory_bytes() -> int:
    """The machine's physical memory (a declared fact, not the load: ``'auto'`` reads this,
    never the memory available now)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def dense_budget_bytes() -> float:
    """Bytes the exact kernel may take when stored: 1 GiB, or less on a machine with little
    memory (:data:`USABLE_FRACTION` of its total: a function of the machine, not of its
    load, so that ``'auto'`` chooses the same on a busy machine)."""
    return min(DEFAULT_MAX_DENSE_BYTES, USABLE_FRACTION * total_memory_bytes())
