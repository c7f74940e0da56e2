"""A LeRobot v3 dataset read as progress episodes for `vlmr train-rm` and `vlmr eval-rm`.

The layout (listing, tasks, SARM progress files) is read by `vlm_rewards.data.lerobot`; the frames are
decoded by the annotation job's decoder (this module sits beside it: training and evaluation read
LeRobot data through it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from vlm_rewards.annotation.config import SamplingConfig
from vlm_rewards.annotation.decode import DecodeError, decode_episode
from vlm_rewards.annotation.sources import EpisodeRef
from vlm_rewards.data.config import LeRobotSource
from vlm_rewards.data.episodes import EpisodeRecord, episode_request
from vlm_rewards.data.lerobot import (
    SARM_PROGRESS,
    LeRobotEpisode,
    episode_range,
    list_episodes,
    read_sarm_progress,
    select_cameras,
)
from vlm_rewards.interface import RewardRequest

logger = logging.getLogger(__name__)


class LeRobotEpisodes:
    """A LeRobot v3 dataset read as progress episodes, with `EpisodeDataset`'s interface (so `train-rm`'s
    batches and `eval-rm`'s metrics take it as it is); frames are decoded on access.

    Labels: `progress: time` gives frame t of an episode of length L the progress t / (L − 1); `sarm` reads
    `progress_<sarm_head>` of a SARM-style parquet, interpolated between the frames it lists and clipped to
    [0, 1]. A failed episode (`success` false) is a negative: every label 0 with time labels (ReWiND's
    convention); annotation labels are taken as given. An episode of unknown success counts as a success.
    Episodes without a task text, or missing from the annotation, are left out and listed in `skipped`.
    """

    def __init__(self, root: str | Path, source: LeRobotSource, episodes: str | None = None):
        self.root, self.source = Path(root), source
        self.info, listed = list_episodes(self.root)
        self.name = self.root.resolve().name
        self.fps = float(self.info["fps"])
        self.cameras = select_cameras(self.info, self.root, source.camera, source.views)
        self.sampling = SamplingConfig(mode="fps" if source.fps else "all", fps=source.fps, max_side=source.max_side)
        chosen = episode_range(self.info, episodes, "lerobot episodes")
        annotation = self._annotation() if source.progress == "sarm" else None
        self.skipped: dict[int, str] = {}
        self._episodes: dict[int, LeRobotEpisode] = {}
        self._annotated: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for episode in listed:
            index = episode.episode_index
            if chosen is not None and index not in chosen:
                continue
            if not (episode.task or "").strip():
                self.skipped[index] = "no task text"
            elif annotation is not None and index not in annotation:
                self.skipped[index] = "not in the SARM progress parquet"
            else:
                self._episodes[index] = episode
                if annotation is not None:
                    self._annotated[index] = annotation[index]
        if self.skipped:
            logger.warning("%s: left out %d episode(s): %s", self.root, len(self.skipped), self.skipped)
        if not self._episodes:
            raise ValueError(f"{self.root}: no usable episode (range {episodes!r}; left out: {self.skipped})")

    def _annotation(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        path = Path(self.source.sarm_progress) if self.source.sarm_progress else self.root / SARM_PROGRESS
        return read_sarm_progress(path, self.source.sarm_head)

    def __len__(self) -> int:
        return len(self._episodes)

    @property
    def episode_ids(self) -> list[int]:
        return list(self._episodes)

    @property
    def instructions(self) -> list[str]:
        return sorted({episode.task for episode in self._episodes.values()})

    def episode(self, episode_id: int) -> LeRobotEpisode:
        """The listing of one episode (its data file, spans, task, success), no pixels."""
        if episode_id not in self._episodes:
            raise KeyError(f"{self.root}: no episode {episode_id} (or it was left out: {self.skipped.get(episode_id)})")
        return self._episodes[episode_id]

    def __iter__(self) -> Iterator[EpisodeRecord]:
        return (self[episode_id] for episode_id in self._episodes)

    def __getitem__(self, episode_id: int) -> EpisodeRecord:
        episode = self.episode(episode_id)
        ref = EpisodeRef(
            source=self.name,
            episode=str(episode_id),
            kind="lerobot",
            path=str(self.root),
            instruction=episode.task,
            fps=self.fps,
            length=episode.length,
            episode_index=episode_id,
            index_start=episode.index_start,
            cameras=tuple(replace(episode.videos[key], name=name) for name, key in self.cameras.items()),
        )
        try:
            decoded = decode_episode(ref, self.sampling)
        except DecodeError as error:
            raise ValueError(f"{self.root}: episode {episode_id}: {error}") from None
        return EpisodeRecord(
            episode_id=episode_id,
            instruction=episode.task,
            frames=decoded.frames,
            progress=self.labels(episode, decoded.frame_index),
            success=episode.success is not False,
            policy=episode.policy,
            views=decoded.views,
        )

    def labels(self, episode: LeRobotEpisode, frame_index: np.ndarray) -> np.ndarray:
        """Progress labels of an episode's frames at `frame_index` (see the class docstring)."""
        if self.source.progress == "sarm":
            frames, values = self._annotated[episode.episode_index]
            return np.clip(np.interp(frame_index, frames, values), 0.0, 1.0).astype(np.float32)
        if episode.success is False:
            return np.zeros(len(frame_index), np.float32)
        return (np.asarray(frame_index) / max(episode.length - 1, 1)).astype(np.float32)

    def to_request(self, record: EpisodeRecord, frame_indices: Iterable[int] | None = None) -> RewardRequest:
        return episode_request(self.name, record, frame_indices)
