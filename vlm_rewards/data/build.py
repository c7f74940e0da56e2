"""Build synthetic datasets on disk from ShapesWorld.

Everything is drawn from one `np.random.Generator(seed)`, so a seed fixes the dataset. Build a
held-out split with a different seed (the convention here: train seed s, held-out seed s + 1000);
scenes, tasks and trajectories are continuous draws, so two seeds never share an episode.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import get_args

import numpy as np
from tqdm.auto import tqdm

from vlm_rewards.config import JobConfig
from vlm_rewards.data.episodes import (
    EpisodeDataset,
    EpisodeRecord,
    FrameFormat,
    PairDataset,
    PreferencePair,
    write_episodes,
    write_pairs,
)
from vlm_rewards.data.synthetic import Policy, ShapesWorld

DEFAULT_POLICY_MIX: Mapping[str, float] = MappingProxyType(
    {"expert": 0.6, "random": 0.15, "wrong_object": 0.125, "wrong_goal": 0.125}
)


def build_progress_dataset(
    root: str | Path,
    *,
    num_episodes: int,
    seed: int,
    num_frames: int = 16,
    size: int = 56,
    num_objects: int = 3,
    policy_mix: Mapping[str, float] = DEFAULT_POLICY_MIX,
    frame_format: FrameFormat = "npz",
    name: str | None = None,
) -> EpisodeDataset:
    """ShapesWorld rollouts with geometric progress labels and the goal image as reference.

    Each episode's policy is drawn from `policy_mix` (weights, normalised to sum to 1).
    """
    policies = list(policy_mix)
    unknown = set(policies) - set(get_args(Policy))
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)} in policy_mix; ShapesWorld has {get_args(Policy)}")
    weights = np.array([policy_mix[policy] for policy in policies], dtype=np.float64)
    if np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"policy_mix weights must be ≥ 0 with a positive sum, got {dict(policy_mix)}")
    probabilities = weights / weights.sum()
    world = ShapesWorld(size=size, num_objects=num_objects)
    rng = np.random.default_rng(seed)

    def records() -> Iterator[EpisodeRecord]:
        for episode_id in tqdm(range(num_episodes), desc=f"episodes -> {root}", unit="ep"):
            policy = policies[rng.choice(len(policies), p=probabilities)]
            episode = world.rollout(rng, num_frames, policy)
            yield EpisodeRecord(
                episode_id=episode_id,
                instruction=episode.instruction,
                frames=episode.frames,
                progress=episode.progress,
                success=episode.success,
                policy=episode.policy,
                reference=episode.goal_frame,
            )

    generator = {
        "name": "ShapesWorld",
        "seed": seed,
        "size": size,
        "num_frames": num_frames,
        "num_objects": num_objects,
        "policy_mix": dict(policy_mix),
    }
    return write_episodes(root, records(), frame_format, name=name, generator=generator)


def build_preference_dataset(
    root: str | Path, *, num_pairs: int, seed: int, size: int = 56, num_objects: int = 3, name: str | None = None
) -> PairDataset:
    """ShapesWorld image pairs: the chosen image has the prompted object nearer its region; margin = gap."""
    world = ShapesWorld(size=size, num_objects=num_objects)
    rng = np.random.default_rng(seed)

    def pairs() -> Iterator[PreferencePair]:
        for pair_id in tqdm(range(num_pairs), desc=f"pairs -> {root}", unit="pair"):
            prompt, chosen, rejected, gap = world.preference_pair(rng)
            yield PreferencePair(pair_id=pair_id, prompt=prompt, chosen=chosen, rejected=rejected, margin=gap)

    generator = {"name": "ShapesWorld.preference_pair", "seed": seed, "size": size, "num_objects": num_objects}
    return write_pairs(root, pairs(), name=name, generator=generator)


class SyntheticData(JobConfig):
    """ShapesWorld data for a job that names no dataset folder: built once, reused when complete."""

    num_episodes: int = 2000
    num_pairs: int = 4000
    num_frames: int = 16
    frame_size: int = 56
    num_objects: int = 3  # the named object plus distractors
    seed: int = 0

    def episodes(self, folder: Path, name: str | None = None) -> EpisodeDataset:
        if (folder / "meta.json").exists():
            return EpisodeDataset(folder)
        return build_progress_dataset(
            folder,
            num_episodes=self.num_episodes,
            seed=self.seed,
            num_frames=self.num_frames,
            size=self.frame_size,
            num_objects=self.num_objects,
            name=name,
        )

    def pairs(self, folder: Path, name: str | None = None) -> PairDataset:
        if (folder / "meta.json").exists():
            return PairDataset(folder)
        return build_preference_dataset(
            folder,
            num_pairs=self.num_pairs,
            seed=self.seed,
            size=self.frame_size,
            num_objects=self.num_objects,
            name=name,
        )


def open_episodes(
    given: Path | None, synthetic: SyntheticData, folder: Path, name: str | None = None
) -> EpisodeDataset:
    """The episode folder a job names, else `synthetic` episodes built into (or reused from) `folder`."""
    return EpisodeDataset(given) if given is not None else synthetic.episodes(folder, name)


def open_pairs(given: Path | None, synthetic: SyntheticData, folder: Path, name: str | None = None) -> PairDataset:
    """The pair folder a job names, else `synthetic` pairs built into (or reused from) `folder`."""
    return PairDataset(given) if given is not None else synthetic.pairs(folder, name)
