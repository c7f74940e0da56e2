"""LeRobot v3.0 datasets: listed, read as progress episodes and written, with pyarrow and PyAV (LeRobot itself
cannot share this environment, so its documented layout is the contract):

    meta/info.json                              codebase_version "v3.0", fps, features, path templates, totals
    meta/stats.json                             per-feature min / max / mean / std / count
    meta/tasks.parquet                          task text (the pandas index, or a `task` column) and task_index
    meta/episodes/chunk-XXX/file-YYY.parquet    one row per episode: length, tasks, its data file and global index
                                                range, and per camera its video file and timestamp range
    data/chunk-XXX/file-YYY.parquet             one row per frame, many episodes per file
    videos/<camera>/chunk-XXX/file-YYY.mp4      many episodes per file; episode frame i at from_timestamp + i / fps

`list_episodes` is the one listing of such a dataset: `vlmr annotate` builds its episode refs from it
(`vlm_rewards.annotation.sources`), and `LeRobotEpisodes` reads it as an episode dataset for `train-rm` and
`eval-rm`, decoding through the annotation decoder. Success of an episode: a `success` column of the episodes
table, else the last frame's `next.success` (or `success`) feature, else unknown. `write_lerobot` writes a new
dataset (`vlmr collect` with `format: lerobot`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vlm_rewards.io import atomic_folder, atomic_path, write_json
from vlm_rewards.media import write_video

logger = logging.getLogger(__name__)

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNKS_SIZE = 1000  # files per chunk folder, as LeRobot writes them
SUCCESS_FEATURES = ("next.success", "success")
SARM_PROGRESS = "sarm_progress.parquet"  # where LeRobot's SARM scripts put per-frame progress
SARM_COLUMNS = ("episode_index", "frame_index")


@dataclass(frozen=True)
class CameraSpan:
    """Where one camera's frames of a LeRobot episode lie: a video file and a timestamp range."""

    name: str  # the camera key, or the name a reader gives it ("frames" or a view name)
    path: str
    from_timestamp: float
    to_timestamp: float


@dataclass(frozen=True)
class LeRobotEpisode:
    """One row of meta/episodes with what the data file adds (task text, success), no pixels."""

    episode_index: int
    length: int
    task: str | None
    success: bool | None
    index_start: int
    data_file: Path
    videos: dict[str, CameraSpan] = field(default_factory=dict)
    policy: str | None = None


# ----------------------------------------------------------------------------- listing


def read_info(root: Path) -> dict[str, Any]:
    path = Path(root) / "meta" / "info.json"
    if not path.is_file():
        raise ValueError(f"{root}: not a LeRobot dataset (no meta/info.json)")
    info = json.loads(path.read_text())
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3"):
        raise ValueError(f"{path}: codebase_version {version!r}; only LeRobot v3.x datasets are supported")
    return info


def video_keys(info: dict[str, Any]) -> list[str]:
    return [key for key, feature in info.get("features", {}).items() if feature.get("dtype") == "video"]


def select_cameras(info: dict[str, Any], root: Path, camera: str | None, views: dict[str, str]) -> dict[str, str]:
    """{"frames": the scored camera (default: the first video feature), view name: camera key, ...}, checked."""
    keys = video_keys(info)
    cameras = {"frames": camera or (keys[0] if keys else None), **views}
    for name, key in cameras.items():
        if key not in keys:
            raise ValueError(f"source camera {key!r} (for {name}) is not a video feature of {root}; found {keys}")
    return cameras


def read_tasks(root: Path) -> dict[int, str]:
    path = Path(root) / "meta" / "tasks.parquet"
    if not path.is_file():
        return {}
    table = pq.read_table(path)
    names = table.column_names
    text_column = next((c for c in ("task", "__index_level_0__") if c in names), None)
    if text_column is None or "task_index" not in names:
        raise ValueError(f"{path}: expected columns task (or the pandas index) and task_index, got {names}")
    return dict(zip(table["task_index"].to_pylist(), table[text_column].to_pylist()))


