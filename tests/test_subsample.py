from dataclasses import replace

import numpy as np
import pytest

from vlm_rewards.interface import RewardRequest, RewardResult
from vlm_rewards.rewards.function import FunctionReward
from vlm_rewards.subsample import expand_to_episode, score_episodes, subsample_indices, subsample_request


@pytest.mark.parametrize("num_frames, budget", [(100, 8), (9, 8), (17, 2), (1000, 32), (5, 5), (3, 8)])
def test_subsample_keeps_first_and_last_within_budget(num_frames, budget):
    indices = subsample_indices(num_frames, budget)
    assert len(indices) == min(num_frames, budget)
    assert indices[0] == 0 and indices[-1] == num_frames - 1
    assert np.all(np.diff(indices) > 0)


def test_subsample_refuses_impossible_budgets():
    with pytest.raises(ValueError, match="budget of 1 cannot hold both"):
        subsample_indices(10, 1)
    with pytest.raises(ValueError, match="num_frames must be at least 1"):
        subsample_indices(0, 4)


def test_subsample_request_cuts_views_and_records_source_frames():
    frames = np.arange(10, dtype=np.uint8)[:, None, None, None].repeat(3, axis=-1) * np.ones((1, 2, 2, 3), np.uint8)
    request = RewardRequest(frames, "t", views={"wrist": frames.copy()})
    cut = subsample_request(request, 4)
    np.testing.assert_array_equal(cut.frame_index, [0, 3, 6, 9])
    np.testing.assert_array_equal(cut.frames[:, 0, 0, 0], [0, 3, 6, 9])
    np.testing.assert_array_equal(cut.views["wrist"][:, 0, 0, 0], [0, 3, 6, 9])
    again = subsample_request(cut, 2)  # indices stay those of the source episode
    np.testing.assert_array_equal(again.frame_index, [0, 9])


def test_expand_keeps_scored_values_and_interpolates_between():
    values = expand_to_episode(np.array([0.0, 0.5, np.nan, 1.0]), np.array([0, 2, 4, 6]), 8)
    np.testing.assert_allclose(values, [0, 0.25, 0.5, 0.625, 0.75, 0.875, 1.0, 1.0])
    assert np.isnan(expand_to_episode(np.array([np.nan]), np.array([0]), 3)).all()
    with pytest.raises(ValueError, match="reaches 9, the episode has 5 frames"):
        expand_to_episode(np.zeros(2), np.array([0, 9]), 5)


def brightness_per_frame(request):
    values = request.frames.mean(axis=(1, 2, 3)) / 255
    return RewardResult(reward=float(values[-1]), progress=values)


def test_score_episodes_covers_every_frame_of_long_episodes():
    reward = FunctionReward(brightness_per_frame, value_range=(0.0, 1.0), dense=True, causal=True)
    reward.spec = replace(reward.spec, max_frames=5)
    ramp = np.linspace(0, 255, 21).astype(np.uint8)[:, None, None, None] * np.ones((1, 2, 2, 3), np.uint8)
    short = ramp[:3]
    with pytest.raises(ValueError, match="clip of 21 frames; brightness_per_frame takes at most 5"):
        reward.score([RewardRequest(ramp, "t")])
    long_result, short_result = score_episodes(reward, [RewardRequest(ramp, "t"), RewardRequest(short, "t")])
    assert long_result.progress.shape == (21,) and short_result.progress.shape == (3,)
    np.testing.assert_allclose(long_result.progress, ramp[:, 0, 0, 0] / 255, atol=0.01)  # a linear ramp
    with pytest.raises(ValueError, match="not dense"):
        score_episodes(FunctionReward(lambda request: 0.0), [RewardRequest(short, "t")])
