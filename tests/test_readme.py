"""The README's Python snippets run as written (they are the API tour users copy)."""

import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_snippets_run(monkeypatch):
    if not README.exists():
        pytest.skip("README.md is not next to the tests (installed elsewhere)")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 3
    monkeypatch.chdir(README.parent)  # the snippets use paths relative to the repository
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the tour prints, it does not assert
        for block in blocks:
            exec(compile(block, str(README), "exec"), namespace)
    assert namespace["image"].shape == (800, 1200, 3)
    assert namespace["res"].converged
