"""Scoring rollouts through the reward interface, overlapped with sampling.

An image is a one-frame clip: `RewardRequest(image[None], prompt)`. Trained rewards shape the
advantages; gold rewards are scored on the same images for monitoring only and never train.
`collect_rollouts` scores batch b (`await reward.ascore`) while batch b+1 samples, so reward inference
(a local VLM in a worker thread or a remote server) hides behind generation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlm_rewards.generation.sampling import Rollout
from vlm_rewards.interface import RewardModel, RewardRequest
from vlm_rewards.registry import build_reward


@dataclass
class RewardSet:
    trained: dict[str, RewardModel]
    weights: dict[str, float]
    gold: dict[str, RewardModel] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        trained: Mapping[str, tuple[str | Path | Mapping[str, Any], float]],
        gold: Mapping[str, str | Path | Mapping[str, Any]] | None = None,
        relative_to: Path | None = None,
    ) -> RewardSet:
        """name -> (reward config, weight) for trained rewards, name -> config for gold ones."""
        if not trained:
            raise ValueError("rewards: at least one trained reward is needed")
        overlap = set(trained) & set(gold or {})
        if overlap:
            raise ValueError(f"rewards {sorted(overlap)} are both trained and gold; gold rewards must never train")
        return cls(
            trained={name: build_reward(config, relative_to) for name, (config, _) in trained.items()},
            weights={name: float(weight) for name, (_, weight) in trained.items()},
            gold={name: build_reward(config, relative_to) for name, config in (gold or {}).items()},
        )

    async def ascore(self, images: np.ndarray, prompts: list[str]) -> Scores:
        requests = [RewardRequest(image[None], prompt) for image, prompt in zip(images, prompts)]
        everything = {**self.trained, **{f"gold:{name}": reward for name, reward in self.gold.items()}}
        results = await asyncio.gather(*(reward.ascore(requests) for reward in everything.values()))
        values = {name: _rewards_of(name, result, prompts) for name, result in zip(everything, results)}
        return Scores(
            trained={name: values[name] for name in self.trained},
            gold={name: values[f"gold:{name}"] for name in self.gold},
        )


@dataclass
class Scores:
    trained: dict[str, np.ndarray]
    gold: dict[str, np.ndarray]

    @staticmethod
    def cat(parts: list[Scores]) -> Scores:
        return Scores(
            trained={name: np.concatenate([p.trained[name] for p in parts]) for name in parts[0].trained},
            gold={name: np.concatenate([p.gold[name] for p in parts]) for name in parts[0].gold},
        )


async def collect_rollouts(
    sample_batch: Callable[[int], Rollout], num_batches: int, rewards: RewardSet
) -> tuple[Rollout, Scores, dict[str, float]]:
    """Sample `num_batches` batches, scoring each while the next one samples; returns timings too.

    `reward_wait_s` is the reward time not hidden behind sampling.
    """
    scoring, rollouts = [], []
    start = time.perf_counter()
    for batch in range(num_batches):
        rollouts.append(await asyncio.to_thread(sample_batch, batch))
        scoring.append(asyncio.create_task(rewards.ascore(rollouts[-1].images, rollouts[-1].prompts)))
    sampled = time.perf_counter()
    scores = await asyncio.gather(*scoring)
    timings = {"time/sampling_s": sampled - start, "time/reward_wait_s": time.perf_counter() - sampled}
    return Rollout.cat(rollouts), Scores.cat(scores), timings


def _rewards_of(name: str, results: list, prompts: list[str]) -> np.ndarray:
    """The rewards as an array; a wrong count or a NaN reward is an error naming the sample."""
    if len(results) != len(prompts):
        raise ValueError(f"reward {name!r} returned {len(results)} results for {len(prompts)} images")
    values = np.array([result.reward for result in results], dtype=np.float64)
    for index in np.flatnonzero(~np.isfinite(values)):
        raise ValueError(
            f"reward {name!r} gave {values[index]} for image {index} (prompt {prompts[index]!r}): "
            f"{results[index].error or 'no error given'}"
        )
    return values
