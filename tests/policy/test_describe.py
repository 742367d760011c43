"""The docs' ladder of ``backend='auto'`` is the code's: ``docs/conf.py`` writes it from
:mod:`sketchot.policy.describe`, which reads the ladder's constants and the policy table, and
no hand-written copy of its numbers is left in the docs or the README (one drifted: the
block-local ``rtol`` read ``accuracy / 100`` capped at ``1e-5`` where the code used
``accuracy x 0.02`` capped at ``1e-4``)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import sketchot
from sketchot.kernels import local
from sketchot.policy import auto_backends, describe, ladder, register_auto, unregister_auto

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_ladder_states_the_codes_constants():
    text = describe.ladder_rst()
    side = int(np.sqrt(ladder.DIRECT_DENSE_ENTRIES))
    for number in (
        f"{side} x {side}",
        f"ranks {ladder.FIRST_RANK}, {2 * ladder.FIRST_RANK}, ...",
        f"{ladder.DIRECT_EXACT_ITERATIONS} of its iterations",
        f"at most {ladder.DIRECT_EXACT_SECONDS:g} s",
        f"{ladder.SAMPLE_ABOVE:,} points on a side",
        f"{ladder.SAMPLE_POINTS:,} points of each cloud",
        f"within {ladder.HOPELESS_FACTOR:g} times the target",
        f"less than {ladder.STALL_FACTOR:g}x per doubling",
        f"``accuracy x {local.RTOL_FRACTION:g}``",
    ):
        assert number in text, number
    assert len(re.findall(r"^\d\. ", text, flags=re.MULTILINE)) == 4


def test_the_stated_rtol_rule_is_rtol_for():
    """The rule as written (fraction and range, parsed back) gives :func:`rtol_for`'s
    values, at the range's ends and inside it."""
    text = describe.local_rtol()
    fraction, low, high = (
        float(x)
        for x in re.match(r"``accuracy x (\S+)``, within ``\[(\S+), (\S+)\]``", text).groups()
    )
    for accuracy in (1e-12, 1e-8, 1e-6, 1e-3, 1e-2, 1.0):
        assert float(np.clip(accuracy * fraction, low, high)) == local.rtol_for(accuracy)


def test_the_ladder_follows_the_table(monkeypatch):
    """A constant or a rule changed in the code changes the docs: the text is not a copy."""
    before = describe.ladder_rst()
    monkeypatch.setattr(ladder, "DIRECT_DENSE_ENTRIES", 36_000_000)
    assert "6000 x 6000" in describe.ladder_rst() != before
    record = sketchot.get_backend("nystrom")
    sketchot.register_backend("rows_test", record.builder, rank_parameter="n_landmarks")
    try:
        register_auto("rows_test", order=5, min_dimension=3)
        text = describe.ladder_rst()
        assert "then ``rows_test`` (in dimension ``d >= 3``)" in text
        # the order written is the order the ladder tries them in
        tried = [record.name for record, _ in auto_backends("low_rank", 30)]
        assert tried == ["nystrom", "polyts", "rows_test"]
        written = re.findall(r"``(\w+)``", text.split("\n")[1].split(" at ranks")[0])
        assert [name for name in written if name in tried] == tried
    finally:
        unregister_auto("rows_test")
        sketchot.unregister_backend("rows_test")


def test_the_docs_print_the_generated_ladder():
    conf = (DOCS / "conf.py").read_text()
    assert "describe.ladder_rst()" in conf and "describe.rst_substitutions()" in conf
    guide = (DOCS / "user_guide" / "backends.rst").read_text()
    assert ".. include:: generated/auto_ladder.rst" in guide
    assert (
        "|local_rtol|" in guide
        and "|local_rtol|" in (DOCS / "user_guide" / "small_reg.rst").read_text()
    )


#: Phrases of the hand-written ladders that drifted: none may come back.
HAND_WRITTEN = [
    r"accuracy / 100",
    r"a hundredth of it, at most",
    r"at most ``1e-5``",
    r"up to 5000 x 5000",
    r"ranks 64, 128",
    r"timed under 2 s",
    r"times a fused pass",
]


@pytest.mark.parametrize(
    "path",
    [ROOT / "README.md", *sorted((DOCS / "user_guide").glob("*.rst"))],
    ids=lambda p: p.name,
)
def test_no_hand_written_ladder_is_left(path):
    text = path.read_text()
    assert [phrase for phrase in HAND_WRITTEN if re.search(phrase, text)] == []


def test_the_readme_states_the_device_rule_of_the_code():
    readme = (ROOT / "README.md").read_text()
    rule = (
        f"{ladder.DIRECT_EXACT_ITERATIONS} of its iterations are predicted under "
        f"{ladder.DIRECT_EXACT_SECONDS:g} s"
    )
    assert rule in readme
