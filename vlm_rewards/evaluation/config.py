"""The `vlmr eval-rm` config: which reward, which held-out data, where the report goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pydantic

from vlm_rewards.config import JobConfig, OutputDir
from vlm_rewards.data.build import SyntheticData
from vlm_rewards.data.config import LeRobotSource


class EvalRMConfig(JobConfig):
    reward: str | dict[str, Any] = "goal_pixel_progress"
    """Reward YAML path, name in configs/rewards/, or mapping."""
    episodes: Path | None = None
    """An episode dataset folder (format lerobot: a LeRobot v3 dataset folder); None: build synthetic held-out
    episodes, unless `opengvl` is given."""
    format: Literal["episodes", "lerobot"] = "episodes"
    """How `episodes` is read: the project's episode format, or a LeRobot v3 dataset read as `lerobot` says."""
    lerobot: LeRobotSource = pydantic.Field(default_factory=LeRobotSource)
    """Reading a LeRobot v3 dataset (format lerobot): camera, labels, lerobot.eval_episodes, frame rate and size."""
    opengvl: Path | None = None
    """An OpenGVL-style evaluation set (a folder with episodes.jsonl, see vlm_rewards.data.opengvl): adds
    opengvl_voc, OpenGVL's VOC on its shuffled frames, comparable with published VOC tables."""
    pairs: Path | None = None
    """A pair dataset folder; None: build synthetic held-out pairs."""
    synthetic: SyntheticData = pydantic.Field(
        default_factory=lambda: SyntheticData(num_episodes=64, num_pairs=128, seed=1000)
    )
    """Held-out ShapesWorld data, built when no folder is given (a seed disjoint from training's)."""
    evaluate_pairs: bool | None = None
    """Also score preference pairs; None: only for preference models."""
    output_dir: OutputDir = Path("outputs/eval_rm")
    """Where metrics.json and the progress-curve plots go."""
    batch_size: int = pydantic.Field(16, ge=1)
    """Requests per `reward.score` call."""
    max_curves: int = pydantic.Field(12, ge=1)
    """Episodes drawn in the progress-curve plot."""
    seed: int = 0
    """Seed of the mismatched instructions (the instruction-use metric)."""
    clip_frames: int | None = pydantic.Field(None, ge=2)
    """The clip length the reward trained on (train-rm's data.clip_frames): adds step_correlation_at_clip_frames."""

    @pydantic.model_validator(mode="after")
    def _lerobot_folder(self) -> EvalRMConfig:
        if self.format == "lerobot" and self.episodes is None:
            raise ValueError("format lerobot reads the LeRobot v3 dataset folder in `episodes`; give one")
        return self
