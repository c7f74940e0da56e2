"""Scoring decoded episodes in batches through the reward interface; shared by both engines.

An episode's outcome is either a success (per-frame progress for every source frame, the episode's
reward and components) or a failure with a reason. One bad episode (a reward error, a request the
reward refuses) fails alone: a batch that raises is rescored one episode at a time.
"""

from __future__ import annotations

import math

import numpy as np

from vlm_rewards.annotation.decode import DecodedEpisode
from vlm_rewards.annotation.sources import EpisodeOutcome
from vlm_rewards.interface import RewardModel, RewardRequest, RewardResult, RewardSpec, SampleKey, score_each
from vlm_rewards.subsample import expand_to_episode, subsample_request


def check_reward_for_annotation(spec: RewardSpec) -> None:
    """Annotation batches episodes freely and resumes across runs, so only a reward whose results do
    not depend on batch-mates or on chance gives reproducible outputs."""
    problems = []
    if not spec.batch_invariant:
        problems.append("batch_invariant=False (a result depends on its batch-mates or earlier calls)")
    if not spec.deterministic:
        problems.append("deterministic=False (the same request may get different results)")
    if problems:
        raise ValueError(
            f"reward {spec.name!r} cannot annotate datasets: {'; '.join(problems)}. Annotation batches "
            "episodes in any grouping and resumes across runs, so it needs a batch-invariant, "
            "deterministic reward (e.g. a judge with temperature 0)."
        )


def episode_budget(spec: RewardSpec, max_frames: int | None) -> int | None:
    budgets = [b for b in (spec.max_frames, max_frames) if b is not None]
    return min(budgets) if budgets else None


def build_request(episode: DecodedEpisode) -> RewardRequest:
    ref = episode.ref
    return RewardRequest(
        frames=episode.frames,
        text=ref.instruction or "",
        reference=episode.reference,
        views=episode.views,
        key=SampleKey(ref.source, ref.episode, episode.num_frames - 1),
        frame_index=episode.frame_index,
    )


def score_batch(
    reward: RewardModel, episodes: list[DecodedEpisode], max_frames: int | None = None
) -> list[EpisodeOutcome]:
    """One batched reward call for `episodes` (each subsampled to the frame budget); per episode an outcome."""
    if not episodes:
        return []
    budget = episode_budget(reward.spec, max_frames)
    requests = [subsample_request(build_request(episode), budget) for episode in episodes]
    # any exception: an unexpected failure on one episode must not sink its batch-mates
    results = score_each(reward, requests, errors=(Exception,))
    return [_outcome(reward.spec, e, r, res) for e, r, res in zip(episodes, requests, results)]


def _outcome(
    spec: RewardSpec, episode: DecodedEpisode, request: RewardRequest, result: RewardResult | Exception
) -> EpisodeOutcome:
    outcome = EpisodeOutcome(ref=episode.ref, num_frames=episode.num_frames)
    if isinstance(result, Exception):
        outcome.error, outcome.stage = f"reward raised {type(result).__name__}: {result}", "reward"
        return outcome
    values = [result.reward, *result.components.values()]
    if result.progress is not None:
        values.extend(np.asarray(result.progress, dtype=np.float64).tolist())
    if result.error or any(not math.isfinite(v) for v in values):
        outcome.error, outcome.stage = f"reward error: {result.error or 'non-finite values'}", "reward"
        return outcome
    outcome.reward = float(result.reward)
    outcome.components = {name: float(value) for name, value in result.components.items()}
    outcome.info = dict(result.to_json()["info"])
    scored = np.zeros(episode.num_frames, dtype=bool)
    scored[request.frame_index] = True
    outcome.scored = scored
    if spec.dense:
        outcome.progress = expand_to_episode(result.progress, request.frame_index, episode.num_frames)
    else:
        outcome.progress = np.full(episode.num_frames, np.nan)
    return outcome
