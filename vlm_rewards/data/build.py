"""Build synthetic datasets on disk from ShapesWorld.

Everything is drawn from one `np.random.Generator(seed)`, so a seed fixes the dataset. Build a
held-out split with a different seed (the convention here: train seed s, held-out seed s + 1000);
scenes, tasks and trajectories are continuous draws, so two seeds never share an episode.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import get_args

import numpy as np
import pydantic

from vlm_rewards.config import JobConfig
from vlm_rewards.data.episodes import (
    EpisodeDataset,
    EpisodeRecord,
    EpisodeUnion,
    FrameFormat,
    PairDataset,
    PreferencePair,
    write_episodes,
    write_pairs,
)
from vlm_rewards.data.synthetic import Policy, ShapesWorld
from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.tracking import Track, untracked

logger = logging.getLogger(__name__)

# Bump when ShapesWorld or the builders change what a seed produces, so old synthetic builds are not reused.
DATA_GENERATOR_VERSION = 1
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
    track: Track | None = None,
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
        for episode_id in (track or untracked)(range(num_episodes), f"episodes -> {root}"):
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
    root: str | Path,
    *,
    num_pairs: int,
    seed: int,
    size: int = 56,
    num_objects: int = 3,
    name: str | None = None,
    track: Track | None = None,
) -> PairDataset:
    """ShapesWorld image pairs: the chosen image has the prompted object nearer its region; margin = gap."""
    world = ShapesWorld(size=size, num_objects=num_objects)
    rng = np.random.default_rng(seed)

    def pairs() -> Iterator[PreferencePair]:
        for pair_id in (track or untracked)(range(num_pairs), f"pairs -> {root}"):
            prompt, chosen, rejected, gap = world.preference_pair(rng)
            yield PreferencePair(pair_id=pair_id, prompt=prompt, chosen=chosen, rejected=rejected, margin=gap)

    generator = {"name": "ShapesWorld.preference_pair", "seed": seed, "size": size, "num_objects": num_objects}
    return write_pairs(root, pairs(), name=name, generator=generator)


class SyntheticData(JobConfig):
    """ShapesWorld data for a job that names no dataset folder: built once, reused when complete.

    Each build lives in a sub-folder of the job's data folder named by a fingerprint of every setting
    that shapes it, so changed settings build new data and never silently reuse the old.
    """

    num_episodes: int = pydantic.Field(2000, ge=1)
    """Progress episodes to build."""
    num_pairs: int = pydantic.Field(4000, ge=1)
    """Preference pairs to build."""
    num_frames: int = pydantic.Field(16, ge=1)
    """Frames per episode."""
    frame_size: int = pydantic.Field(56, ge=8)
    """Height and width of the frames in pixels."""
    num_objects: int = pydantic.Field(3, ge=1)
    """The named object plus distractors."""
    seed: int = 0
    """Seed of the build; held-out data uses a seed disjoint from training's."""

    def build_folder(self, folder: Path, kind: str, name: str | None = None) -> Path:
        """Where the `kind` ("episodes" or "pairs") data of these settings lives under `folder`."""
        settings = self.model_dump(exclude={"num_pairs"} if kind == "episodes" else {"num_episodes", "num_frames"})
        return Path(folder) / f"{kind}-{fingerprint(kind, settings, name, DATA_GENERATOR_VERSION)}"

    def episodes(self, folder: Path, name: str | None = None, track: Track | None = None) -> EpisodeDataset:
        folder = self.build_folder(folder, "episodes", name)
        if (folder / "meta.json").exists():
            logger.info("reusing synthetic episodes in %s", folder)
            return EpisodeDataset(folder)
        logger.info("building %d synthetic episodes in %s", self.num_episodes, folder)
        return build_progress_dataset(
            folder,
            track=track,
            num_episodes=self.num_episodes,
            seed=self.seed,
            num_frames=self.num_frames,
            size=self.frame_size,
            num_objects=self.num_objects,
            name=name,
        )

    def pairs(self, folder: Path, name: str | None = None, track: Track | None = None) -> PairDataset:
        folder = self.build_folder(folder, "pairs", name)
        if (folder / "meta.json").exists():
            logger.info("reusing synthetic pairs in %s", folder)
            return PairDataset(folder)
        logger.info("building %d synthetic pairs in %s", self.num_pairs, folder)
        return build_preference_dataset(
            folder,
            track=track,
            num_pairs=self.num_pairs,
            seed=self.seed,
            size=self.frame_size,
            num_objects=self.num_objects,
            name=name,
        )


def open_episodes(
    given: Path | list[Path] | None,
    synthetic: SyntheticData,
    folder: Path,
    name: str | None = None,
    track: Track | None = None,
) -> EpisodeDataset | EpisodeUnion:
    """The episode folder a job names (several: read as one), else `synthetic` episodes built into (or
    reused from) a fingerprint-named sub-folder of `folder`."""
    if isinstance(given, list):
        return EpisodeUnion(given)
    return EpisodeDataset(given) if given is not None else synthetic.episodes(folder, name, track)


def open_pairs(
    given: Path | None, synthetic: SyntheticData, folder: Path, name: str | None = None, track: Track | None = None
) -> PairDataset:
    """The pair folder a job names, else `synthetic` pairs built into (or reused from) a
    fingerprint-named sub-folder of `folder`."""
    return PairDataset(given) if given is not None else synthetic.pairs(folder, name, track)
