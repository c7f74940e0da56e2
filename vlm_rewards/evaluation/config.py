"""The `vlmr eval-rm` config: which reward, which held-out data, where the report goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic

from vlm_rewards.config import JobConfig, OutputDir
from vlm_rewards.data.build import SyntheticData


class EvalRMConfig(JobConfig):
    reward: str | dict[str, Any] = "goal_pixel_progress"
    """Reward YAML path, name in configs/rewards/, or mapping."""
    episodes: Path | None = None
    """An episode dataset folder; None: build synthetic held-out episodes."""
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
