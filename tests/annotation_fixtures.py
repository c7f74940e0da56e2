"""Fixture builders for the annotation tests: videos in several codecs/containers, a LeRobot v3 layout,
broken files, and small reward functions (importable by a CLI subprocess as `tests.annotation_fixtures`)."""

from __future__ import annotations

import json
import os
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from PIL import Image

from vlm_rewards.interface import RewardRequest, RewardResult

SIZE = 32
CODECS = {  # container suffix -> (format, codec, pix_fmt)
    ".mp4": ("mp4", "libx264", "yuv420p"),
    ".webm": ("webm", "libvpx-vp9", "yuv420p"),
    ".avi": ("avi", "mpeg4", "yuv420p"),
    ".mkv": ("matroska", "libx264", "yuv420p"),
}


def ramp_frames(num_frames: int, start: float = 20, end: float = 235, size: int = SIZE, seed: int = 0) -> np.ndarray:
    """Frames whose brightness goes linearly from `start` to `end` (plus a little texture)."""
    rng = np.random.default_rng(seed)
    levels = np.linspace(start, end, num_frames)
    texture = rng.integers(-8, 8, size=(size, size, 1))
    frames = np.clip(levels[:, None, None, None] + texture[None], 0, 255)
    return np.repeat(frames, 3, axis=-1).astype(np.uint8)


def write_video(path: Path, frames: np.ndarray, fps: int = 10) -> Path:
    fmt, codec, pix_fmt = CODECS[path.suffix]
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], pix_fmt
        if codec == "libx264":
            stream.options = {"crf": "10"}
        for i, frame in enumerate(frames):
            video_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
            video_frame.pts, video_frame.time_base = i, Fraction(1, fps)
            container.mux(stream.encode(video_frame))
        container.mux(stream.encode())
    return path


def write_goal(path: Path, value: int = 255, size: int = SIZE) -> Path:
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(path)
    return path


