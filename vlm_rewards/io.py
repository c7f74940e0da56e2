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
    which is atomic. Its name hides the final suffix, so writers that infer a format from the
    suffix (PyAV, matplotlib, numpy) must be told the format explicitly.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # not tempfile.mkstemp: it creates the file with mode 0600, which os.replace would keep
    temporary = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write `data` as indented JSON, atomically."""
    with atomic_path(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
