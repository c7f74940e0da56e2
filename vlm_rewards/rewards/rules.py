"""Rule-based rewards: no learning, useful as baselines, sanity checks and co-rewards."""

from __future__ import annotations

import numpy as np
import pydantic

from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import REFERENCE, BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.registry import register


@register("goal_pixel_progress")
class GoalPixelProgress(BaseReward):
    """Progress toward a goal image by pixel distance.

    progress_t = 1 − d(frame_t, goal) / d(frame_0, goal), clipped to [0, 1], with d the mean absolute
    RGB difference; the goal is the request's last reference frame. reward = progress of the last frame.
    """

    class Params(pydantic.BaseModel, extra="forbid"):
        name: str = "goal_pixel_progress"

    def __init__(self, name: str = "goal_pixel_progress"):
        self.spec = RewardSpec(
            name=name,
            version=fingerprint("goal_pixel_progress", 1),
            value_range=(0.0, 1.0),
            dense=True,
            causal=True,
            requires=(REFERENCE,),
        )

    @classmethod
    def from_params(cls, params: Params) -> GoalPixelProgress:
        return cls(params.name)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._score_one(i, request) for i, request in enumerate(requests)]

    def _score_one(self, index: int, request: RewardRequest) -> RewardResult:
        goal = request.reference[-1].astype(np.float32)
        if goal.shape != request.frames.shape[1:]:
            raise ValueError(
                f"requests[{index}].reference: goal of shape {goal.shape}, expected the frames' shape "
                f"{request.frames.shape[1:]}"
            )
        distances = np.abs(request.frames.astype(np.float32) - goal).mean(axis=(1, 2, 3))
        start = distances[0]
        progress = np.ones_like(distances) if start == 0 else np.clip(1.0 - distances / start, 0.0, 1.0)
        return RewardResult(reward=float(progress[-1]), progress=progress, info={"goal_distance": float(distances[-1])})


@register("motion_penalty")
class MotionPenalty(BaseReward):
    """−scale × mean absolute change between consecutive frames (in [0, 1] per pixel): discourages jerk."""

    class Params(pydantic.BaseModel, extra="forbid"):
        name: str = "motion_penalty"
        scale: float = pydantic.Field(1.0, gt=0)

    def __init__(self, name: str = "motion_penalty", scale: float = 1.0):
        self.scale = scale
        self.spec = RewardSpec(name=name, version=fingerprint("motion_penalty", scale), value_range=(-scale, 0.0))

    @classmethod
    def from_params(cls, params: Params) -> MotionPenalty:
        return cls(params.name, params.scale)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        results = []
        for request in requests:
            frames = request.frames.astype(np.float32) / 255.0
            motion = float(np.abs(np.diff(frames, axis=0)).mean()) if len(frames) > 1 else 0.0
            results.append(RewardResult(reward=-self.scale * motion, info={"motion": motion}))
        return results
