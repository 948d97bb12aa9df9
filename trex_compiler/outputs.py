"""Where trex writes: every output path is checked before any work starts.

One mechanism for every option that names an output (`--out`, `--trace`, `--dump`, `TREX_DUMP`,
plan files, eval and data output directories): parent directories are created, and a path that
cannot be used - an existing file where a directory is needed, a directory where a file is needed,
a parent that is a file, a location that refuses writes - is one clear error naming the option and
the path, raised before capture, search or evaluation spends any time.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trex.errors import TrexError


class OutputPathError(TrexError):
    """An output path trex was asked to write cannot be written."""


def _blocking_parent(path: Path) -> Path | None:
    """The first existing ancestor of `path` that is not a directory (a file in the way), if any."""
    for parent in [*reversed(path.parents)]:
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def _probe(directory: Path, option: str, shown: Path) -> None:
    """Raise unless a file can be created in `directory` (root passes os.access; only a write tells)."""
    try:
        handle, name = tempfile.mkstemp(prefix=".trex-write-check-", dir=directory)
    except OSError as error:
        raise OutputPathError(
            f"{option} {shown}: cannot write in {directory} ({error.strerror}); choose a writable location"
        ) from None
    os.close(handle)
    os.unlink(name)


def output_dir(path: str | os.PathLike, option: str) -> Path:
    """Check (and create) a directory trex will write into; return it."""
    path = Path(path).expanduser()
    blocker = _blocking_parent(path)
    if blocker is not None:
        raise OutputPathError(
            f"{option} {path}: {blocker} is a file, so no directory can be made under it; choose another path"
        )
    if path.exists() and not path.is_dir():
        raise OutputPathError(
            f"{option} {path}: this is an existing file, and a directory is needed here; remove it or choose another path"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputPathError(
            f"{option} {path}: cannot create the directory ({error.strerror}); choose a writable location"
        ) from None
    _probe(path, option, path)
    return path


def output_file(path: str | os.PathLike, option: str) -> Path:
    """Check a file trex will write (creating its parent directories); return it."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise OutputPathError(
            f"{option} {path}: this is a directory, and a file is needed here; name a file, e.g. {path / 'out.json'}"
        )
    blocker = _blocking_parent(path)
    if blocker is not None:
        raise OutputPathError(
            f"{option} {path}: {blocker} is a file, so {path.name} cannot be written under it; choose another path"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputPathError(
            f"{option} {path}: cannot create {path.parent} ({error.strerror}); choose a writable location"
        ) from None
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(
            f"{option} {path}: the existing file is read-only; choose another path or make it writable"
        )
    _probe(path.parent, option, path)
    return path
