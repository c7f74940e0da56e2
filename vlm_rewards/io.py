"""Atomic file writes: readers never see a half-written file, even if the writer crashes."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success move it onto `path`, on failure delete it.

    The temporary file lives in the same folder so that `os.replace` is a same-filesystem rename,
    which is atomic. The final file gets the umask-respecting mode of a plain `open()` (see
    `make_readable`), whatever mode the writer gave it. Its name hides the final suffix, so writers
    that infer a format from the suffix (PyAV, matplotlib, numpy) must be told the format explicitly.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # not tempfile.mkstemp: it creates the file with mode 0600, which os.replace would keep
    temporary = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        yield temporary
        if temporary.is_file():
            make_readable(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def default_file_mode() -> int:
    """The mode `open()` gives a new file: 0o666 minus the process umask (0o644 under umask 022)."""
    try:  # Linux: read the umask without changing it (os.umask would race with other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def make_readable(path: str | os.PathLike) -> None:
    """Give `path` (a file, or every file under a folder) the mode a plain `open()` would have given it.

    Some writers create files with mode 0600 whatever the umask (safetensors' `save_file`, which
    `transformers`' `save_pretrained` uses, writes through a private temporary file), so exported
    weights would be unreadable to the group; call this on what they wrote.
    """
    path = Path(path)
    mode = default_file_mode()
    for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]:
        os.chmod(file, mode)


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write `data` as indented JSON, atomically."""
    with atomic_path(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
