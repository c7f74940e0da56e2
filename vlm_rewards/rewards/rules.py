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


@register("marker_progress")
class MarkerProgress(BaseReward):
    """Scripted progress in scenes of flat colour markers: how much closer the effector's marker is to the
    marker of the colour the instruction names, in pixels.

    progress_t = 1 − d_t / d_0, clipped to [0, 1], with d_t the distance between the centroid of the
    effector's pixels and that of the named colour's pixels in frame t. A pixel belongs to the palette
    entry (colour word or effector) nearest to it in RGB, if that is within `tolerance`. A frame in which
    either marker is hidden keeps the previous frame's distance. It reads only frames and text, so it goes
    through the same reward path as a learned RM: the robotics experiments use it as the upper bound of
    what a frame-reading progress reward can give RL.
    """

    class Params(pydantic.BaseModel, extra="forbid"):
        name: str = "marker_progress"
        palette: dict[str, tuple[int, int, int]] = pydantic.Field(min_length=1)  # colour word -> RGB as rendered
        effector: tuple[int, int, int]  # the effector marker's RGB as rendered
        tolerance: float = pydantic.Field(40.0, gt=0)  # RGB distance within which a pixel is a marker's
        border: int = pydantic.Field(0, ge=0)  # pixels at each frame edge that are ignored (walls, frames)

    def __init__(self, params: Params):
        self.params = params
        self.words = list(params.palette)
        self.colours = np.array([*params.palette.values(), params.effector], dtype=np.float32)
        self.spec = RewardSpec(
            name=params.name,
            version=fingerprint("marker_progress", params.model_dump()),
            value_range=(0.0, 1.0),
            dense=True,
            causal=True,
        )

    @classmethod
    def from_params(cls, params: Params) -> MarkerProgress:
        return cls(params)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._score_one(i, request) for i, request in enumerate(requests)]

    def _named(self, index: int, text: str) -> int:
        named = [i for i, word in enumerate(self.words) if word in text.lower().split()]
        if len(named) != 1:
            raise ValueError(
                f"requests[{index}].text: {text!r} names {len(named)} palette colours; expected exactly one of "
                f"{self.words}"
            )
        return named[0]

    def _score_one(self, index: int, request: RewardRequest) -> RewardResult:
        named = self._named(index, request.text)
        effector = len(self.words)
        places = [self._centroids(frame, (named, effector)) for frame in request.frames]
        distances = _carry_forward(np.array([np.linalg.norm(a - b) for a, b in places]))
        start = distances[0]  # NaN when a marker is not in the first frame: no progress can be read
        if np.isnan(start):
            progress = np.zeros_like(distances)
        else:
            progress = np.ones_like(distances) if start == 0 else np.clip(1.0 - distances / start, 0.0, 1.0)
        info = {"marker_distance": float(distances[-1])}
        return RewardResult(reward=float(progress[-1]), progress=progress, info=info)

    def _centroids(self, frame: np.ndarray, entries: tuple[int, ...]) -> list[np.ndarray]:
        """Each entry's pixel centroid (row, col) in one frame; NaN where none of its pixels is visible."""
        border = self.params.border
        pixels = frame[border : frame.shape[0] - border, border : frame.shape[1] - border].astype(np.float32)
        distance = np.linalg.norm(pixels[:, :, None, :] - self.colours, axis=-1)
        nearest = np.where(distance.min(axis=-1) <= self.params.tolerance, distance.argmin(axis=-1), -1)
        centroids = []
        for entry in entries:
            rows, cols = np.nonzero(nearest == entry)
            centroids.append(np.array([rows.mean(), cols.mean()]) if len(rows) else np.full(2, np.nan))
        return centroids


def _carry_forward(values: np.ndarray) -> np.ndarray:
    """NaNs replaced by the last finite value before them (leading NaNs stay)."""
    values = values.copy()
    for t in range(1, len(values)):
        if np.isnan(values[t]):
            values[t] = values[t - 1]
    return values