def list_episodes(root: str | Path) -> tuple[dict[str, Any], list[LeRobotEpisode]]:
    """The dataset's info and its episodes in episode_index order (one read of each data file's summary)."""
    root = Path(root)
    info = read_info(root)
    tasks = read_tasks(root)
    video_path = info.get("video_path", VIDEO_PATH)
    data_path = info.get("data_path", DATA_PATH)
    episode_files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not episode_files:
        raise ValueError(f"{root}: no meta/episodes/chunk-*/file-*.parquet")
    rows = [row for path in episode_files for row in pq.read_table(path).to_pylist()]
    rows.sort(key=lambda row: row["episode_index"])
    data_cache: dict[str, dict[int, dict[str, Any]]] = {}
    episodes = []
    for row in rows:
        episode_index = int(row["episode_index"])
        data_file = root / data_path.format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
        data = _episode_data(data_file, data_cache).get(episode_index, {})
        listed = row.get("tasks") or []
        videos = {}
        for key in video_keys(info):
            if f"videos/{key}/chunk_index" not in row:
                continue
            file = video_path.format(
                video_key=key, chunk_index=row[f"videos/{key}/chunk_index"], file_index=row[f"videos/{key}/file_index"]
            )
            videos[key] = CameraSpan(
                key, str(root / file), float(row[f"videos/{key}/from_timestamp"]),
                float(row[f"videos/{key}/to_timestamp"]),
            )  # fmt: skip
        success = row.get("success")
        episodes.append(
            LeRobotEpisode(
                episode_index=episode_index,
                length=int(row["length"]),
                task=listed[0] if listed else tasks.get(data.get("task_index")),
                success=bool(success) if success is not None else data.get("success"),
                index_start=int(row.get("dataset_from_index", data.get("index_start", 0))),
                data_file=data_file,
                videos=videos,
                policy=row.get("policy"),
            )
        )
    return info, episodes


