"""`vlmr demo`: score procedurally generated clips of four policies with any configured reward.

A good progress reward ranks expert clips above wrong-object, wrong-goal and random ones; the demo
returns the results by policy (the CLI prints the table) and saves a box plot of the rewards per policy.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from vlm_rewards.config import JobConfig, OutputDir
from vlm_rewards.data.synthetic import Policy, ShapesWorld
from vlm_rewards.evaluation.plots import plot_reward_distributions
from vlm_rewards.interface import RewardModel, RewardRequest, RewardResult, SampleKey
from vlm_rewards.registry import build_reward

logger = logging.getLogger(__name__)
POLICIES: tuple[Policy, ...] = ("expert", "wrong_goal", "wrong_object", "random")


class DemoConfig(JobConfig):
    reward: str = "demo_composite"
    """A reward YAML path or a name in configs/rewards/."""
    clips_per_policy: int = 8
    """Synthetic clips scored per policy."""
    num_frames: int = 16
    """Frames per clip."""
    frame_size: int = 56
    """Height and width of the frames in pixels."""
    seed: int = 0
    """Seed of the synthetic clips."""
    output_dir: OutputDir = Path("outputs/demo")
    """Where the reward-distribution plot goes."""


def synthetic_requests(config: DemoConfig) -> dict[str, list[RewardRequest]]:
    world = ShapesWorld(size=config.frame_size)
    rng = np.random.default_rng(config.seed)
    requests: dict[str, list[RewardRequest]] = {}
    for policy in POLICIES:
        episodes = [world.rollout(rng, config.num_frames, policy) for _ in range(config.clips_per_policy)]
        requests[policy] = [
            RewardRequest(e.frames, e.instruction, reference=e.goal_frame, key=SampleKey(f"shapes/{policy}", i))
            for i, e in enumerate(episodes)
        ]
    return requests


def run_demo(config: DemoConfig) -> dict[str, list[RewardResult]]:
    """Score every policy's clips, save the box plot, and return the results by policy."""
    reward: RewardModel = build_reward(config.reward)
    logger.info("reward %s (version %s, dense %s)", reward.spec.name, reward.spec.version, reward.spec.dense)
    results = {policy: reward.score(batch) for policy, batch in synthetic_requests(config).items()}
    plot_path = config.output_dir / "rewards_by_policy.png"
    rewards_by_policy = {policy: [r.reward for r in policy_results] for policy, policy_results in results.items()}
    plot_reward_distributions(plot_path, rewards_by_policy, f"{reward.spec.name}: reward per policy")
    logger.info("plot: %s", plot_path)
    return results
