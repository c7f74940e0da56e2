"""On-disk datasets: episodes with per-frame progress labels, and preference pairs.

Both formats are a folder with a parquet table, the pixels in separate files and a `meta.json`;
`data/README.md` describes them column by column. A dataset is written whole into a hidden temporary
folder next to its destination and renamed into place when complete, so a crashed writer leaves
neither a folder that looks complete nor a half-written one that blocks the next write (orphaned
temporary folders of dead writers are removed by the next write).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlm_rewards.interface import RewardRequest, SampleKey, validate_clip
from vlm_rewards.io import atomic_folder, atomic_path, write_json
from vlm_rewards.media import read_clip, write_video

FORMAT_VERSION = 3  # 2: the per-frame `stage` and `frame_success` columns; 3: `goal_offset_x`, `goal_offset_y`
PAIR_FORMAT_VERSION = 1
READABLE_VERSIONS = {"vlm-rewards/episodes": (1, 2, 3), "vlm-rewards/pairs": (1,)}
FrameFormat = Literal["npz", "mp4"]
FRAME_FORMATS = ("npz", "mp4")
VIEW_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # view names end up in npz keys and file names

EPISODE_SCHEMA = pa.schema(
    [
        ("episode_id", pa.int64()),
        ("frame_index", pa.int32()),
        ("instruction", pa.string()),
        ("progress", pa.float32()),
        ("success", pa.bool_()),
        ("policy", pa.string()),
        ("stage", pa.int32()),
        ("frame_success", pa.bool_()),
        ("goal_offset_x", pa.float32()),
        ("goal_offset_y", pa.float32()),
    ]
)
GOAL_OFFSET_COLUMNS = ("goal_offset_x", "goal_offset_y")
# format version 1 has neither stage column, version 2 no goal offset
OPTIONAL_EPISODE_COLUMNS = ("policy", "stage", "frame_success", *GOAL_OFFSET_COLUMNS)
NULLABLE_EPISODE_COLUMNS = ("policy", "frame_success", *GOAL_OFFSET_COLUMNS)
PAIR_SCHEMA = pa.schema(
    [
        ("pair_id", pa.int64()),
        ("prompt", pa.string()),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("margin", pa.float32()),
        ("tie", pa.bool_()),
    ]
)


@dataclass
class EpisodeRecord:
    """One episode: a clip, its instruction and one progress label per frame.

    frames: (T, H, W, 3) uint8. progress: (T,) float32 in [0, 1]. success: episode-level outcome.
    views: extra cameras, name -> (T, H, W, 3) uint8 with the same T.
    reference: optional (R, H', W', 3) uint8 goal or reference images.
    stage: optional (T,) int, the task stage at each frame (e.g. stages completed), −1 where unknown.
    frame_success: optional (T,) bool, whether the task is done at each frame; None: unknown.
    goal_offset: optional (T, 2) float, where the named goal is from the effector at each frame (simulation
    state, in the task's workspace units): the target of an auxiliary head; None: unknown.
    """

    episode_id: int
    instruction: str
    frames: np.ndarray
    progress: np.ndarray
    success: bool
    policy: str | None = None
    views: dict[str, np.ndarray] = field(default_factory=dict)
    reference: np.ndarray | None = None
    stage: np.ndarray | None = None
    frame_success: np.ndarray | None = None
    goal_offset: np.ndarray | None = None

    def __post_init__(self) -> None:
        where = f"episode {self.episode_id}"
        validate_clip(self.frames, f"{where} frames")
        if self.stage is not None:
            self.stage = np.asarray(self.stage)
            if self.stage.shape != (self.num_frames,) or not np.issubdtype(self.stage.dtype, np.integer):
                raise ValueError(f"{where}: stage must be ({self.num_frames},) integers, got {self.stage!r}")
            if self.stage.min() < -1:
                raise ValueError(f"{where}: stage labels must be ≥ 0, or −1 for unknown, got {self.stage}")
            self.stage = self.stage.astype(np.int32)
        if self.frame_success is not None:
            self.frame_success = np.asarray(self.frame_success)
            if self.frame_success.shape != (self.num_frames,) or self.frame_success.dtype != bool:
                raise ValueError(
                    f"{where}: frame_success must be ({self.num_frames},) bool, got {self.frame_success!r}"
                )
        if self.goal_offset is not None:
            self.goal_offset = np.asarray(self.goal_offset, dtype=np.float32)
            if self.goal_offset.shape != (self.num_frames, 2) or not np.isfinite(self.goal_offset).all():
                raise ValueError(
                    f"{where}: goal_offset must be ({self.num_frames}, 2) finite floats, got {self.goal_offset!r}"
                )
        self.progress = np.asarray(self.progress, dtype=np.float32)
        if self.progress.shape != (self.num_frames,):
            raise ValueError(f"{where}: progress has shape {self.progress.shape}, expected ({self.num_frames},)")
        if not np.all((self.progress >= 0) & (self.progress <= 1)):
            raise ValueError(f"{where}: progress labels must lie in [0, 1], got {self.progress}")
        if not self.instruction.strip():
            raise ValueError(f"{where}: empty instruction")
        for name, view in self.views.items():
            if not VIEW_NAME.match(name):
                raise ValueError(f"{where}: view name {name!r} must match {VIEW_NAME.pattern}")
            validate_clip(view, f"{where} view {name!r}")
            if len(view) != self.num_frames:
                raise ValueError(f"{where}: view {name!r} has {len(view)} frames, expected {self.num_frames}")
        if self.reference is not None:
            validate_clip(self.reference, f"{where} reference")

    @property
    def num_frames(self) -> int:
        return len(self.frames)

    def clips(self) -> dict[str, np.ndarray]:
        """The pixels by storage name: "frames", "view.<name>" per view, and "reference" if any."""
        clips = {"frames": self.frames} | {f"view.{name}": self.views[name] for name in sorted(self.views)}
        return clips | ({"reference": self.reference} if self.reference is not None else {})


@dataclass
class PreferencePair:
    """A prompt with a chosen and a rejected sample, each (T, H, W, 3) uint8 (T=1 for images).

    margin: how much better `chosen` is (≥ 0, 0 when unknown). tie: neither is better (margin 0).
    """

    pair_id: int
    prompt: str
    chosen: np.ndarray
    rejected: np.ndarray
    margin: float = 0.0
    tie: bool = False

    def __post_init__(self) -> None:
        where = f"pair {self.pair_id}"
        validate_clip(self.chosen, f"{where} chosen")
        validate_clip(self.rejected, f"{where} rejected")
        if not self.prompt.strip():
            raise ValueError(f"{where}: empty prompt")
        self.margin = float(self.margin)
        if not (np.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"{where}: margin must be a finite number ≥ 0, got {self.margin}")
        if self.tie and self.margin != 0:
            raise ValueError(f"{where}: a tie must have margin 0, got {self.margin}")


# ----------------------------------------------------------------------------- episodes


def episode_stem(episode_id: int) -> str:
    return f"episode_{episode_id:06d}"


def write_episodes(
    root: str | Path,
    records: Iterable[EpisodeRecord],
    frame_format: FrameFormat = "npz",
    *,
    name: str | None = None,
    fps: int = 10,
    generator: Mapping[str, Any] | None = None,
) -> EpisodeDataset:
    """Write an episode dataset into the new folder `root` and return it opened.

    records: any iterable, consumed once; frames are written as records arrive, so a generator
        keeps memory flat. All episodes must share one frame size, one set of views and either all
        have a reference or none.
    frame_format: "npz" (lossless) or "mp4" (H.264 in yuv444p via PyAV, full colour resolution: lossy,
        a mean pixel error of about 1/255); references are always stored as npz.
    name: the dataset name used as `SampleKey.source`; defaults to the folder name.
    generator: how the data was made (generator name, seed, settings), stored in meta.json.
    """
    if frame_format not in FRAME_FORMATS:
        raise ValueError(f"frame_format must be one of {FRAME_FORMATS}, got {frame_format!r}")
    final_root = Path(root)
    _check_destination(final_root, "episodes.parquet")
    dataset_name = name or final_root.resolve().name
    with _dataset_folder(final_root) as root:
        frame_size, clip_names, count, num_rows = _write_episode_files(root, records, frame_format, fps)
        meta = {
            "format": "vlm-rewards/episodes",
            "format_version": FORMAT_VERSION,
            "name": dataset_name,
            "fps": fps,
            "frame_size": list(frame_size),
            "frame_format": frame_format,
            "clips": clip_names,
            "num_episodes": count,
            "num_frames": num_rows,
            "generator": dict(generator) if generator else None,
        }
        write_json(root / "meta.json", meta)
    return EpisodeDataset(final_root)


def _write_episode_files(
    root: Path, records: Iterable[EpisodeRecord], frame_format: FrameFormat, fps: int
) -> tuple[Any, list[str], int, int]:
    """Frames and episodes.parquet into `root`; returns (frame size, clip names, episodes, rows)."""
    table_path = root / "episodes.parquet"
    columns: dict[str, list] = {column: [] for column in EPISODE_SCHEMA.names}
    seen_ids: set[int] = set()
    frame_size, clip_names = None, None
    for record in records:
        if record.episode_id in seen_ids:
            raise ValueError(f"episode {record.episode_id} appears twice; episode ids must be unique")
        seen_ids.add(record.episode_id)
        clips = record.clips()
        if frame_size is None:
            frame_size, clip_names = record.frames.shape[1:3], list(clips)
        if record.frames.shape[1:3] != frame_size or list(clips) != clip_names:
            raise ValueError(
                f"episode {record.episode_id}: frames {record.frames.shape[1:3]} with clips {list(clips)}, "
                f"expected {frame_size} with clips {clip_names} like the first episode"
            )
        _write_clips(root / "frames" / episode_stem(record.episode_id), clips, frame_format, fps)
        columns["episode_id"].append(np.full(record.num_frames, record.episode_id))
        columns["frame_index"].append(np.arange(record.num_frames))
        columns["instruction"].append([record.instruction] * record.num_frames)
        columns["progress"].append(record.progress)
        columns["success"].append(np.full(record.num_frames, record.success))
        columns["policy"].append([record.policy] * record.num_frames)
        columns["stage"].append(np.full(record.num_frames, -1) if record.stage is None else record.stage)
        unknown = np.full(record.num_frames, None, dtype=object)
        columns["frame_success"].append(unknown if record.frame_success is None else record.frame_success)
        for axis, column in enumerate(GOAL_OFFSET_COLUMNS):
            columns[column].append(unknown if record.goal_offset is None else record.goal_offset[:, axis])
    if not seen_ids:
        raise ValueError("no episodes to write")

    table = pa.table({column: np.concatenate(parts) for column, parts in columns.items()}, schema=EPISODE_SCHEMA)
    with atomic_path(table_path) as temporary:
        pq.write_table(table, temporary)
    return frame_size, clip_names, len(seen_ids), table.num_rows


def _check_destination(root: Path, table_name: str) -> None:
    if (root / table_name).exists() or (root / "meta.json").exists():
        raise FileExistsError(f"{root / table_name} exists; write a new dataset into an empty folder")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root} exists and is not an empty folder; write a new dataset into an empty folder")


@contextlib.contextmanager
def _dataset_folder(root: Path) -> Iterator[Path]:
    """A temporary folder that becomes `root` when the whole dataset is written (`root` must be absent or
    empty then too: another writer may have finished first)."""
    with atomic_folder(root) as temporary:
        yield temporary
        _check_destination(root, "meta.json")


def clip_location(stem: Path, frame_format: FrameFormat, clip_name: str) -> tuple[Path, str]:
    """(file, npz key) holding one clip of the episode whose files start with `stem`.

    npz: every clip is an array in `<stem>.npz`. mp4: the main clip is `<stem>.mp4`, a view
    `<stem>.view.<name>.mp4`, and the reference stays lossless in `<stem>.reference.npz` (key `frames`).
    """
    if frame_format == "npz":
        return Path(f"{stem}.npz"), clip_name
    if clip_name == "reference":
        return Path(f"{stem}.reference.npz"), "frames"
    return Path(f"{stem}.mp4" if clip_name == "frames" else f"{stem}.{clip_name}.mp4"), "frames"


def _write_clips(stem: Path, clips: Mapping[str, np.ndarray], frame_format: FrameFormat, fps: int) -> None:
    files: dict[Path, dict[str, np.ndarray]] = defaultdict(dict)
    for clip_name, clip in clips.items():
        path, key = clip_location(stem, frame_format, clip_name)
        files[path][key] = clip
    for path, arrays in files.items():
        if path.suffix == ".mp4":
            with atomic_path(path) as temporary:
                write_video(temporary, arrays["frames"], fps=fps)
        else:
            _write_npz(path, arrays)


def _write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    with atomic_path(path) as temporary, open(temporary, "wb") as file:
        np.savez_compressed(file, **arrays)


class EpisodeDataset:
    """An episode folder written by `write_episodes`; labels are read at once, frames on access."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.meta = _read_meta(self.root, "vlm-rewards/episodes")
        self.name: str = self.meta["name"]
        self.frame_format: FrameFormat = self.meta["frame_format"]
        if self.frame_format not in FRAME_FORMATS:
            raise ValueError(f"{self.root / 'meta.json'}: frame_format {self.frame_format!r}, expected {FRAME_FORMATS}")
        self.clip_names: list[str] = self.meta["clips"]
        self._labels = _read_episode_labels(self.root / "episodes.parquet")

    def __len__(self) -> int:
        return len(self._labels)

    @property
    def episode_ids(self) -> list[int]:
        return list(self._labels)

    @property
    def instructions(self) -> list[str]:
        """The distinct instructions, sorted; read from the table, no frames loaded."""
        return sorted({labels.instruction for labels in self._labels.values()})

    def __iter__(self) -> Iterator[EpisodeRecord]:
        return (self[episode_id] for episode_id in self._labels)

    def __getitem__(self, episode_id: int) -> EpisodeRecord:
        if episode_id not in self._labels:
            raise KeyError(f"{self.root}: no episode {episode_id}")
        labels = self._labels[episode_id]
        clips = self._read_clips(episode_id, num_frames=len(labels.progress))
        return EpisodeRecord(
            episode_id=episode_id,
            instruction=labels.instruction,
            frames=clips["frames"],
            progress=labels.progress,
            success=labels.success,
            policy=labels.policy,
            views={name.removeprefix("view."): clip for name, clip in clips.items() if name.startswith("view.")},
            reference=clips.get("reference"),
            stage=labels.stage,
            frame_success=labels.frame_success,
            goal_offset=labels.goal_offset,
        )

    def to_request(self, record: EpisodeRecord, frame_indices: Iterable[int] | None = None) -> RewardRequest:
        return episode_request(self.name, record, frame_indices)

    def _read_clips(self, episode_id: int, num_frames: int) -> dict[str, np.ndarray]:
        """Every clip of one episode, checked against its rows in episodes.parquet."""
        stem = self.root / "frames" / episode_stem(episode_id)
        clips = {}
        for clip_name in self.clip_names:
            path, key = clip_location(stem, self.frame_format, clip_name)
            clip = read_clip(path, key)
            where = f"{path}[{key!r}]" if path.suffix == ".npz" else str(path)
            validate_clip(clip, where)
            if clip_name != "reference" and len(clip) != num_frames:
                raise ValueError(
                    f"{where}: {len(clip)} frames, but episodes.parquet has {num_frames} rows for episode {episode_id}"
                )
            clips[clip_name] = clip
        return clips


def episode_request(source: str, record: EpisodeRecord, frame_indices: Iterable[int] | None = None) -> RewardRequest:
    """The record (or the frames at `frame_indices`) as a request keyed by its last frame index."""
    indices = np.arange(record.num_frames) if frame_indices is None else np.asarray(list(frame_indices))
    if indices.ndim != 1 or len(indices) == 0 or indices.min() < 0 or indices.max() >= record.num_frames:
        raise ValueError(
            f"frame_indices must be a non-empty list of indices into {record.num_frames} frames, got {indices}"
        )
    return RewardRequest(
        frames=record.frames[indices],
        text=record.instruction,
        reference=record.reference,
        views={name: view[indices] for name, view in record.views.items()},
        key=SampleKey(source=source, episode=record.episode_id, frame=int(indices[-1])),
    )


class EpisodeUnion:
    """Several episode folders read as one dataset (e.g. a round of new rollouts beside the earlier rounds'):
    episodes are numbered 0, 1, ... in folder order, so every episode is drawn with the same chance."""

    def __init__(self, roots: Iterable[str | Path]):
        self.parts = [EpisodeDataset(root) for root in roots]
        if not self.parts:
            raise ValueError("EpisodeUnion needs at least one episode folder")
        self.name = "+".join(part.name for part in self.parts)
        self._index = [(part, episode_id) for part in self.parts for episode_id in part.episode_ids]

    def __len__(self) -> int:
        return len(self._index)

    @property
    def episode_ids(self) -> list[int]:
        return list(range(len(self._index)))

    @property
    def instructions(self) -> list[str]:
        return sorted({instruction for part in self.parts for instruction in part.instructions})

    def __iter__(self) -> Iterator[EpisodeRecord]:
        return (self[episode_id] for episode_id in self.episode_ids)

    def __getitem__(self, episode_id: int) -> EpisodeRecord:
        if not 0 <= episode_id < len(self._index):
            raise KeyError(f"{self.name}: no episode {episode_id} (0..{len(self._index) - 1})")
        part, part_episode_id = self._index[episode_id]
        return replace(part[part_episode_id], episode_id=episode_id)

    def to_request(self, record: EpisodeRecord, frame_indices: Iterable[int] | None = None) -> RewardRequest:
        return episode_request(self.name, record, frame_indices)


@dataclass(frozen=True)
class _EpisodeLabels:
    instruction: str
    progress: np.ndarray
    success: bool
    policy: str | None
    stage: np.ndarray | None = None
    frame_success: np.ndarray | None = None
    goal_offset: np.ndarray | None = None


def _read_episode_labels(path: Path) -> dict[int, _EpisodeLabels]:
    table = _read_table(path, EPISODE_SCHEMA, optional=OPTIONAL_EPISODE_COLUMNS, nullable=NULLABLE_EPISODE_COLUMNS)
    table = table.sort_by([("episode_id", "ascending"), ("frame_index", "ascending")])
    episode_ids = table["episode_id"].to_numpy()
    frame_indices = table["frame_index"].to_numpy()
    progress = table["progress"].to_numpy()
    instructions = table["instruction"].to_pylist()
    successes = table["success"].to_numpy(zero_copy_only=False)
    policies = table["policy"].to_pylist() if "policy" in table.column_names else [None] * table.num_rows
    stages = table["stage"].to_numpy() if "stage" in table.column_names else None
    frame_successes = table["frame_success"].to_pylist() if "frame_success" in table.column_names else None
    offsets = (  # (rows, 2), nulls read as NaN
        np.stack([table[column].to_numpy(zero_copy_only=False) for column in GOAL_OFFSET_COLUMNS], axis=1)
        if all(column in table.column_names for column in GOAL_OFFSET_COLUMNS)
        else None
    )
    if not np.all((progress >= 0) & (progress <= 1)):
        raise ValueError(f"{path}: progress labels outside [0, 1]")

    starts = np.flatnonzero(np.r_[True, episode_ids[1:] != episode_ids[:-1]])
    ends = np.r_[starts[1:], len(episode_ids)]
    labels = {}
    for start, end in zip(starts, ends):
        episode_id = int(episode_ids[start])
        if not np.array_equal(frame_indices[start:end], np.arange(end - start)):
            raise ValueError(f"{path}: episode {episode_id} frame_index must be 0..{end - start - 1}, each once")
        for column, values in [("instruction", instructions), ("success", successes), ("policy", policies)]:
            if len(set(values[start:end])) != 1:
                raise ValueError(f"{path}: episode {episode_id} has several values in column {column!r}")
        labels[episode_id] = _EpisodeLabels(
            instruction=instructions[start],
            progress=progress[start:end],
            success=bool(successes[start]),
            policy=policies[start],
            stage=_known_stages(stages, start, end),
            frame_success=_known_successes(frame_successes, start, end, f"{path}: episode {episode_id}"),
            goal_offset=_known_offsets(offsets, start, end, f"{path}: episode {episode_id}"),
        )
    return labels


def _known_stages(stages: np.ndarray | None, start: int, end: int) -> np.ndarray | None:
    """An episode's stage labels; None when the column is absent or every frame's is unknown (−1)."""
    if stages is None or np.all(stages[start:end] == -1):
        return None
    return stages[start:end]


def _known_successes(values: list | None, start: int, end: int, where: str) -> np.ndarray | None:
    """An episode's per-frame success labels; None when the column is absent or null on every frame."""
    if values is None:
        return None
    episode = values[start:end]
    known = _known_on_all_or_none(np.array([value is None for value in episode]), "frame_success", where)
    return np.array(episode, dtype=bool) if known else None


def _known_offsets(offsets: np.ndarray | None, start: int, end: int, where: str) -> np.ndarray | None:
    """An episode's goal offsets; None when the columns are absent or null on every frame."""
    if offsets is None:
        return None
    episode = offsets[start:end]
    return episode if _known_on_all_or_none(np.isnan(episode).any(axis=1), "goal_offset", where) else None


def _known_on_all_or_none(unknown: np.ndarray, label: str, where: str) -> bool:
    """Whether an episode's per-frame `label` is known, given which frames are null; a mix is an error."""
    if unknown.any() and not unknown.all():
        raise ValueError(f"{where}: {label} is null on {unknown.sum()} of {len(unknown)} frames; expected all or none")
    return not unknown.any()


# ----------------------------------------------------------------------------- preference pairs


def write_pairs(
    root: str | Path,
    pairs: Iterable[PreferencePair],
    *,
    name: str | None = None,
    generator: Mapping[str, Any] | None = None,
) -> PairDataset:
    """Write a pair dataset into the new folder `root` (items as npz) and return it opened."""
    final_root = Path(root)
    _check_destination(final_root, "pairs.parquet")
    dataset_name = name or final_root.resolve().name
    with _dataset_folder(final_root) as root:
        count = _write_pair_files(root, pairs)
        meta = {
            "format": "vlm-rewards/pairs",
            "format_version": PAIR_FORMAT_VERSION,
            "name": dataset_name,
            "num_pairs": count,
            "generator": dict(generator) if generator else None,
        }
        write_json(root / "meta.json", meta)
    return PairDataset(final_root)


def _write_pair_files(root: Path, pairs: Iterable[PreferencePair]) -> int:
    table_path = root / "pairs.parquet"
    rows, seen_ids = [], set()
    for pair in pairs:
        if pair.pair_id in seen_ids:
            raise ValueError(f"pair {pair.pair_id} appears twice; pair ids must be unique")
        seen_ids.add(pair.pair_id)
        paths = {side: f"items/pair_{pair.pair_id:06d}_{side}.npz" for side in ("chosen", "rejected")}
        for side, relative in paths.items():
            _write_npz(root / relative, {"frames": getattr(pair, side)})
        rows.append({"pair_id": pair.pair_id, "prompt": pair.prompt, **paths, "margin": pair.margin, "tie": pair.tie})
    if not rows:
        raise ValueError("no pairs to write")

    with atomic_path(table_path) as temporary:
        pq.write_table(pa.Table.from_pylist(rows, schema=PAIR_SCHEMA), temporary)
    return len(rows)


class PairDataset:
    """A pair folder written by `write_pairs`, or by hand: items may be .npz, images or videos."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.meta = _read_meta(self.root, "vlm-rewards/pairs")
        self.name: str = self.meta["name"]
        path = self.root / "pairs.parquet"
        table = _read_table(path, PAIR_SCHEMA)
        pair_ids = table["pair_id"].to_pylist()
        if len(set(pair_ids)) != len(pair_ids):
            raise ValueError(f"{path}: duplicate pair_id values")
        self._rows = dict(zip(pair_ids, table.drop_columns(["pair_id"]).to_pylist()))

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def pair_ids(self) -> list[int]:
        return list(self._rows)

    def __iter__(self) -> Iterator[PreferencePair]:
        return (self[pair_id] for pair_id in self._rows)

    def __getitem__(self, pair_id: int) -> PreferencePair:
        if pair_id not in self._rows:
            raise KeyError(f"{self.root}: no pair {pair_id}")
        row = self._rows[pair_id]
        return PreferencePair(
            pair_id=pair_id,
            prompt=row["prompt"],
            chosen=self._load_item(row["chosen"]),
            rejected=self._load_item(row["rejected"]),
            margin=row["margin"],
            tie=row["tie"],
        )

    def to_requests(self, pair: PreferencePair) -> tuple[RewardRequest, RewardRequest]:
        """(chosen, rejected) as requests, keyed by episode `pair_<id>.chosen` / `pair_<id>.rejected`."""
        return self._request(pair, "chosen", pair.chosen), self._request(pair, "rejected", pair.rejected)

    def _request(self, pair: PreferencePair, side: str, frames: np.ndarray) -> RewardRequest:
        key = SampleKey(source=self.name, episode=f"pair_{pair.pair_id:06d}.{side}", frame=len(frames) - 1)
        return RewardRequest(frames=frames, text=pair.prompt, key=key)

    def _load_item(self, relative: str) -> np.ndarray:
        path = self.root / relative
        frames = read_clip(path)
        validate_clip(frames, str(path))
        return frames


# ----------------------------------------------------------------------------- shared readers


REQUIRED_META = {
    "vlm-rewards/episodes": {"name": str, "frame_format": str, "clips": list},
    "vlm-rewards/pairs": {"name": str},
}


def _read_meta(root: Path, expected_format: str) -> dict[str, Any]:
    if not root.is_dir():
        raise ValueError(f"{root}: no such dataset folder")
    path = root / "meta.json"
    _require_file(path)
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    versions = READABLE_VERSIONS[expected_format]
    if meta.get("format") != expected_format or meta.get("format_version") not in versions:
        raise ValueError(
            f"{path}: format {meta.get('format')!r} version {meta.get('format_version')!r}, "
            f"expected {expected_format!r} version {' or '.join(map(str, versions))}"
        )
    for key, kind in REQUIRED_META[expected_format].items():
        if not isinstance(meta.get(key), kind):
            raise ValueError(f"{path}: key {key!r} missing or not a {kind.__name__} (got {meta.get(key)!r})")
    return meta


def _read_table(path: Path, schema: pa.Schema, optional: Iterable[str] = (), nullable: Iterable[str] = ()) -> pa.Table:
    """Read a parquet table and check it has every column of `schema` (bar `optional`) with its type, free of
    nulls (bar `nullable`)."""
    _require_file(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise ValueError(f"{path}: not a readable parquet table ({error})") from None
    missing = [name for name in schema.names if name not in table.column_names and name not in optional]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected columns {schema.names}")
    for expected in schema:
        if expected.name not in table.column_names:
            continue
        actual = table.schema.field(expected.name).type
        if actual != expected.type:
            raise ValueError(f"{path}: column {expected.name!r} has type {actual}, expected {expected.type}")
        if expected.name not in nullable and table[expected.name].null_count:
            raise ValueError(f"{path}: column {expected.name!r} has missing values")
    return table


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
