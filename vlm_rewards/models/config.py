"""Settings of the VLM reward models, free of torch: job configs validate them before any model loads."""

from __future__ import annotations

from typing import Literal

import pydantic

from vlm_rewards.config import Settings

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # the Qwen-VL backbones supported (models.backbones)
Task = Literal["progress", "preference"]
HeadKind = Literal["regression", "bins", "scalar"]


class RewardNetworkConfig(Settings):
    task: Task = "progress"
    """progress: per-frame progress in [0, 1]; preference: one scalar per clip, trained Bradley-Terry."""
    head: HeadKind = "regression"
    """The head read at each frame: progress takes regression or bins; preference takes scalar."""
    num_bins: int = pydantic.Field(32, ge=2)
    """Bins of the `bins` head (a distribution over progress, read as its mean)."""
    head_mlp_size: int = pydantic.Field(256, ge=1)
    """Hidden width of the head's MLP."""
    min_pixels: int | None = pydantic.Field(None, ge=1)
    """Fewest pixels per frame after resizing; None: the processor's bound."""
    max_pixels: int | None = pydantic.Field(None, ge=1)
    """Most pixels per frame after resizing; None: the processor's bound."""
    max_frames: int = pydantic.Field(32, ge=1)
    """Most frames per request; longer clips are subsampled by the caller (the reward's spec says so)."""
    use_reference: bool = False
    """Show the request's goal/reference frames to the model."""
    success_head: bool = False
    """Progress RM: also a success head, P(the task is done) at each frame, trained with BCE on the per-frame
    success labels of the episodes (`frame_success`); results carry it as the `success` component."""
    num_stages: int | None = pydantic.Field(None, ge=2)
    """Progress RM: also a stage head over this many stages (labels 0 … num_stages − 1, e.g. the env's
    stages completed: Reach 2, Push and Carry 3), trained with cross-entropy on the per-frame `stage`
    labels; results carry the most likely stage as the `stage` component. None: no stage head."""
    goal_offset_head: bool = False
    """Progress RM: also a linear head for where the named goal is from the effector (2 numbers per frame),
    trained with squared error on the episodes' `goal_offset` labels, which only a simulator gives (Reach's and
    Carry's collections write them). An auxiliary target: rewards do not report it."""

    @pydantic.model_validator(mode="after")
    def _head_fits_task(self) -> RewardNetworkConfig:
        allowed = {"progress": ("regression", "bins"), "preference": ("scalar",)}[self.task]
        if self.head not in allowed:
            raise ValueError(f"a {self.task} model needs a head in {allowed}, got {self.head!r}")
        if self.task != "progress" and (self.success_head or self.num_stages or self.goal_offset_head):
            raise ValueError("success_head, num_stages and goal_offset_head need a progress model (task: progress)")
        return self
