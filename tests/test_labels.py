import numpy as np
import pytest

from vlm_rewards.data.labels import (
    mismatched_instruction,
    reversed_clip,
    rewound_clip,
    stage_budget_progress,
    stalled_clip,
    time_progress,
    visual_change,
    zero_progress,
)


def expert_clip(num_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """Frames whose pixel value is the frame index, so a transformed clip shows where frames went."""
    frames = np.broadcast_to(np.arange(num_frames, dtype=np.uint8)[:, None, None, None], (num_frames, 4, 4, 3))
    return frames.copy(), time_progress(num_frames)


def test_time_and_zero_progress():
    np.testing.assert_allclose(time_progress(5), [0, 0.25, 0.5, 0.75, 1])
    assert time_progress(5).dtype == np.float32
    np.testing.assert_array_equal(zero_progress(3), [0, 0, 0])
    with pytest.raises(ValueError, match="at least 2 frames"):
        time_progress(1)


def test_stage_budgets_reach_each_budget_at_each_stage_end():
    progress = stage_budget_progress(stage_ends=[2, 6, 8], budgets=[1, 2, 1], num_frames=9)
    assert progress[0] == 0 and progress[-1] == pytest.approx(1)
    np.testing.assert_allclose(progress[[2, 6, 8]], [0.25, 0.75, 1.0], rtol=1e-6)
    np.testing.assert_allclose(progress[:3], [0, 0.125, 0.25], rtol=1e-6)  # linear inside a stage
    assert np.all(np.diff(progress) >= 0)


def test_stage_budgets_follow_visual_change():
    change = np.array([0, 0, 0, 1, 1, 0, 0, 0], dtype=np.float32)  # only frames 3 and 4 move
    progress = stage_budget_progress([7], [1.0], 8, change=change)
    np.testing.assert_allclose(progress, [0, 0, 0, 0.5, 1, 1, 1, 1])
    still = stage_budget_progress([3, 7], [0.5, 0.5], 8, change=np.zeros(8))
    np.testing.assert_allclose(still, stage_budget_progress([3, 7], [0.5, 0.5], 8))  # no change: linear


def test_visual_change_of_a_clip():
    frames, _ = expert_clip(4)
    np.testing.assert_allclose(visual_change(frames), [0, 1, 1, 1])


@pytest.mark.parametrize(
    "stage_ends, budgets", [([3, 5], [1.0]), ([0, 7], [1, 1]), ([4, 6], [1, 1]), ([3, 7], [-1, 2])]
)
def test_stage_budgets_reject_bad_stages(stage_ends, budgets):
    with pytest.raises(ValueError):
        stage_budget_progress(stage_ends, budgets, 8)


def test_reversed_clip_is_a_true_reversal():
    frames, progress = expert_clip(6)
    reversed_frames, reversed_progress = reversed_clip(frames, progress)
    np.testing.assert_array_equal(reversed_frames[:, 0, 0, 0], [5, 4, 3, 2, 1, 0])
    np.testing.assert_allclose(reversed_progress, progress[::-1])
    twice = reversed_clip(reversed_frames, reversed_progress)
    np.testing.assert_array_equal(twice[0], frames)


@pytest.mark.parametrize("num_frames", [3, 4, 8, 16])
def test_rewound_labels_go_up_then_down(num_frames):
    frames, progress = expert_clip(num_frames)
    for seed in range(30):
        rewound_frames, rewound_progress = rewound_clip(frames, progress, np.random.default_rng(seed))
        assert len(rewound_frames) == len(rewound_progress) == num_frames
        np.testing.assert_allclose(rewound_progress, progress[rewound_frames[:, 0, 0, 0]])  # labels follow frames
        peak = int(np.argmax(rewound_progress))
        assert 0 < peak < num_frames - 1
        assert np.all(np.diff(rewound_progress[: peak + 1]) > 0)
        assert np.all(np.diff(rewound_progress[peak:]) < 0)


@pytest.mark.parametrize("num_frames", [4, 7, 16])
def test_stalled_clip_has_a_flat_region(num_frames):
    frames, progress = expert_clip(num_frames)
    for seed in range(30):
        stalled_frames, stalled_progress = stalled_clip(frames, progress, np.random.default_rng(seed))
        assert len(stalled_frames) == len(stalled_progress) == num_frames
        np.testing.assert_allclose(stalled_progress, progress[stalled_frames[:, 0, 0, 0]])
        steps = np.diff(stalled_progress)
        assert np.all(steps >= 0) and np.any(steps == 0)
        assert stalled_progress[0] == 0 and stalled_progress[-1] == 1


def test_clip_transforms_check_lengths():
    frames, progress = expert_clip(5)
    with pytest.raises(ValueError, match="5 frames but 4 progress labels"):
        reversed_clip(frames, progress[:4])
    with pytest.raises(ValueError, match="at least 3 frames"):
        rewound_clip(frames[:2], progress[:2], np.random.default_rng(0))


def test_mismatched_instruction_differs():
    rng = np.random.default_rng(0)
    candidates = ["open the drawer", "close the drawer", "pick up the cup"]
    picks = {mismatched_instruction("open the drawer", candidates, rng) for _ in range(20)}
    assert picks == {"close the drawer", "pick up the cup"}
    with pytest.raises(ValueError, match="no candidate"):
        mismatched_instruction("open the drawer", ["open the drawer"], rng)
