"""Where the benchmark scripts put their numbers (imported as a sibling of the scripts)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ALIGN = {"l": ":---", "r": "---:", "-": "---"}


def write_json(path: Path, data: Any, **dumps_options: Any) -> None:
    """Write ``data`` to ``path`` as JSON (creating its folder) and say where it went."""
    write_text(path, json.dumps(data, **{"indent": 1, **dumps_options}))
    print(f"JSON: {path}")


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def md_row(cells: Iterable[Any]) -> str:
    """One markdown table row ``| a | b |``."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def md_table(header: Iterable[str], rows: Iterable[Any], align: str = "") -> list[str]:
    """Lines of a markdown table; ``align`` has one of ``l``, ``r``, ``-`` per column
    (default ``-``: no alignment); a row given as a string is used as it is."""
    header = list(header)
    marks = [ALIGN[c] for c in align.ljust(len(header), "-")]
    lines = [r if isinstance(r, str) else md_row(r) for r in rows]
    return [md_row(header), "|" + "|".join(marks) + "|", *lines]


def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, value)`` of one call of ``function`` (``time.perf_counter``)."""
    start = time.perf_counter()
    value = function()
    return time.perf_counter() - start, value