def make_video_folder(root: Path, lengths=(6, 9, 7, 8), broken: bool = False, missing_instruction: bool = False):
    """Videos in four containers/codecs plus a JSON sidecar; optionally broken files and an unlisted video."""
    suffixes = [".mp4", ".webm", ".avi", ".mkv"]
    sidecar = {}
    for i, length in enumerate(lengths):
        name = f"clip_{i:02d}{suffixes[i % len(suffixes)]}"
        write_video(root / name, ramp_frames(length, seed=i))
        sidecar[name] = {"instruction": f"make it bright {i}", "success": True}
    if broken:
        (root / "corrupt.mp4").write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
        (root / "empty.webm").write_bytes(b"")
        good = (root / "clip_00.mp4").read_bytes()
        (root / "truncated.mp4").write_bytes(good[: len(good) // 2])
        (root / "folder.mkv").mkdir()
        for name in ("corrupt.mp4", "empty.webm", "truncated.mp4", "folder.mkv"):
            sidecar[name] = "make it bright"
    if missing_instruction:
        write_video(root / "zz_unlisted.mp4", ramp_frames(5))
    (root / "instructions.json").write_text(json.dumps(sidecar))
    return root


def make_lerobot_dataset(
    root: Path,
    lengths=(6, 8, 5, 7, 6),
    episodes_per_file: int = 3,
    fps: int = 10,
    cameras=("observation.images.top", "observation.images.wrist"),
    success=None,
    shapes=None,
) -> Path:
    """A LeRobot v3.0 layout: several episodes per data/video file, located by timestamps.

    shapes: per episode "ramp" (default), "collapse" (up then down) or "flat".
    """
    import pandas as pd

    shapes = shapes or ["ramp"] * len(lengths)
    success = success if success is not None else [True] * len(lengths)
    tasks = ["pick the cube", "open the drawer"]
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    pd.DataFrame({"task_index": range(len(tasks))}, index=pd.Index(tasks, name="task")).to_parquet(
        root / "meta" / "tasks.parquet"
    )
    episode_rows, index = [], 0
    starts = range(0, len(lengths), episodes_per_file)
    files = [list(range(s, min(s + episodes_per_file, len(lengths)))) for s in starts]
    for file_index, episodes in enumerate(files):
        data: dict[str, list] = {k: [] for k in ("observation.state", "action", "timestamp", "frame_index",
                                                 "episode_index", "index", "task_index", "next.success")}  # fmt: skip
        video_frames = {camera: [] for camera in cameras}
        offset = 0.0
        for episode in episodes:
            length = lengths[episode]
            frames = _shaped(shapes[episode], length, episode)
            for c, camera in enumerate(cameras):
                video_frames[camera].append(frames if c == 0 else 255 - frames)
            for t in range(length):
                data["observation.state"].append([float(t), float(episode)])
                data["action"].append([0.1 * t, 0.0])
                data["timestamp"].append(t / fps)
                data["frame_index"].append(t)
                data["episode_index"].append(episode)
                data["index"].append(index + t)
                data["task_index"].append(episode % len(tasks))
                data["next.success"].append(bool(success[episode]) and t == length - 1)
            row = {
                "episode_index": episode,
                "tasks": [tasks[episode % len(tasks)]],
                "length": length,
                "data/chunk_index": 0,
                "data/file_index": file_index,
                "dataset_from_index": index,
                "dataset_to_index": index + length,
                "meta/episodes/chunk_index": 0,
                "meta/episodes/file_index": 0,
            }
            for camera in cameras:
                prefix = f"videos/{camera}"
                row |= {
                    f"{prefix}/chunk_index": 0,
                    f"{prefix}/file_index": file_index,
                    f"{prefix}/from_timestamp": offset,
                    f"{prefix}/to_timestamp": offset + length / fps,
                }
            episode_rows.append(row)
            offset += length / fps
            index += length
        table = pa.table(
            {
                "observation.state": pa.array(data["observation.state"], pa.list_(pa.float32(), 2)),
                "action": pa.array(data["action"], pa.list_(pa.float32(), 2)),
                "timestamp": pa.array(data["timestamp"], pa.float32()),
                **{k: pa.array(data[k], pa.int64()) for k in ("frame_index", "episode_index", "index", "task_index")},
                "next.success": pa.array(data["next.success"], pa.bool_()),
            }
        )
        path = root / "data" / "chunk-000" / f"file-{file_index:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        for camera in cameras:
            write_video(root / "videos" / camera / "chunk-000" / f"file-{file_index:03d}.mp4",
                        np.concatenate(video_frames[camera]), fps)  # fmt: skip
    pq.write_table(pa.Table.from_pylist(episode_rows), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    scalar = {"dtype": "int64", "shape": [1], "names": None}
    info = {
        "codebase_version": "v3.0",
        "robot_type": "test",
        "total_episodes": len(lengths),
        "total_frames": index,
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": fps,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": {
            **{
                camera: {
                    "dtype": "video",
                    "shape": [SIZE, SIZE, 3],
                    "names": ["height", "width", "channels"],
                    "info": {"video.fps": fps, "video.codec": "h264"},
                }
                for camera in cameras
            },  # fmt: skip
            "observation.state": {"dtype": "float32", "shape": [2], "names": None},
            "action": {"dtype": "float32", "shape": [2], "names": None},
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            "frame_index": scalar,
            "episode_index": scalar,
            "index": scalar,
            "task_index": scalar,
            "next.success": {"dtype": "bool", "shape": [1], "names": None},
        },  # fmt: skip
    }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    stats = {"action": {"min": [0, 0], "max": [1, 0], "mean": [0.5, 0], "std": [0.1, 0], "count": [index]}}
    (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))
    return root


def _shaped(shape: str, length: int, seed: int) -> np.ndarray:
    if shape == "collapse":
        up = ramp_frames(length - length // 3, seed=seed)
        return np.concatenate([up, ramp_frames(length // 3, start=235, end=20, seed=seed)])
    if shape == "flat":
        return ramp_frames(length, start=20, end=22, seed=seed)
    return ramp_frames(length, seed=seed)


def write_reward_yaml(path: Path, function: str, **flags) -> Path:
    config = {"kind": "function", "function": f"tests.annotation_fixtures:{function}", "dense": True,
              "value_range": [0.0, 1.0], **flags}  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


# ----------------------------------------------------------------------------- reward functions


def brightness_progress(request: RewardRequest) -> RewardResult:
    """Dense: progress = mean brightness / 255 per frame."""
    progress = request.frames.reshape(len(request.frames), -1).mean(axis=1) / 255.0
    return RewardResult(reward=float(progress[-1]), progress=progress)


def brightness_or_error(request: RewardRequest) -> RewardResult:
    """Like `brightness_progress`, but a reward error (NaN + error) for instructions containing '2'."""
    if "2" in request.text:
        return RewardResult(reward=float("nan"), progress=np.full(request.num_frames, np.nan), error="model refused")
    return brightness_progress(request)


def slow_brightness(request: RewardRequest) -> RewardResult:
    time.sleep(float(os.environ.get("VLMR_TEST_REWARD_SLEEP", "0.15")))
    return brightness_progress(request)


def frame_budget_probe(request: RewardRequest) -> RewardResult:
    """Records the clip length the reward saw in info (checks subsampling)."""
    result = brightness_progress(request)
    return RewardResult(result.reward, result.progress, info={"seen": request.num_frames})


def sleepy_pid(seconds: float) -> int:
    """A decode-pool task for the parallelism check: sleeps, returns the worker's pid."""
    time.sleep(seconds)
    return os.getpid()
