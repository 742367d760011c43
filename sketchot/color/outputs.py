"""Output files that a program never destroys by accident: checked up front, written together.

A command-line run that writes several files (a recoloured image, its inverse, a figure, a JSON
record) should never overwrite one of its inputs, never write two outputs to the same file,
never fail halfway after destroying the previous results, and never leave temporary files
behind. :class:`OutputSet` gives these guarantees:

* :meth:`OutputSet.check` (or :func:`check_output_paths`) refuses, before any work, an output
  whose folder is missing or not writable, that is a folder or a special file, whose format
  the writer cannot tell from the extension, that is the same file as another output or as an
  input (compared resolved, and with ``os.path.samefile`` when both exist);
* inside ``with outputs:``, :meth:`OutputSet.write` writes each file to a hidden temporary
  name in its destination folder; leaving the block without an error renames them all onto
  their destinations, leaving it with an error (or Ctrl-C) deletes them: the destinations end
  up all old or all new;
* while the block runs, SIGINT and SIGTERM are held and acted on between two files (or after
  the renames), so that an interruption can never fall between creating a temporary file and
  recording its name, or in the middle of the renames.

A crash of the machine or ``kill -9`` in the middle of the renames can still leave some new and
some old files (no file system renames several files atomically).
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

PathLike = str | os.PathLike
Writer = Callable[[BinaryIO], Any]

#: What an output's extension must name: formats Pillow writes, formats matplotlib writes, JSON.
OUTPUT_KINDS = ("image", "figure", "json", "any")

#: Signals held while an output set is open (those that exist on this platform).
HELD_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name)
)


class OutputPathError(ValueError):
    """An output path that cannot or must not be written (found before any work is done)."""


@dataclass(frozen=True)
class Output:
    """One planned output file.

    Attributes
    ----------
    path : pathlib.Path
    label : str
        How the user named it, for error messages (``"--out"``, ``"--figure"``, ...).
    kind : {'image', 'figure', 'json', 'any'}
        Which extensions are accepted.
    """

    path: Path
    label: str
    kind: str = "any"


def check_output_paths(
    outputs: Iterable[Output | tuple[str, PathLike, str]],
    inputs: Iterable[tuple[str, PathLike]] = (),
) -> None:
    """Refuse outputs that cannot be written or would destroy another file of the run.

    Parameters
    ----------
    outputs : iterable of Output or (label, path, kind)
        The files a run will write.
    inputs : iterable of (label, path)
        The files it reads (``("SOURCE", path)``, ...); inputs that do not exist are skipped
        (reading them reports that later).

    Raises
    ------
    OutputPathError
        A ``ValueError`` naming the option (label), the path, what was expected and why not.
    """
    planned = [item if isinstance(item, Output) else Output(Path(item[1]), item[0], item[2])
               for item in outputs]  # fmt: skip
    for output in planned:
        _check_one(output)
    seen: list[tuple[str, Path]] = []
    for output in planned:
        for label, other in seen:
            if _same_file(output.path, other):
                raise OutputPathError(
                    f"{output.label}: {str(output.path)!r} is the same file as {label} "
                    f"({str(other)!r}); give each output its own name"
                )
        for label, source in inputs:
            if _same_file(output.path, Path(source)):
                raise OutputPathError(
                    f"{output.label}: {str(output.path)!r} is the same file as {label} "
                    f"({str(source)!r}); refusing to overwrite an input"
                )
        seen.append((output.label, output.path))


class OutputSet:
    """Several output files written all together or not at all.

    Examples
    --------
    >>> outputs = OutputSet()
    >>> out = outputs.add("result.json", "--out", "json")      # doctest: +SKIP
    >>> outputs.check(inputs=[("SOURCE", "photo.png")])       # before any work  # doctest: +SKIP
    >>> with outputs:                                          # doctest: +SKIP
    ...     outputs.write(out, lambda stream: stream.write(b"{}"))
    """

    def __init__(self) -> None:
        self._planned: list[Output] = []
        self._staged: dict[Path, Path] = {}
        self._received: list[int] = []
        self._previous: dict[int, Any] = {}
        self._open = False

    @property
    def paths(self) -> list[Path]:
        """The planned output paths, in the order they were added."""
        return [output.path for output in self._planned]

    def add(self, path: PathLike, label: str, kind: str = "any") -> Path:
        """Plan an output; returns its path. ``kind`` is one of :data:`OUTPUT_KINDS`."""
        if kind not in OUTPUT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(OUTPUT_KINDS)}; got {kind!r}")
        output = Output(Path(path), label, kind)
        self._planned.append(output)
        return output.path

    def check(self, inputs: Iterable[tuple[str, PathLike]] = ()) -> None:
        """:func:`check_output_paths` on the planned outputs; raises :class:`OutputPathError`."""
        check_output_paths(self._planned, inputs)

    def __enter__(self) -> OutputSet:
        if self._open:
            raise RuntimeError("this OutputSet is already open")
        self._open = True
        self._received = []
        self._hold_signals()
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        try:
            if kind is None and not self._received:
                self.commit()
            else:  # an error, or a signal held since the last write: keep the old files
                self.discard()
        finally:
            self._open = False
            self._release_signals()

    def write(self, path: PathLike, writer: Writer) -> None:
        """Run ``writer(binary_stream)`` into a temporary file next to ``path``.

        The file replaces ``path`` when the ``with`` block ends without an error; inside the
        block ``path`` itself is untouched. Writing a path twice keeps the second version.
        """
        if not self._open:
            raise RuntimeError("OutputSet.write must be called inside 'with outputs:'")
        path = Path(path)
        self._act_on_signals()
        self._drop(path)
        folder = path.parent if str(path.parent) else Path(".")
        try:
            handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise _public_error(exc, path) from None
        temporary = Path(name)
        self._staged[path] = temporary
        try:
            with os.fdopen(handle, "wb") as stream:
                writer(stream)
            # mkstemp creates the file private (0600); give it the permissions a plain open()
            # would have given (0666 minus the umask)
            os.chmod(temporary, 0o666 & ~_umask())
        except OSError as exc:
            self._drop(path)
            raise _public_error(exc, path, temporary) from None
        except BaseException:
            self._drop(path)
            raise
        self._act_on_signals()

    def commit(self) -> list[Path]:
        """Rename every staged file onto its destination; on failure restore the old files."""
        staged = list(self._staged.items())
        self._staged = {}
        backups: dict[Path, Path | None] = {}
        replaced: list[Path] = []
        try:
            for path, _ in staged:
                backups[path] = _backup(path)
            for path, temporary in staged:
                try:
                    os.replace(temporary, path)
                except OSError as exc:
                    raise _public_error(exc, path, temporary) from None
                replaced.append(path)
        except BaseException:
            for path in replaced:
                backup = backups.get(path)
                if backup is not None:
                    os.replace(backup, path)
                    backups[path] = None
            for path, temporary in staged:
                if path not in replaced:
                    temporary.unlink(missing_ok=True)
            raise
        finally:
            for backup in backups.values():
                if backup is not None:
                    backup.unlink(missing_ok=True)
        return [path for path, _ in staged]

    def discard(self) -> None:
        """Delete every staged temporary file; the destinations keep their old contents."""
        for path in list(self._staged):
            self._drop(path)

    # -------------------------------------------------------------------------- internals
    def _drop(self, path: Path) -> None:
        temporary = self._staged.pop(path, None)
        if temporary is not None:
            temporary.unlink(missing_ok=True)

    def _hold_signals(self) -> None:
        # Python runs signal handlers in the main thread only; elsewhere nothing can be held
        if threading.current_thread() is not threading.main_thread():
            return
        for number in HELD_SIGNALS:
            self._previous[number] = signal.signal(number, self._record)

    def _release_signals(self) -> None:
        previous, self._previous = self._previous, {}
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        received, self._received = self._received, []
        if received:
            # the outputs are now all old or all new: let the signal do what it would have done
            signal.raise_signal(received[0])

    def _record(self, number: int, frame: Any) -> None:
        self._received.append(number)

    def _act_on_signals(self) -> None:
        """At a safe point (no temporary file half-registered): honour a held signal."""
        if self._received:
            number = self._received[0]
            self._received = []
            if number == getattr(signal, "SIGINT", None):
                raise KeyboardInterrupt
            raise SystemExit(128 + number)


def atomic_write_with(path: PathLike, writer: Writer) -> Path:
    """Run ``writer(file_object)`` into a temporary file next to ``path``, then rename it.

    A one-file :class:`OutputSet`: an error or Ctrl-C never leaves a partial or temporary file.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"output folder {str(folder)!r} of {str(path)!r} does not exist")
    outputs = OutputSet()
    outputs.add(path, "path")
    with outputs:
        outputs.write(path, writer)
    return path


