"""Output files: checked before any work, written all together or not at all, never left behind.

The library part (:class:`sketchot.color.OutputSet`) is tested in-process; the programs'
guarantees in real processes on files each test creates, including a fault-injection test that
interrupts the program at random moments.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sketchot.color import OutputPathError, OutputSet, check_output_paths, outputs

ROOT = Path(__file__).resolve().parents[2]


def names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def old_files(folder: Path, *file_names: str) -> dict[Path, bytes]:
    """Write recognisable 'previous run' files; returns their contents by path."""
    contents = {}
    for number, name in enumerate(file_names):
        path = folder / name
        path.write_bytes(f"previous run, file {number}".encode())
        contents[path] = path.read_bytes()
    return contents


# ------------------------------------------------------------------------- checks up front
def test_check_refuses_an_output_that_is_another_output_or_an_input(tmp_path):
    source = tmp_path / "photo.png"
    source.write_bytes(b"input")
    (tmp_path / "sub").mkdir()
    with pytest.raises(OutputPathError, match=r"--figure: .* is the same file as --out"):
        check_output_paths(
            [("--out", tmp_path / "a.png", "image"), ("--figure", tmp_path / "sub/../a.png", "any")]
        )
    refused = r"--out: .* same file as SOURCE .*overwrite an input"
    with pytest.raises(OutputPathError, match=refused):
        check_output_paths([("--out", source, "image")], inputs=[("SOURCE", source)])
    # the same file under another name: a symbolic and a hard link
    (tmp_path / "link.png").symlink_to(source)
    os.link(source, tmp_path / "hard.png")
    for alias in ("link.png", "hard.png"):
        with pytest.raises(OutputPathError, match="same file as SOURCE"):
            check_output_paths([("--out", tmp_path / alias, "any")], [("SOURCE", source)])
    assert source.read_bytes() == b"input"


def test_check_refuses_unwritable_places(tmp_path):
    cases = [
        (tmp_path / "missing" / "a.png", "image", "output folder .* does not exist"),
        (tmp_path, "any", "is a folder, not a file name"),
        (Path(os.devnull), "any", "exists and is not a regular file"),
        (tmp_path / "a.unknown", "image", "cannot tell the image format"),
        (tmp_path / "a.unknown", "figure", "matplotlib cannot write .unknown"),
    ]
    for path, kind, message in cases:
        with pytest.raises(OutputPathError, match=message):
            check_output_paths([("--out", path, kind)])
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(OutputPathError, match="is not writable"):
            check_output_paths([("--out", locked / "a.png", "image")])


# ----------------------------------------------------------------- all together or nothing
def test_output_set_writes_all_files_together(tmp_path):
    old = old_files(tmp_path, "a.bin", "b.bin")
    planned = OutputSet()
    first, second = (planned.add(path, path.name) for path in old)
    with planned:
        planned.write(first, lambda stream: stream.write(b"new a"))
        planned.write(second, lambda stream: stream.write(b"new b"))
        assert [first.read_bytes(), second.read_bytes()] == list(old.values())  # not yet
    assert (first.read_bytes(), second.read_bytes()) == (b"new a", b"new b")
    assert names(tmp_path) == ["a.bin", "b.bin"]
    (tmp_path / "plain").write_text("x")  # permissions as open() would give them
    assert first.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777


def test_a_failing_writer_keeps_every_old_file(tmp_path):
    old = old_files(tmp_path, "a.bin", "b.bin", "c.bin")
    planned = OutputSet()
    paths = [planned.add(path, path.name) for path in old]

    def broken(stream):
        stream.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match=r"cannot write '.*b\.bin': No space left") as caught, planned:
        planned.write(paths[0], lambda stream: stream.write(b"new"))
        planned.write(paths[1], broken)
    assert ".tmp" not in str(caught.value)  # errors name the destination, never a temporary
    assert {path: path.read_bytes() for path in paths} == old
    assert names(tmp_path) == ["a.bin", "b.bin", "c.bin"]


def test_a_failing_rename_restores_the_files_already_replaced(tmp_path, monkeypatch):
    old = old_files(tmp_path, "a.bin", "b.bin")
    fresh = tmp_path / "c.bin"  # did not exist before: must not exist after
    planned = OutputSet()
    paths = [planned.add(path, path.name) for path in [*old, fresh]]
    real_replace, calls = os.replace, []

    def failing_replace(source, destination):
        calls.append(destination)
        if len(calls) == 3:  # the last rename of the commit fails
            raise PermissionError(13, "Permission denied", str(source))
        return real_replace(source, destination)

    with pytest.raises(PermissionError, match=r"cannot write '.*c\.bin'") as caught, planned:
        for path in paths:
            planned.write(path, lambda stream: stream.write(b"new"))
        monkeypatch.setattr(outputs.os, "replace", failing_replace)
    assert ".tmp" not in str(caught.value)
    assert {path: path.read_bytes() for path in old} == old
    assert names(tmp_path) == ["a.bin", "b.bin"]


def test_ctrl_c_at_the_instant_a_temporary_file_is_created_leaves_nothing(tmp_path, monkeypatch):
    old = old_files(tmp_path, "a.bin")
    real_mkstemp = outputs.tempfile.mkstemp

    def interrupted_mkstemp(*args, **kwargs):
        created = real_mkstemp(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # the file exists, its name is not recorded yet
        return created

    monkeypatch.setattr(outputs.tempfile, "mkstemp", interrupted_mkstemp)
    planned = OutputSet()
    path = planned.add(tmp_path / "a.bin", "--out")
    with pytest.raises(KeyboardInterrupt), planned:
        planned.write(path, lambda stream: stream.write(b"new"))
    assert path.read_bytes() == old[path]
    assert names(tmp_path) == ["a.bin"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_sigterm_while_writing_cleans_up_and_exits(tmp_path):
    planned = OutputSet()
    path = planned.add(tmp_path / "a.bin", "--out")
    before = signal.getsignal(signal.SIGTERM)

    def terminated(stream):
        stream.write(b"half")
        signal.raise_signal(signal.SIGTERM)  # held until the file is recorded and closed

    with pytest.raises(SystemExit) as caught, planned:
        planned.write(path, terminated)
    assert caught.value.code == 128 + signal.SIGTERM
    assert names(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) == before


# ------------------------------------------------------------------ the programs, for real
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--out", "{folder}/same.png", "--figure", "{folder}/same.png"],
         "--figure: '{folder}/same.png' is the same file as --out"),
        (["--out", "{source}"], "--out: '{source}' is the same file as SOURCE"),
        (["--out", "{folder}/r.png", "--figure", "{target}"], "same file as TARGET"),
        (["--out", "{folder}/r.png", "--figure", "{folder}/r_inverse.png"],
         "--figure: '{folder}/r_inverse.png' is the same file as the inverse image"),
    ],
)  # fmt: skip
def test_program_refuses_outputs_that_would_overwrite_inputs_or_each_other(
    programs, tmp_path, options, message
):
    folder = tmp_path / "run"
    folder.mkdir()
    rng = np.random.default_rng(1)
    source, target = folder / "source.png", folder / "target.png"
    Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).save(source)
    Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)).save(target)
    (folder / "same.png").write_bytes(b"previous")
    before = {path: path.read_bytes() for path in folder.iterdir()}
    fill = {"folder": folder, "source": source, "target": target}
    done = programs.run(
        "color_transfer", source, target, *(o.format(**fill) for o in options), timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()]  # one line
    assert done.stderr.startswith("error: ") and message.format(**fill) in done.stderr
    assert {path: path.read_bytes() for path in folder.iterdir()} == before


def test_program_failing_while_writing_keeps_every_previous_output(programs, tiny_pair, tmp_path):
    # a real run whose figure cannot be written (the disk fills up): the image and its
    # inverse, already encoded, must not replace the previous run's files either
    source, target = tiny_pair
    old = old_files(tmp_path, "r.png", "r_inverse.png", "r_figure.png")
    inject = (
        "import errno, runpy, sys, matplotlib.figure\n"
        "def full(*args, **kwargs):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "matplotlib.figure.Figure.savefig = full\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    command = [sys.executable, "-c", inject, str(programs.path("color_transfer")), str(source),
               str(target), "--out", str(tmp_path / "r.png"), "--n-samples", "40",
               "--backend", "exact", "--max-iter", "50"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=ROOT, env=programs.env
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: OSError: [Errno 28] cannot write '{tmp_path / 'r_figure.png'}': "
        "No space left on device"
    ]
    assert {path: path.read_bytes() for path in old} == old
    assert names(tmp_path) == ["r.png", "r_figure.png", "r_inverse.png"]


def test_interrupting_the_program_at_random_moments_leaves_all_old_or_all_new(
    programs, tiny_pair, tmp_path
):
    """Fault injection: SIGINT (and a few SIGTERM) at random instants of real runs."""
    source, target = tiny_pair
    arguments = (source, target, "--out", tmp_path / "r.png", "--n-samples", 40,
                 "--backend", "exact", "--max-iter", 50)  # fmt: skip
    expected = ["r.png", "r_figure.png", "r_inverse.png"]
    # one uninterrupted run: how long a run takes, and what the new images are
    tick = time.perf_counter()
    done = programs.run("color_transfer", *arguments, timeout=60)
    duration = time.perf_counter() - tick
    assert done.returncode == 0, done.stderr
    new = {name: (tmp_path / name).read_bytes() for name in ("r.png", "r_inverse.png")}
    rng = np.random.default_rng(20261126)
    outcomes = []
    for trial in range(22):  # 20 SIGINT, 2 SIGTERM
        old = old_files(tmp_path, *expected)
        # from the imports to just after the end: the outputs are written in the last tenth
        delay = duration * rng.uniform(0.3, 1.05)
        number = signal.SIGTERM if trial % 11 == 10 else signal.SIGINT
        process = programs.start("color_transfer", *arguments)
        time.sleep(delay)
        process.send_signal(number)
        process.communicate(timeout=60)
        assert names(tmp_path) == expected, f"trial {trial}: temporary or missing files"
        kept = [path.read_bytes() == content for path, content in old.items()]
        assert all(kept) or not any(kept), f"trial {trial}: a mix of old and new outputs"
        if not any(kept):  # all new: the finished results, whatever the exit code
            for name, content in new.items():
                assert (tmp_path / name).read_bytes() == content
            Image.open(tmp_path / "r_figure.png").verify()
        outcomes.append(all(kept))
    assert any(outcomes)  # some runs were interrupted before their outputs were committed


# ------------------------------------------------------------------------- default places
def test_default_outputs_go_to_an_ignored_folder_created_on_demand(tiny_pair, tmp_path, capsys):
    program = ROOT / "examples" / "color_transfer.py"
    spec = importlib.util.spec_from_file_location("demo", program)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.DEFAULT_OUT.parent == demo.OUTPUTS == ROOT / "outputs"
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "outputs/" in ignored, "the demo's default outputs must be untracked"
    # run the demo with its defaults, pointed at a temporary project (the real images/ and
    # outputs/ stay untouched)
    demo.OUTPUTS = tmp_path / "outputs"
    demo.DEFAULT_OUT = demo.OUTPUTS / "color_transfer.png"
    demo.DEFAULT_SOURCE, demo.DEFAULT_TARGET = tiny_pair
    images_before = {p: p.stat().st_mtime_ns for p in (ROOT / "images").iterdir()}
    code = demo.main(["--n-samples", "40", "--backend", "exact", "--max-iter", "50"])
    assert code == 0, capsys.readouterr().err
    assert names(demo.OUTPUTS) == [
        "color_transfer.png",
        "color_transfer_figure.png",
        "color_transfer_inverse.png",
    ]
    assert {p: p.stat().st_mtime_ns for p in (ROOT / "images").iterdir()} == images_before
