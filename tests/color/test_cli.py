"""The colour-transfer programs end to end: examples/color_transfer.py, compare_backends.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sketchot.color import load_image

ROOT = Path(__file__).resolve().parents[2]
COLOR_TRANSFER = ROOT / "examples" / "color_transfer.py"
COMPARE_BACKENDS = ROOT / "examples" / "compare_backends.py"


def load_program(path: Path):
    """Import an example script as a module, to call its main() in-process (fast)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """A warm 16 x 12 source and a cool 14 x 10 target, written as PNG files."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    warm = rng.integers([150, 40, 0], [255, 150, 70], size=(12, 16, 3)).astype(np.uint8)
    cool = rng.integers([0, 70, 120], [80, 180, 255], size=(10, 14, 3)).astype(np.uint8)
    Image.fromarray(warm).save(folder / "warm.png")
    Image.fromarray(cool).save(folder / "cool.png")
    return folder / "warm.png", folder / "cool.png"


def run(program: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(program), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.parametrize("backend", ["exact", "nystrom", "rff", "polyts"])
def test_color_transfer_runs_end_to_end(tiny_pair, tmp_path, backend):
    source, target = tiny_pair
    out = tmp_path / "result.png"
    extra = [] if backend == "nystrom" else ["--no-figure"]  # draw one figure, save time
    done = run(COLOR_TRANSFER, source, target, "--backend", backend, "--n-samples", 60,
               "--max-iter", 200, "--out", out, *extra)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for step in ("sampling 60", "marginal err", "mapping all 192 source pixels", "true-kernel"):
        assert step in done.stdout, step
    assert "per iteration" in done.stdout and f"wrote {out}" in done.stdout
    recoloured = load_image(out)
    assert recoloured.shape == (12, 16, 3)
    assert load_image(tmp_path / "result_inverse.png").shape == (10, 14, 3)
    expected = {"result.png", "result_inverse.png"}
    if backend == "nystrom":
        expected.add("result_figure.png")
        assert Image.open(tmp_path / "result_figure.png").size[0] > 500
    assert {p.name for p in tmp_path.iterdir()} == expected


# a coarse sketch (m = 8, r = 2) misses the true kernel by 4% here: the program warns, fine
@pytest.mark.filterwarnings("ignore:backend 'polyts' at reg=1")
def test_color_transfer_backend_parameters(tiny_pair, tmp_path):
    program = load_program(COLOR_TRANSFER)
    source, target = tiny_pair
    code = program.main(
        [str(source), str(target), "--backend", "polyts", "-m", "8", "-r", "2", "-k", "5",
         "--n-samples", "40", "--reg", "1", "--out", str(tmp_path / "p.png"), "--no-figure",
         "--no-inverse"]
    )  # fmt: skip
    assert code == 0
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]


BAD_INPUT = [
    (["missing.png", "{target}"], "does not exist"),
    (["{text}", "{target}"], "not an image file Pillow can read"),
    (["{zero}", "{target}"], "zero pixels"),
    (["{source}", "{target}", "--n-samples", "1000"], "larger than the number of pixels"),
    (["{source}", "{target}", "--n-samples", "0"], "--n-samples: must be >= 1"),
    (["{source}", "{target}", "--n-samples", "-5"], "--n-samples: must be >= 1"),
    (["{source}", "{target}", "--reg", "0"], "--reg: must be a finite number > 0"),
    (["{source}", "{target}", "--reg", "-0.1"], "--reg: must be a finite number > 0"),
    (["{source}", "{target}", "--backend", "keops"], "invalid choice: 'keops'"),
    (["{source}", "{target}", "--out", "{nowhere}/r.png"], "--out: output folder"),
    (["{source}", "{target}", "--figure", "{nowhere}/f.png"], "--figure: output folder"),
    (["{source}", "{target}", "--out", "{out}/r.unknown"], "cannot tell the image format"),
    (["{source}", "{target}", "--rank", "5", "--backend", "polyts"], "--rank applies to"),
    (["{source}"], "give both SOURCE and TARGET"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT)
def test_bad_input_gets_one_line_and_exit_code_2(
    tiny_pair, tmp_path, zero_pixel_png, capsys, argv, message
):
    program = load_program(COLOR_TRANSFER)
    source, target = tiny_pair
    inputs = tmp_path / "inputs"
    outputs = tmp_path / "outputs"
    inputs.mkdir()
    outputs.mkdir()
    (inputs / "text.png").write_text("this is not an image")
    names = {
        "source": source,
        "target": target,
        "text": inputs / "text.png",
        "zero": zero_pixel_png,
        "nowhere": tmp_path / "no" / "such" / "folder",
        "out": outputs,
    }
    argv = [a.format(**names) for a in argv]
    if not any(a == "--out" for a in argv):
        argv += ["--out", str(outputs / "result.png")]
    try:
        code = program.main(argv)
    except SystemExit as exit_:  # argparse errors exit through parser.exit(2, ...)
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert message in lines[0]
    assert list(outputs.iterdir()) == []  # nothing written, not even a temporary file


def test_bad_input_in_a_real_process_has_no_traceback(tiny_pair, tmp_path):
    _, target = tiny_pair
    done = run(COLOR_TRANSFER, tmp_path / "missing.png", target, "--out", tmp_path / "r.png")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: source: file '{tmp_path / 'missing.png'}' does not exist"
    ]
    assert list(tmp_path.iterdir()) == []


def test_compare_backends_runs_end_to_end(tiny_pair, tmp_path):
    source, target = tiny_pair
    figure, results = tmp_path / "compare.png", tmp_path / "compare.json"
    done = run(COMPARE_BACKENDS, source, target, "--n-samples", 40, "--max-iter", 100,
               "--small-rank", 20, "--out", figure, "--json", results)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    records = json.loads(results.read_text())
    # 3 settings x (exact + 3 backends)
    assert len(records) == 12
    assert {r["backend"] for r in records} == {"exact", "nystrom", "rff", "polyts"}
    for record in records:
        assert record["per_iteration_ms"] > 0 and record["diff_mean"] >= 0
        assert (record["diff_mean"] == 0) == (record["backend"] == "exact")
    assert "|diff|/255" in done.stdout and "ms/iter" in done.stdout
    assert Image.open(figure).size[0] > 500


def test_compare_backends_bad_input(tmp_path, capsys):
    program = load_program(COMPARE_BACKENDS)
    figure = str(tmp_path / "f.png")
    for argv, message in (
        (["--small-reg", "0", "--out", figure], "--small-reg: must be a finite number > 0"),
        (["--out", str(tmp_path / "none" / "f.png")], "--out: output folder"),
        ([str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--out", figure], "does not exist"),
    ):
        try:
            code = program.main(argv)
        except SystemExit as exit_:
            code = exit_.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []
