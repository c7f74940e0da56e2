"""Episode sources: a folder of videos, a LeRobot v3 dataset, the project's episode format.

`iter_episodes(config)` yields lightweight `EpisodeRef`s lazily, in a deterministic order, without
decoding any pixels; `vlm_rewards.annotation.decode` turns a ref into frames. A ref that cannot be
scored whatever happens (no instruction) carries a `problem` and becomes a failure without decoding.
Each ref carries the stamp of its inputs (`input_stamp`): an episode whose files or listing changed
since its shard was written is redone.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from vlm_rewards.annotation.config import SourceConfig
from vlm_rewards.data.lerobot import CameraSpan, list_episodes, select_cameras
from vlm_rewards.fingerprint import file_stamp, fingerprint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeRef:
    """One episode to annotate, without its pixels (cheap to pickle to decode workers and Ray).

    episode: the episode key in outputs (a relative video path, or the episode index as text).
    kind: "video" | "lerobot" | "episodes". path: the video file or the dataset root.
    """

    source: str
    episode: str
    kind: str
    path: str
    instruction: str | None
    success: bool | None = None
    problem: str | None = None
    reference: str | None = None
    fps: float | None = None
    length: int | None = None  # LeRobot: frames in the episode
    episode_index: int | None = None  # LeRobot / episodes: the dataset's id
    index_start: int | None = None  # LeRobot: global `index` of the episode's first frame
    cameras: tuple[CameraSpan, ...] = field(default_factory=tuple)
    inputs: str | None = None  # `input_stamp` at listing: a shard of another stamp is out of date

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeRef:
        data = dict(data)
        data["cameras"] = tuple(CameraSpan(**camera) for camera in data.get("cameras") or ())
        return cls(**data)


def source_name(config: SourceConfig) -> str:
    return config.name or Path(config.path).resolve().name


def iter_episodes(config: SourceConfig) -> Iterator[EpisodeRef]:
    """Every episode of the configured source, lazily, in a deterministic order (then `limit`)."""
    root = Path(config.path)
    if not root.exists():
        raise ValueError(f"source.path {root}: no such file or folder")
    readers = {"videos": _video_folder, "lerobot": _lerobot, "episodes": _episode_dataset}
    for count, ref in enumerate(readers[config.kind](config, root)):
        if config.limit is not None and count >= config.limit:
            return
        yield dataclasses.replace(ref, inputs=input_stamp(ref))


_PATH_FIELDS = ("path", "reference", "cameras", "problem", "inputs")  # paths as configured: stamped resolved


def input_stamp(ref: EpisodeRef) -> str:
    """What an episode's outputs depend on besides the job's settings: its listing (instruction, success,
    frame span...) and the resolved path, size and mtime of every file it is decoded from."""
    listing = {key: value for key, value in ref.to_json().items() if key not in _PATH_FIELDS}
    spans = [(span.name, span.from_timestamp, span.to_timestamp) for span in ref.cameras]
    files = {str(Path(path).resolve()): file_stamp(path) for path in input_files(ref)}
    return fingerprint(listing, spans, files)


def input_files(ref: EpisodeRef) -> list[str]:
    """The files an episode's frames (and its reference) are decoded from."""
    if ref.kind == "lerobot":
        files = [span.path for span in ref.cameras]
    elif ref.kind == "episodes":
        from vlm_rewards.data.episodes import episode_stem

        files = sorted(str(path) for path in (Path(ref.path) / "frames").glob(f"{episode_stem(ref.episode_index)}.*"))
    else:
        files = [ref.path]
    return files + ([ref.reference] if ref.reference else [])


# ----------------------------------------------------------------------------- video folder


def _video_folder(config: SourceConfig, root: Path) -> Iterator[EpisodeRef]:
    if not root.is_dir():
        raise ValueError(f"source.path {root}: expected a folder of videos")
    extensions = {extension.lower() for extension in config.extensions}
    pattern = "**/*" if config.recursive else "*"
    paths = sorted(
        path for path in root.glob(pattern) if path.suffix.lower() in extensions and not path.name.startswith(".")
    )
    sidecar = load_sidecar(config.instructions) if config.instructions else {}
    name = source_name(config)
    reference = str(config.reference) if config.reference else None
    for path in paths:
        relative = path.relative_to(root).as_posix()
        entry = sidecar.get(relative) or sidecar.get(path.name) or sidecar.get(path.stem) or {}
        instruction = entry.get("instruction") or config.instruction
        problem = None
        if not instruction or not str(instruction).strip():
            where = f"in {config.instructions}" if config.instructions else "(no sidecar and no fixed instruction)"
            problem = f"no instruction for {relative} {where}"
        entry_reference = entry.get("reference")
        if entry_reference:
            entry_reference = str(Path(config.instructions).parent / entry_reference)
        yield EpisodeRef(
            source=name,
            episode=relative,
            kind="video",
            path=str(path),
            instruction=instruction,
            success=entry.get("success"),
            problem=problem,
            reference=entry_reference or reference,
        )


def load_sidecar(path: Path) -> dict[str, dict[str, Any]]:
    """Instructions by video: JSON {key: text | {"instruction", "success", "reference"}} or CSV with
    columns path (or video/file), instruction[, success][, reference]."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"source.instructions {path}: no such file (set source.instructions=null to use source.instruction "
            "for every video)"
        )
    entries: dict[str, dict[str, Any]] = {}
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"source.instructions {path}: not valid JSON ({error})") from None
        if not isinstance(data, dict):
            raise ValueError(f"source.instructions {path}: expected a JSON object keyed by video path")
        for key, value in data.items():
            entries[str(key)] = _sidecar_entry(path, str(key), value)
    elif path.suffix.lower() == ".csv":
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            column = next((name for name in ("path", "video", "file") if name in (reader.fieldnames or [])), None)
            if column is None or "instruction" not in (reader.fieldnames or []):
                raise ValueError(
                    f"source.instructions {path}: expected CSV columns path (or video/file) and instruction, "
                    f"got {reader.fieldnames}"
                )
            for row in reader:
                entry: dict[str, Any] = {"instruction": row.get("instruction")}
                if row.get("success") not in (None, ""):
                    entry["success"] = row["success"].strip().lower() in ("1", "true", "yes")
                if row.get("reference"):
                    entry["reference"] = row["reference"]
                entries[row[column]] = entry
    else:
        raise ValueError(f"source.instructions {path}: expected a .json or .csv sidecar")
    return entries


SIDECAR_FIELDS = {"instruction": str, "success": bool, "reference": str}


def _sidecar_entry(path: Path, key: str, value: Any) -> dict[str, Any]:
    """One value of a JSON sidecar (a text, an object of `SIDECAR_FIELDS` or null) as an entry."""
    if isinstance(value, str):
        return {"instruction": value}
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(
            f"source.instructions {path}: {key}: expected an instruction text or an object with "
            f"{', '.join(SIDECAR_FIELDS)}, got {type(value).__name__} {value!r}"
        )
    for name, kind in SIDECAR_FIELDS.items():
        if value.get(name) is not None and not isinstance(value[name], kind):
            raise ValueError(
                f"source.instructions {path}: {key}: {name}: expected {kind.__name__}, "
                f"got {type(value[name]).__name__} {value[name]!r}"
            )
    return dict(value)


# ----------------------------------------------------------------------------- LeRobot v3


def _lerobot(config: SourceConfig, root: Path) -> Iterator[EpisodeRef]:
    """The episodes of `vlm_rewards.data.lerobot.list_episodes`, their camera spans renamed "frames" and views."""
    info, episodes = list_episodes(root)
    cameras = select_cameras(info, root, config.camera, config.views)
    name = source_name(config)
    reference = str(config.reference) if config.reference else None
    for episode in episodes:
        instruction = config.instruction or episode.task
        problem = None if instruction and str(instruction).strip() else f"episode {episode.episode_index}: no task text"
        yield EpisodeRef(
            source=name,
            episode=str(episode.episode_index),
            kind="lerobot",
            path=str(root),
            instruction=instruction,
            success=episode.success,
            problem=problem,
            reference=reference,
            fps=float(info["fps"]),
            length=episode.length,
            episode_index=episode.episode_index,
            index_start=episode.index_start,
            cameras=tuple(dataclasses.replace(episode.videos[key], name=view) for view, key in cameras.items()),
        )


# ----------------------------------------------------------------------------- own episode format


def _episode_dataset(config: SourceConfig, root: Path) -> Iterator[EpisodeRef]:
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise ValueError(f"{root}: not an episode dataset (no meta.json)")
    meta = json.loads(meta_path.read_text())
    table = pq.read_table(root / "episodes.parquet", columns=["episode_id", "frame_index", "instruction", "success"])
    first: dict[int, dict[str, Any]] = {}
    for row in table.to_pylist():
        first.setdefault(int(row["episode_id"]), row)
    name = config.name or meta.get("name") or root.resolve().name
    reference = str(config.reference) if config.reference else None
    for episode_id in sorted(first):
        row = first[episode_id]
        instruction = config.instruction or row["instruction"]
        yield EpisodeRef(
            source=name,
            episode=str(episode_id),
            kind="episodes",
            path=str(root),
            instruction=instruction,
            success=row["success"],
            problem=None if instruction and instruction.strip() else f"episode {episode_id}: no instruction",
            reference=reference,
            fps=float(meta.get("fps") or 0) or None,
            episode_index=episode_id,
        )


@dataclass
class EpisodeOutcome:
    """What one episode produced: `progress` (num_frames,) and `scored` (num_frames,) bool on success,
    or `error` (and the stage that failed: "decode", "reward")."""

    ref: EpisodeRef
    num_frames: int = 0
    reward: float = math.nan
    progress: np.ndarray | None = None
    scored: np.ndarray | None = None
    components: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    stage: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
