"""Where the benchmark scripts put their numbers (imported as a sibling of the scripts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any, **dumps_options: Any) -> None:
    """Write ``data`` to ``path`` as JSON (creating its folder) and say where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, **{"indent": 1, **dumps_options}))
    print(f"JSON: {path}")
