"""Atomic writes: readers never see a half-written file or folder, even if the writer crashes.

Temporaries are hidden siblings named `.<name>.<pid>.<hex>.tmp`, so a later writer can tell those of
dead processes (`remove_orphaned_temporaries`) from those of a writer still at work.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
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
    temporary = _temporary_sibling(path)
    try:
        yield temporary
        if temporary.is_file():
            make_readable(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, replace: bool = False) -> Iterator[Path]:
    """Yield a hidden temporary folder next to `path`; on success it becomes `path`, on failure it is deleted.

    `path` must be absent or an empty folder, unless `replace`: then an existing folder is moved aside,
    the new one renamed in and the old one deleted, so readers see the old or the new folder, never a
    mix. Orphaned temporaries of dead writers are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphaned_temporaries(path)
    temporary = _temporary_sibling(path)
    temporary.mkdir()
    try:
        yield temporary
        if replace and path.exists():
            old = _temporary_sibling(path)
            os.replace(path, old)
            os.replace(temporary, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temporary, path)  # onto no folder or an empty one: one atomic rename
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def remove_orphaned_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries (files or folders) of `path` left by writers that no longer run."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[0-9a-f]+\.tmp")
    removed = []
    for candidate in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        match = pattern.fullmatch(candidate.name)
        if match and not process_alive(int(match.group(1))):
            if candidate.is_dir():
                shutil.rmtree(candidate, ignore_errors=True)
            else:
                candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (ours always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _temporary_sibling(path: Path) -> Path:
    return path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


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
