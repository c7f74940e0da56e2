"""Settings of the dataset readers that jobs share (torch-free)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic

from vlm_rewards.config import Settings


class LeRobotSource(Settings):
    """How a LeRobot v3 dataset is read as progress episodes
    (`vlm_rewards.annotation.lerobot_episodes.LeRobotEpisodes`)."""

    camera: str | None = None
    """The video feature the reward model sees, e.g. observation.images.top; None: the first video feature."""
    views: dict[str, str] = {}
    """Extra cameras passed as request views, {view name: video feature}, e.g. {wrist: observation.images.wrist}."""
    progress: Literal["time", "sarm"] = "time"
    """Progress labels: "time" (frame t of L: t / (L − 1); every label 0 in a failed episode) or "sarm" (a
    SARM-style per-frame progress parquet, `sarm_progress`)."""
    sarm_progress: Path | None = None
    """The SARM-style parquet (columns episode_index, frame_index, progress_sparse / progress_dense; frames it
    skips are interpolated); None: sarm_progress.parquet in the dataset folder, where LeRobot's scripts write it."""
    sarm_head: Literal["sparse", "dense"] = "sparse"
    """Which column of the SARM parquet: progress_sparse or progress_dense."""
    train_episodes: str | None = None
    """train-rm: the training episodes, "start:stop" episode indices (either end may be left out) or a split name
    of meta/info.json; None: all."""
    eval_episodes: str | None = None
    """The evaluation episodes, in the same syntax; None: all (of the evaluation dataset, which train-rm takes to
    be the training dataset when data.eval is null: then set both ranges to hold episodes out)."""
    fps: float | None = pydantic.Field(None, gt=0)
    """Frames per second kept when decoding (labels follow the kept frames); None: every frame."""
    max_side: int | None = pydantic.Field(None, ge=8)
    """Downscale frames so that their longer side is at most this many pixels; None: decoded size."""
