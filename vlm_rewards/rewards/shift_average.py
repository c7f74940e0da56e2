"""Any dense reward averaged over small translations of its input: test-time shift augmentation.

A reward model that reads a scene through a coarse grid of image tokens can answer one value per token cell:
moving a thing inside a cell changes nothing, crossing a cell edge jumps. Trained with random shifts
(`data.augment.shift`: the whole scene moves, the progress label does not), the model answers for any
alignment of grid and scene; averaging its answers over a grid of shifts of one clip turns each jump
into a ramp as wide as the shifts, a slope a critic can climb. Every frame and view of a clip moves by
the same offset; the shifted copies of a batch are scored in one call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pydantic

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import BaseReward, RewardModel, RewardRequest, RewardResult, example_texts_of
from vlm_rewards.registry import build_reward, current_config_folder, register


@register("shift_average")
class ShiftAverageReward(BaseReward):
    class Params(Settings):
        reward: str | dict[str, Any]
        """A dense reward: shipped name, YAML path (relative to this YAML) or inline config."""
        max_shift: int = pydantic.Field(8, ge=1)
        """The largest shift in pixels along each axis."""
        points: int = pydantic.Field(3, ge=2)
        """Shifts per axis, evenly spaced in −max_shift..max_shift; points² scored copies of every clip."""
        name: str | None = None
        """The reward's name in results, logs and reports; None: <wrapped name>_shift<max_shift>x<points>."""

    def __init__(self, reward: RewardModel, max_shift: int = 8, points: int = 3, name: str | None = None):
        if not reward.spec.dense:
            raise ValueError(f"shift_average: reward {reward.spec.name!r} is not dense; expected per-frame progress")
        if max_shift < 1 or points < 2:
            raise ValueError(f"shift_average: max_shift {max_shift}, points {points}; expected ≥ 1 and ≥ 2")
        self.reward = reward
        steps = np.linspace(-max_shift, max_shift, points).round().astype(int)
        self.offsets = [(int(dy), int(dx)) for dy in steps for dx in steps]
        self.spec = replace(
            reward.spec,
            name=name or f"{reward.spec.name}_shift{max_shift}x{points}",
            version=fingerprint(reward.spec.version, "shift_average", self.offsets),
        )

    @classmethod
    def from_params(cls, params: Params) -> ShiftAverageReward:
        inner = build_reward(params.reward, relative_to=current_config_folder())
        return cls(inner, params.max_shift, params.points, params.name)

    def example_texts(self) -> tuple[str, ...]:
        """The wrapped reward's."""
        return example_texts_of(self.reward)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        copies = [request.shifted(dy, dx) for request in requests for dy, dx in self.offsets]
        results = self.reward.score(copies)
        count = len(self.offsets)
        return [_mean(results[i * count : (i + 1) * count]) for i in range(len(requests))]


def _mean(results: list[RewardResult]) -> RewardResult:
    """The copies' mean reward and per-frame progress (NaN where a copy failed, with its error)."""
    errors = sorted({result.error for result in results if result.error})
    progress = np.mean([result.progress for result in results], axis=0)
    return RewardResult(float(np.mean([r.reward for r in results])), progress, error="; ".join(errors) or None)
