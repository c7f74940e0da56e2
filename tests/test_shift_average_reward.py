"""`shift_average`: a dense reward averaged over shifted copies of each clip, which turns plateaus into ramps."""

import numpy as np
import pytest

from vlm_rewards.interface import RewardRequest, RewardResult
from vlm_rewards.registry import build_reward
from vlm_rewards.rewards.function import FunctionReward
from vlm_rewards.rewards.rules import GoalPixelProgress
from vlm_rewards.rewards.shift_average import ShiftAverageReward
from vlm_rewards.testing import check_reward

CELL = 8  # the plateau reward's cell width in pixels


def cell_progress(request: RewardRequest) -> RewardResult:
    """Per frame, the 8-pixel cell that holds the frame's brightest column, over 4: one plateau per cell."""
    columns = request.frames.max(axis=(1, 3)).argmax(axis=1)
    progress = (columns // CELL) / 4
    return RewardResult(float(progress[-1]), progress.astype(np.float64))


PLATEAUS = FunctionReward(cell_progress, dense=True)


def dot_at(column: int) -> np.ndarray:
    frame = np.zeros((1, 32, 32, 3), np.uint8)
    frame[0, 16, column] = 255
    return frame


def test_a_shifted_request_moves_the_pixels_of_frames_and_views_and_repeats_the_edges():
    clip = np.arange(2 * 5 * 5 * 3, dtype=np.uint8).reshape(2, 5, 5, 3)
    request = RewardRequest(clip, "t", reference=clip[:1], views={"side": clip[::-1]})
    moved = request.shifted(1, -2)
    np.testing.assert_array_equal(moved.frames[:, 1:, :3], clip[:, :4, 2:])  # down one row, left two columns
    np.testing.assert_array_equal(moved.frames[:, 0, :3], clip[:, 0, 2:])  # the top row repeated into the gap
    np.testing.assert_array_equal(moved.views["side"][:, 1:, :3], clip[::-1, :4, 2:])
    assert moved.reference is request.reference
    np.testing.assert_array_equal(request.shifted(0, 0).frames, clip)


def test_averaging_over_shifts_turns_a_plateau_into_a_ramp():
    plain = [PLATEAUS.score([RewardRequest(dot_at(c), "t")])[0].reward for c in range(9, 15)]
    assert len(set(plain)) == 1  # one cell: moving the dot changes nothing
    reward = ShiftAverageReward(PLATEAUS, max_shift=4, points=9)
    averaged = [reward.score([RewardRequest(dot_at(c), "t")])[0].reward for c in range(9, 15)]
    assert all(np.diff(averaged) > 0)  # every move toward the next cell now pays
    assert len(reward.offsets) == 81 and reward.spec.name == "cell_progress_shift4x9"


def test_copies_of_a_batch_are_scored_in_one_call_and_shift_views_alike(monkeypatch):
    calls = []
    original = PLATEAUS.score
    monkeypatch.setattr(PLATEAUS, "score", lambda requests: calls.append(len(requests)) or original(requests))
    reward = ShiftAverageReward(PLATEAUS, max_shift=2, points=3)
    results = reward.score([RewardRequest(dot_at(c), "t") for c in (3, 20)])
    assert calls == [18] and len(results) == 2
    request = RewardRequest(dot_at(10), "t", views={"side": dot_at(10)})
    copies = [request.shifted(dy, dx) for dy, dx in reward.offsets]
    assert all((copy.frames == copy.views["side"]).all() for copy in copies)
    assert len({copy.frames.tobytes() for copy in copies}) == 9


def test_shift_average_conforms_and_builds_from_yaml(tmp_path):
    check_reward(ShiftAverageReward(GoalPixelProgress(), max_shift=2, points=2))
    (tmp_path / "inner.yaml").write_text("kind: goal_pixel_progress\n")
    (tmp_path / "shifts.yaml").write_text("kind: shift_average\nreward: inner.yaml\nmax_shift: 3\npoints: 2\n")
    reward = build_reward(tmp_path / "shifts.yaml")
    assert isinstance(reward, ShiftAverageReward) and reward.offsets == [(-3, -3), (-3, 3), (3, -3), (3, 3)]
    assert reward.spec.version != reward.reward.spec.version


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="shift_average: reward 'cell_progress' is not dense"):
        ShiftAverageReward(FunctionReward(cell_progress))
    with pytest.raises(ValueError, match="max_shift 0, points 3"):
        ShiftAverageReward(PLATEAUS, max_shift=0)