def _episode_data(path: Path, cache: dict[str, dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """Per episode of one data file: its task_index, first global index and (if the file has a success
    feature, `SUCCESS_FEATURES`) the success flag of its last frame. One file read, kept while listing."""
    if str(path) in cache:
        return cache[str(path)]
    cache.clear()  # episodes are sorted, so a file is done once the next one is needed
    summary: dict[int, dict[str, Any]] = {}
    if path.is_file():
        schema = pq.read_schema(path)
        success = next((name for name in SUCCESS_FEATURES if name in schema.names), None)
        columns = [c for c in ("episode_index", "index", "task_index", success) if c in schema.names]
        table = pq.read_table(path, columns=columns).to_pydict()
        for i, episode_index in enumerate(table["episode_index"]):
            entry = summary.setdefault(int(episode_index), {"index_start": table.get("index", [0] * (i + 1))[i]})
            if "task_index" in table:
                entry.setdefault("task_index", table["task_index"][i])
            if success:
                entry["success"] = bool(table[success][i])
    cache[str(path)] = summary
    return summary


def episode_rows(episode: LeRobotEpisode, columns: list[str] | None = None) -> pa.Table:
    """The data rows of one episode (all columns, or `columns`), in frame order."""
    table = pq.read_table(episode.data_file, columns=columns and sorted({*columns, "episode_index", "frame_index"}))
    mask = pc.equal(table["episode_index"], episode.episode_index)
    return table.filter(mask).sort_by("frame_index")


def episode_range(info: dict[str, Any], spec: str | None, where: str) -> range | None:
    """The episode indices `spec` names: "start:stop" (LeRobot's `splits` syntax; either end may be left out)
    or the name of a split in meta/info.json; None: every episode."""
    if spec is None:
        return None
    splits = info.get("splits") or {}
    start, colon, stop = str(splits.get(spec, spec)).partition(":")
    try:
        if not colon:
            raise ValueError
        return range(int(start or 0), int(stop) if stop else np.iinfo(np.int64).max)
    except ValueError:
        raise ValueError(
            f"{where} {spec!r}: expected 'start:stop' episode indices or a split of meta/info.json {sorted(splits)}"
        ) from None


def read_sarm_progress(path: Path, head: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per episode, (frame indices, progress) from a SARM-style progress parquet: columns episode_index,
    frame_index and progress_<head> (LeRobot's SARM scripts write index, episode_index, frame_index,
    progress_sparse and progress_dense, possibly on a stride)."""
    column = f"progress_{head}"
    if not path.is_file():
        raise ValueError(f"{path}: no such SARM progress parquet (lerobot.sarm_progress)")
    names = pq.read_schema(path).names
    missing = [name for name in (*SARM_COLUMNS, column) if name not in names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected {[*SARM_COLUMNS, column]}, got {names}")
    table = pq.read_table(path, columns=[*SARM_COLUMNS, column]).sort_by([(c, "ascending") for c in SARM_COLUMNS])
    episodes = table["episode_index"].to_numpy()
    frames, values = table["frame_index"].to_numpy(), table[column].to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1]])
    ends = np.r_[starts[1:], len(episodes)]
    return {int(episodes[s]): (frames[s:e], values[s:e].astype(np.float32)) for s, e in zip(starts, ends)}


# ----------------------------------------------------------------------------- writing


@dataclass
class LeRobotEpisodeData:
    """One episode to write: its task, camera clips and per-frame features, all with the same T frames.

    videos: camera key (e.g. "observation.images.top") -> (T, H, W, 3) uint8.
    features: feature key (e.g. "action") -> (T,) or (T, n) float32 / bool / int64 values.
    success, policy: per-episode columns of the episodes table (None: not written for this episode).
    progress: (T,) labels in [0, 1], written to `sarm_progress.parquet` (both heads) when given.
    """

    task: str
    videos: dict[str, np.ndarray]
    features: dict[str, np.ndarray]
    success: bool | None = None
    policy: str | None = None
    progress: np.ndarray | None = None


def write_lerobot(
    root: str | Path,
    episodes: Iterable[LeRobotEpisodeData],
    *,
    fps: int,
    robot_type: str | None = None,
    episodes_per_file: int = 50,
) -> Path:
    """Write a LeRobot v3.0 dataset into the new folder `root` (written whole in a temporary folder, then
    renamed). Every episode must have the same cameras and features (keys, shapes, dtypes). Videos are H.264
    (`vlm_rewards.media.write_video`), `episodes_per_file` episodes per data and video file."""
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root} exists and is not an empty folder; write a new dataset into an empty folder")
    with atomic_folder(root) as folder:
        writer = _Writer(folder, fps, episodes_per_file)
        for episode in episodes:
            writer.add(episode)
        writer.finish(robot_type)
    return root


class _Writer:
    def __init__(self, root: Path, fps: int, episodes_per_file: int):
        self.root, self.fps, self.episodes_per_file = root, fps, episodes_per_file
        self.tasks: dict[str, int] = {}
        self.schema: dict[str, tuple[np.dtype, tuple[int, ...]]] | None = None
        self.camera_shapes: dict[str, tuple[int, ...]] = {}
        self.pending: list[LeRobotEpisodeData] = []
        self.episode_rows: list[dict[str, Any]] = []
        self.progress_rows: list[pa.Table] = []
        self.stats: dict[str, _Stats] = {}
        self.num_frames, self.file_count = 0, 0

    def add(self, episode: LeRobotEpisodeData) -> None:
        self._check(episode)
        self.pending.append(episode)
        if len(self.pending) == self.episodes_per_file:
            self._flush()

    def _check(self, episode: LeRobotEpisodeData) -> None:
        where = f"episode {len(self.episode_rows) + len(self.pending)}"
        lengths = {len(array) for array in [*episode.videos.values(), *episode.features.values()]}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"{where}: videos and features must share one non-zero frame count, got {sorted(lengths)}")
        schema = {key: (np.asarray(value).dtype, np.shape(value)[1:]) for key, value in episode.features.items()}
        cameras = {key: clip.shape[1:] for key, clip in episode.videos.items()}
        if self.schema is None:
            self.schema, self.camera_shapes = schema, cameras
        if schema != self.schema or cameras != self.camera_shapes:
            raise ValueError(
                f"{where}: features {schema} and cameras {cameras}, expected {self.schema} and "
                f"{self.camera_shapes} like the first episode"
            )

    def _flush(self) -> None:
        if not self.pending:
            return
        chunk, file = divmod(self.file_count, CHUNKS_SIZE)
        location = {"chunk_index": chunk, "file_index": file}
        columns: dict[str, list[np.ndarray]] = {}
        offset = 0.0
        for episode in self.pending:
            self._add_episode(episode, location, offset, columns)
            offset += len(next(iter(episode.videos.values()))) / self.fps
        data_path = self.root / DATA_PATH.format(**location)
        data_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({key: _arrow(np.concatenate(parts)) for key, parts in columns.items()}), data_path)
        for key in self.camera_shapes:
            video = self.root / VIDEO_PATH.format(video_key=key, **location)
            video.parent.mkdir(parents=True, exist_ok=True)
            write_video(video, np.concatenate([episode.videos[key] for episode in self.pending]), fps=self.fps)
        self.pending, self.file_count = [], self.file_count + 1

    def _add_episode(self, episode: LeRobotEpisodeData, location: dict, offset: float, columns: dict) -> None:
        episode_index, length = len(self.episode_rows), len(next(iter(episode.videos.values())))
        task_index = self.tasks.setdefault(episode.task, len(self.tasks))
        frame_index = np.arange(length, dtype=np.int64)
        values = {
            **{key: np.asarray(value) for key, value in episode.features.items()},
            "timestamp": (frame_index / self.fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(length, episode_index, np.int64),
            "index": self.num_frames + frame_index,
            "task_index": np.full(length, task_index, np.int64),
        }
        for key, value in values.items():
            columns.setdefault(key, []).append(value)
            self.stats.setdefault(key, _Stats()).add(value.reshape(length, -1).astype(np.float64))
        for key, clip in episode.videos.items():  # LeRobot's image stats: per channel, in [0, 1]
            self.stats.setdefault(key, _Stats(image=True)).add(clip.reshape(-1, 3) / 255.0, frames=length)
        row = {
            "episode_index": episode_index,
            "tasks": [episode.task],
            "length": length,
            "data/chunk_index": location["chunk_index"],
            "data/file_index": location["file_index"],
            "dataset_from_index": self.num_frames,
            "dataset_to_index": self.num_frames + length,
        }
        for key in self.camera_shapes:
            row |= {f"videos/{key}/chunk_index": location["chunk_index"], f"videos/{key}/file_index":
                    location["file_index"], f"videos/{key}/from_timestamp": offset,
                    f"videos/{key}/to_timestamp": offset + length / self.fps}  # fmt: skip
        row |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        self.episode_rows.append(row | {"success": episode.success, "policy": episode.policy})
        if episode.progress is not None:
            progress = np.asarray(episode.progress, np.float32)
            self.progress_rows.append(
                pa.table({"index": values["index"], "episode_index": values["episode_index"],
                          "frame_index": frame_index, "progress_sparse": progress, "progress_dense": progress})
            )  # fmt: skip
        self.num_frames += length

    def finish(self, robot_type: str | None) -> None:
        self._flush()
        if not self.episode_rows:
            raise ValueError("no episodes to write")
        meta = self.root / "meta"
        episodes_path = self.root / EPISODES_PATH.format(chunk_index=0, file_index=0)
        episodes_path.parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(self.episode_rows), episodes_path)
        tasks = pa.table({"task_index": pa.array(list(self.tasks.values()), pa.int64()), "task": list(self.tasks)})
        pq.write_table(tasks, meta / "tasks.parquet")
        if self.progress_rows:
            pq.write_table(pa.concat_tables(self.progress_rows), self.root / SARM_PROGRESS)
        with atomic_path(meta / "info.json") as temporary:  # keys in order: readers score the first camera
            temporary.write_text(json.dumps(self._info(robot_type), indent=4) + "\n")
        write_json(meta / "stats.json", {key: stats.to_json() for key, stats in sorted(self.stats.items())})

    def _info(self, robot_type: str | None) -> dict[str, Any]:
        features: dict[str, Any] = {}
        for key, (height, width, channels) in self.camera_shapes.items():
            features[key] = {
                "dtype": "video",
                "shape": [height, width, channels],
                "names": ["height", "width", "channels"],
                "info": {"video.height": height, "video.width": width, "video.codec": "h264",
                         "video.pix_fmt": "yuv444p", "video.is_depth_map": False, "video.fps": self.fps,
                         "video.channels": channels, "has_audio": False},
            }  # fmt: skip
        defaults = {"timestamp": (np.dtype(np.float32), ()), **dict.fromkeys(
            ("frame_index", "episode_index", "index", "task_index"), (np.dtype(np.int64), ()))}  # fmt: skip
        for key, (dtype, shape) in {**self.schema, **defaults}.items():
            features[key] = {"dtype": "bool" if dtype == np.bool_ else dtype.name, "shape": list(shape) or [1],
                             "names": None}  # fmt: skip
        count = len(self.episode_rows)
        return {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": robot_type,
            "total_episodes": count,
            "total_frames": self.num_frames,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 500,
            "fps": self.fps,
            "splits": {"train": f"0:{count}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH,
            "features": features,
        }


def _arrow(values: np.ndarray) -> pa.Array:
    """A column: scalars as they are, (N, n) rows as fixed-size lists (LeRobot's `Sequence(length=n)`)."""
    if values.ndim == 1:
        return pa.array(values)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


class _Stats:
    """Running min / max / mean / std / count over frames, per dimension (images: per channel, shape (3, 1, 1))."""

    def __init__(self, image: bool = False):
        self.image, self.count, self.values, self.total, self.squares = image, 0, 0, 0.0, 0.0
        self.low: np.ndarray | None = None
        self.high: np.ndarray | None = None

    def add(self, values: np.ndarray, frames: int | None = None) -> None:
        """values: (N, d), N values of each dimension; frames: how many frames they come from (default N)."""
        self.count += len(values) if frames is None else frames
        self.values += len(values)
        self.total = self.total + values.sum(axis=0)
        self.squares = self.squares + (values**2).sum(axis=0)
        low, high = values.min(axis=0), values.max(axis=0)
        self.low = low if self.low is None else np.minimum(self.low, low)
        self.high = high if self.high is None else np.maximum(self.high, high)

    def to_json(self) -> dict[str, list]:
        mean = self.total / self.values
        std = np.sqrt(np.maximum(self.squares / self.values - mean**2, 0.0))
        shape = (-1, 1, 1) if self.image else (-1,)
        stats = {"min": self.low, "max": self.high, "mean": mean, "std": std}
        return {name: np.reshape(value, shape).tolist() for name, value in stats.items()} | {"count": [self.count]}
