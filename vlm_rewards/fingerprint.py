import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts: weights ids, preprocessing, prompts."""
    payload = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(payload).hexdigest()[:12]


def sha256_file(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """The hex sha256 of a file's bytes, read in chunks (weights may be many GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint_files(folder: str | Path, exclude: Iterable[str] = ()) -> dict[str, str]:
    """{relative path: sha256} of every file under `folder` (sorted, POSIX paths), bar `exclude`d relative paths.

    Hidden files (a leading dot in any path part, e.g. temporary files of an atomic write) are left out.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder")
    skipped = set(exclude)
    hashes = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if not path.is_file() or relative in skipped or any(part.startswith(".") for part in Path(relative).parts):
            continue
        hashes[relative] = sha256_file(path)
    return hashes


def changed_files(recorded: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """Relative paths whose hash differs between two `fingerprint_files` results, with why."""
    changes = [
        f"{name} (changed)" for name in sorted(recorded.keys() & actual.keys()) if recorded[name] != actual[name]
    ]
    changes += [f"{name} (missing)" for name in sorted(recorded.keys() - actual.keys())]
    changes += [f"{name} (not recorded)" for name in sorted(actual.keys() - recorded.keys())]
    return changes


def weights_fingerprint(name_or_path: str | Path, revision: str | None = None) -> str:
    """What identifies a model's files: for a local folder the hash of every file in it; for a hub id the
    id with the snapshot revision (commit hash) it was loaded from, which pins the same files."""
    if Path(name_or_path).is_dir():
        return fingerprint(fingerprint_files(name_or_path))
    return fingerprint(str(name_or_path), revision)


def file_stamp(path: str | Path) -> tuple[int, int] | None:
    """(size, mtime in ns) of a file, None if there is none: a cheap stand-in for its content's hash
    (a rewrite changes the mtime) where the files are too large to read on every run."""
    try:
        stat = Path(path).stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return stat.st_size, stat.st_mtime_ns
