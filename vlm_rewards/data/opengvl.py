"""OpenGVL-style evaluation sets: episodes whose frames are shown in shuffled order, with their true completion.

OpenGVL (github.com/budzianowski/opengvl) shows a model an episode's first frame, then a subset of its frames in
shuffled order, asks for each frame's task completion, puts the answers back in time order and scores them with
VOC (`vlm_rewards.evaluation.metrics.voc`). A set on disk is a folder:

    <set>/episodes.jsonl     one JSON object per episode: OpenGVL's `Episode` fields, at the top level or under
                             "eval_episode" (as in OpenGVL's prediction records)
    <set>/...                the frames, as files named relative to the set folder

Fields: `instruction`; `episode_index`; `shuffled_frames`: the frames in the order shown, a list of image files
or one .npz / video file; `shuffled_frames_indices`: their indices in the original episode, in that order;
`original_frames_indices` (sorted) and `original_frames_task_completion_rates` (0-100, aligned with them): the true
completion; optional `starting_frame`: an image of the episode's first frame, shown before the shuffled ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlm_rewards.interface import RewardRequest, SampleKey, validate_clip
from vlm_rewards.media import read_clip

REQUIRED = ("instruction", "shuffled_frames", "shuffled_frames_indices", "original_frames_indices",
            "original_frames_task_completion_rates")  # fmt: skip


@dataclass
class OpenGVLEpisode:
    """One episode of a set: the frames as shown, their original indices and true completion (0-100)."""

    episode_index: int
    instruction: str
    frames: np.ndarray  # (N, H, W, 3) uint8, in the order shown
    shuffled_indices: np.ndarray  # (N,) original frame indices, in the order shown
    completion: np.ndarray  # (N,) true completion in percent, in the order shown
    starting_frame: np.ndarray | None = None  # (1, H, W, 3) uint8, shown first

    @property
    def num_shown(self) -> int:
        return len(self.frames) + (self.starting_frame is not None)

    def request(self, source: str) -> RewardRequest:
        """The starting frame (if any), then the shuffled frames, in one clip."""
        frames = self.frames if self.starting_frame is None else np.concatenate([self.starting_frame, self.frames])
        key = SampleKey(source=source, episode=self.episode_index, frame=len(frames) - 1)
        return RewardRequest(frames=frames, text=self.instruction, key=key)


def read_opengvl_set(root: str | Path) -> tuple[list[OpenGVLEpisode], dict[str, str]]:
    """The readable episodes of a set, and the lines left out ("line N" -> why)."""
    root = Path(root)
    path = root / "episodes.jsonl"
    if not path.is_file():
        raise ValueError(f"{root}: not an OpenGVL-style set (no episodes.jsonl)")
    episodes, skipped = [], {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            episodes.append(_episode(root, json.loads(line)))
        except (ValueError, KeyError, TypeError) as error:  # json.JSONDecodeError is a ValueError
            skipped[f"line {number}"] = f"{type(error).__name__}: {error}"
    if not episodes:
        raise ValueError(f"{path}: no readable episode ({skipped or 'the file is empty'})")
    return episodes, skipped


def _episode(root: Path, record: dict[str, Any]) -> OpenGVLEpisode:
    record = record.get("eval_episode", record)
    missing = [name for name in REQUIRED if name not in record]
    if missing:
        raise ValueError(f"missing field(s) {missing}; expected {list(REQUIRED)}")
    shown = np.asarray(record["shuffled_frames_indices"], dtype=np.int64)
    truth = dict(zip(record["original_frames_indices"], record["original_frames_task_completion_rates"], strict=True))
    unknown = sorted(set(shown.tolist()) - set(truth))
    if unknown or len(set(shown.tolist())) != len(shown):
        raise ValueError(f"shuffled_frames_indices must be distinct original_frames_indices; {unknown} are not")
    frames = _frames(root, record["shuffled_frames"])
    if len(frames) != len(shown):
        raise ValueError(f"{len(frames)} shuffled_frames but {len(shown)} shuffled_frames_indices")
    starting = read_clip(root / record["starting_frame"])[:1] if record.get("starting_frame") else None
    if starting is not None and starting.shape[1:] != frames.shape[1:]:
        raise ValueError(f"starting_frame is {starting.shape[1:]}, the shuffled frames {frames.shape[1:]}")
    instruction = str(record["instruction"])
    if not instruction.strip():
        raise ValueError("empty instruction")
    return OpenGVLEpisode(
        episode_index=int(record.get("episode_index", 0)),
        instruction=instruction,
        frames=frames,
        shuffled_indices=shown,
        completion=np.array([truth[i] for i in shown.tolist()], dtype=np.float64),
        starting_frame=starting,
    )


def _frames(root: Path, files: str | list[str]) -> np.ndarray:
    if isinstance(files, str):
        frames = read_clip(root / files)
    else:
        clips = [read_clip(root / file) for file in files]
        if len({clip.shape[1:] for clip in clips}) > 1:
            raise ValueError("shuffled_frames differ in size")
        frames = np.concatenate([clip[:1] for clip in clips])
    validate_clip(frames, "shuffled_frames")
    return frames
