"""Weighted sum of rewards, each normalised first so that weights mean what they say.

`running` z-scores each component with its running mean/std over every call (RL, annotation);
`group` z-scores within the requests that share an instruction/prompt, the GRPO group; `none` keeps
raw values. Raw and normalised component values are kept in `aux`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import pydantic

from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import BaseReward, RewardModel, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.normalization import RunningMeanStd, group_zscore
from vlm_rewards.registry import build_reward, register

Normalization = Literal["none", "running", "group"]


class Component(pydantic.BaseModel, extra="forbid"):
    reward: str | dict[str, Any]  # a reward YAML path / name in configs/rewards, or an inline config
    weight: float = 1.0
    normalize: Normalization = "none"
    name: str | None = None


@register("composite")
class CompositeReward(BaseReward):
    class Params(pydantic.BaseModel, extra="forbid"):
        name: str = "composite"
        components: list[Component] = pydantic.Field(min_length=1)

    def __init__(
        self,
        rewards: list[RewardModel],
        weights: list[float],
        normalize: list[Normalization],
        name: str = "composite",
        names: list[str | None] | None = None,
    ):
        if not (len(rewards) == len(weights) == len(normalize)) or not rewards:
            raise ValueError(
                f"composite {name!r}: got {len(rewards)} rewards, {len(weights)} weights and "
                f"{len(normalize)} normalizations; expected the same non-zero number of each"
            )
        self.rewards, self.weights, self.normalize = rewards, weights, normalize
        self.names = [given or reward.spec.name for given, reward in zip(names or [None] * len(rewards), rewards)]
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"composite {name!r}: component names {self.names} must be unique (set `name`)")
        self.running = [RunningMeanStd() for _ in rewards]
        self.spec = RewardSpec(
            name=name,
            version=fingerprint([(r.spec.version, w, n) for r, w, n in zip(rewards, weights, normalize)]),
            output="scalar",
            value_range=self._value_range(),
            frame_size=_intersect_frame_sizes([r.spec.frame_size for r in rewards]),
            max_frames=min((r.spec.max_frames for r in rewards if r.spec.max_frames), default=None),
        )

    @classmethod
    def from_params(cls, params: Params) -> CompositeReward:
        rewards = [build_reward(c.reward if isinstance(c.reward, dict) else Path(c.reward)) for c in params.components]
        return cls(
            rewards,
            weights=[c.weight for c in params.components],
            normalize=[c.normalize for c in params.components],
            name=params.name,
            names=[c.name for c in params.components],
        )

    def _value_range(self) -> tuple[float, float]:
        if any(n != "none" for n in self.normalize):
            return (float("-inf"), float("inf"))
        ends = [
            sorted((w * r.spec.value_range[0], w * r.spec.value_range[1])) for r, w in zip(self.rewards, self.weights)
        ]
        return (sum(low for low, _ in ends), sum(high for _, high in ends))

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        groups = [request.text for request in requests]
        total = np.zeros(len(requests))
        aux: list[dict[str, Any]] = [{} for _ in requests]
        errors: list[list[str]] = [[] for _ in requests]
        for index, reward in enumerate(self.rewards):
            name = self.names[index]
            child_results = reward.score(requests)
            raw = np.array([result.reward for result in child_results], dtype=np.float64)
            for i, result in enumerate(child_results):
                if "error" in result.aux:
                    errors[i].append(f"{name}: {result.aux['error']}")
            normalized = self._normalize(index, raw, groups)
            total += self.weights[index] * normalized
            for i in range(len(requests)):
                aux[i][name] = float(raw[i])
                aux[i][f"{name}/normalized"] = float(normalized[i])
        results = []
        for i in range(len(requests)):
            if errors[i]:
                aux[i]["error"] = "; ".join(errors[i])
            results.append(RewardResult(reward=float(total[i]), aux=aux[i]))
        return results

    def _normalize(self, index: int, raw: np.ndarray, groups: list[str]) -> np.ndarray:
        mode = self.normalize[index]
        if mode == "group":
            return group_zscore(raw, groups)
        if mode == "running":
            finite = raw[np.isfinite(raw)]
            self.running[index].update(finite)
            return self.running[index].normalize(raw)
        return raw


def _intersect_frame_sizes(sizes: list[tuple[int, int] | None]) -> tuple[int, int] | None:
    given = [size for size in sizes if size is not None]
    if not given:
        return None
    return (max(low for low, _ in given), min(high for _, high in given))
