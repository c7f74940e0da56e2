"""`frame_window`: any dense reward scored frame by frame in short clips of its own."""

from dataclasses import replace

import numpy as np
import pytest

from vlm_rewards.interface import RewardRequest, RewardResult
from vlm_rewards.registry import build_reward
from vlm_rewards.rewards.composite import CompositeReward
from vlm_rewards.rewards.function import FunctionReward
from vlm_rewards.rewards.rules import GoalPixelProgress
from vlm_rewards.rewards.window import FrameWindowReward
from vlm_rewards.testing import check_reward


def clip_signature(request: RewardRequest) -> RewardResult:
    """History-dependent progress that names the clip: at each frame, the clip's length so far, plus
    the frame's number (its first pixel) / 100, plus the clip's first frame's number / 10,000."""
    numbers = request.frames[:, 0, 0, 0].astype(np.float64)
    progress = np.arange(1, request.num_frames + 1) + numbers / 100 + numbers[0] / 10_000
    return RewardResult(reward=float(progress[-1]), progress=progress)


SIGNATURE = FunctionReward(clip_signature, dense=True)


def numbered_clip(length: int) -> np.ndarray:
    clip = np.zeros((length, 4, 4, 3), np.uint8)
    clip[:, 0, 0, 0] = np.arange(1, length + 1)  # frame t shows t + 1
    return clip


@pytest.mark.parametrize(("window", "keep_first"), [(1, True), (1, False), (3, True), (3, False)])
def test_each_frame_is_scored_in_its_own_window(window, keep_first):
    reward = FrameWindowReward(SIGNATURE, window=window, keep_first=keep_first)
    (result,) = reward.score([RewardRequest(numbered_clip(6), "t")])
    for t, value in enumerate(result.progress):
        clip = list(range(max(0, t - window + 1), t + 1))
        if keep_first and clip[0] > 0:
            clip.insert(0, 0)
        assert value == pytest.approx(len(clip) + (t + 1) / 100 + (clip[0] + 1) / 10_000), (t, clip)
    assert result.reward == result.progress[-1]
    assert reward.spec.causal and reward.spec.dense and not SIGNATURE.spec.causal


def test_a_session_streams_the_same_values_with_constant_work_per_frame(monkeypatch):
    reward = FrameWindowReward(SIGNATURE, window=2)
    clips = [numbered_clip(7), numbered_clip(4)]
    expected = [result.progress for result in reward.score([RewardRequest(clip, "t") for clip in clips])]
    calls = []
    original = SIGNATURE.score
    monkeypatch.setattr(
        SIGNATURE, "score", lambda requests: calls.append(max(r.num_frames for r in requests)) or original(requests)
    )
    with reward.open_session(["t", "t"]) as session:
        streamed = [session.append([clips[0][:3], clips[1][:1]]), session.append([clips[0][3:], clips[1][1:]])]
        assert session.num_frames == [7, 4]
        with pytest.raises(
            ValueError, match=r"frames\[1\]: frames of shape \(8, 8, 3\), the stream began with \(4, 4, 3\)"
        ):
            session.append([clips[0][:1], np.zeros((1, 8, 8, 3), np.uint8)])
        assert session.num_frames == [7, 4]  # the refused append moved no stream on
        session.reset(1, "t")
        assert session.num_frames == [7, 0]
    assert calls == [3, 3]  # every clip holds at most the first frame and a window of 2
    for stream in range(2):
        np.testing.assert_array_equal(np.concatenate([step[stream] for step in streamed]), expected[stream])


@pytest.mark.parametrize("history_dependent", [False, True], ids=["goal_pixel", "clip_signature"])
def test_frame_window_conforms(history_dependent):
    inner = SIGNATURE if history_dependent else GoalPixelProgress()
    check_reward(FrameWindowReward(inner, window=2))


def test_a_window_over_a_composite_keeps_its_components(expert_requests):
    parts = CompositeReward([GoalPixelProgress(), GoalPixelProgress(name="again")], [0.5, 0.5])
    reward = FrameWindowReward(parts)
    check_reward(reward)
    (result,) = reward.score(expert_requests[:1])
    assert reward.spec.components == ("goal_pixel_progress", "again")
    assert result.components["again"] == pytest.approx(result.progress[-1])


def test_builds_from_yaml_with_a_path_relative_to_it(tmp_path):
    (tmp_path / "inner.yaml").write_text("kind: goal_pixel_progress\n")
    (tmp_path / "window.yaml").write_text("kind: frame_window\nreward: inner.yaml\nwindow: 2\nkeep_first: false\n")
    reward = build_reward(tmp_path / "window.yaml")
    assert isinstance(reward, FrameWindowReward) and reward.window == 2 and not reward.keep_first
    assert reward.spec.name == "goal_pixel_progress_window2" and reward.spec.requires == ("reference",)
    assert reward.spec.version != reward.reward.spec.version


def test_bad_wrapped_rewards_are_refused():
    with pytest.raises(ValueError, match="frame_window: reward 'clip_signature' is not dense"):
        FrameWindowReward(FunctionReward(clip_signature))
    short = FunctionReward(clip_signature, dense=True)
    short.spec = replace(short.spec, max_frames=2)
    with pytest.raises(ValueError, match="clips of 3 frames, 'clip_signature' takes at most 2"):
        FrameWindowReward(short, window=2)
    with pytest.raises(ValueError, match="window 0"):
        FrameWindowReward(SIGNATURE, window=0)