# ------------------------------------------------------------------------------ helpers
def _check_one(output: Output) -> None:
    path, label = output.path, output.label
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OutputPathError(f"{label}: output folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise OutputPathError(f"{label}: {str(path)!r} is a folder, not a file name")
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        raise OutputPathError(f"{label}: {str(path)!r} exists and is not a regular file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{label}: output folder {str(folder)!r} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"{label}: {str(path)!r} exists and is read-only")
    _check_format(output)


def _check_format(output: Output) -> None:
    suffix = output.path.suffix.lower()
    if output.kind == "image":
        from PIL import Image

        if suffix not in Image.registered_extensions():
            raise OutputPathError(
                f"{output.label}: cannot tell the image format from the extension of "
                f"{str(output.path)!r}; use .png, .jpg, .tif, .bmp or .webp"
            )
    elif output.kind == "figure":
        # matplotlib takes about 0.3 s to import: only programs that draw figures pay for it
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix.lstrip(".") not in formats:
            raise OutputPathError(
                f"{output.label}: matplotlib cannot write "
                f"{suffix or 'files without an extension'}; use one of "
                f"{', '.join('.' + name for name in sorted(formats))}"
            )


def _same_file(first: Path, second: Path) -> bool:
    if first.resolve() == second.resolve():
        return True
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist (yet): different files
        return False


def _backup(path: Path) -> Path | None:
    """A hard link to the current ``path`` under a temporary name, to restore it on failure."""
    if not path.exists():
        return None
    folder = path.parent if str(path.parent) else Path(".")
    for _ in range(100):
        name = folder / f".{path.name}.{secrets.token_hex(4)}.old"
        try:
            os.link(path, name)
        except FileExistsError:
            continue
        except OSError:  # no hard links on this file system: the old file cannot be restored
            return None
        return name
    return None


def _public_error(exc: OSError, path: Path, temporary: Path | None = None) -> OSError:
    """The same error, naming the destination instead of a temporary file the user never saw."""
    text = exc.strerror or str(exc)
    if temporary is not None:
        text = text.replace(str(temporary), str(path))
    code = exc.errno if exc.errno is not None else errno.EIO
    return type(exc)(code, f"cannot write {str(path)!r}: {text}")


def _umask() -> int:
    """The process umask (reading it requires setting it; restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
