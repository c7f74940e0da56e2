"""Long episodes: score a subsample that fits a reward's frame budget, then map values back to every frame.

    request = subsample_request(episode_request, budget=reward.spec.max_frames)   # sets frame_index
    result = reward.score([request])[0]
    per_frame = expand_to_episode(result.progress, request.frame_index, episode_length)

`score_episodes` does the three steps for a batch. Training uses `subsample_indices` alike, so a model
sees long episodes the way it is later asked about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from vlm_rewards.interface import RewardModel, RewardRequest, RewardResult


def subsample_indices(num_frames: int, budget: int | None) -> np.ndarray:
    """`min(num_frames, budget)` frame indices spread evenly, the first and the last frame always in."""
    if num_frames < 1:
        raise ValueError(f"subsample_indices: num_frames must be at least 1, got {num_frames}")
    if budget is None or num_frames <= budget:
        return np.arange(num_frames)
    if budget < 2:
        raise ValueError(f"subsample_indices: a budget of {budget} cannot hold both the first and the last frame")
    return np.round(np.linspace(0, num_frames - 1, budget)).astype(np.int64)


def subsample_request(request: RewardRequest, budget: int | None) -> RewardRequest:
    """The request cut to `budget` frames (views alike), with `frame_index` saying which frames it holds.

    A request that already carries a `frame_index` keeps indexing its source episode.
    """
    return request.take(subsample_indices(request.num_frames, budget))


def expand_to_episode(values: np.ndarray, frame_index: np.ndarray | None, num_frames: int) -> np.ndarray:
    """Per-frame values at `frame_index` -> (num_frames,) values, linear between scored frames.

    Scored frames keep their values exactly; frames past the last scored one hold its value. NaN
    (unscored) frames are left out of the interpolation; if none is scored the result is all NaN.
    """
    values = np.asarray(values, dtype=np.float64)
    index = np.arange(len(values)) if frame_index is None else np.asarray(frame_index)
    if index.shape != values.shape:
        raise ValueError(f"expand_to_episode: {values.shape} values for frame_index of shape {index.shape}")
    if len(index) and index[-1] >= num_frames:
        raise ValueError(f"expand_to_episode: frame_index reaches {index[-1]}, the episode has {num_frames} frames")
    scored = ~np.isnan(values)
    if not scored.any():
        return np.full(num_frames, np.nan)
    return np.interp(np.arange(num_frames), index[scored], values[scored])


def score_episodes(reward: RewardModel, requests: Sequence[RewardRequest]) -> list[RewardResult]:
    """Score whole episodes of any length with a dense reward: subsample each to `spec.max_frames`, score
    them in one call, and return results whose progress covers every frame of each episode."""
    if not reward.spec.dense:
        raise ValueError(f"score_episodes: {reward.spec.name} is not dense; it gives no per-frame progress to expand")
    subsampled = [subsample_request(request, reward.spec.max_frames) for request in requests]
    results = reward.score(subsampled)
    return [
        replace(result, progress=expand_to_episode(result.progress, sample.frame_index, request.num_frames))
        for request, sample, result in zip(requests, subsampled, results)
    ]
