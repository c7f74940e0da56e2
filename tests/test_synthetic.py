import numpy as np

from vlm_rewards.data.synthetic import GOALS, SUCCESS_DISTANCE, ShapesWorld


def test_rollouts_are_deterministic_for_a_seed(world):
    first = world.rollout(np.random.default_rng(3), 8, "expert")
    second = world.rollout(np.random.default_rng(3), 8, "expert")
    np.testing.assert_array_equal(first.frames, second.frames)
    assert first.instruction == second.instruction


def test_expert_reaches_the_goal_and_labels_rise(world):
    rng = np.random.default_rng(0)
    for _ in range(10):
        episode = world.rollout(rng, 16, "expert")
        assert episode.frames.shape == (16, 56, 56, 3) and episode.frames.dtype == np.uint8
        assert episode.success and episode.progress[-1] > 0.8 and episode.progress[0] == 0
        assert np.all(np.diff(episode.progress) > -0.05)


def test_wrong_object_makes_no_progress(world):
    rng = np.random.default_rng(1)
    for _ in range(10):
        episode = world.rollout(rng, 16, "wrong_object")
        assert not episode.success and episode.progress.max() < 0.3


def test_labels_are_geometric(world):
    episode = world.rollout(np.random.default_rng(2), 12, "random")
    task, trajectory = episode.meta["task"], episode.meta["trajectory"]
    distances = np.linalg.norm(trajectory[:, task.target] - np.array(GOALS[task.goal]), axis=1)
    np.testing.assert_allclose(episode.progress, np.clip(1 - distances / distances[0], 0, 1), rtol=1e-6)
    assert episode.success == (distances[-1] < SUCCESS_DISTANCE)


def test_instruction_names_an_object_in_the_scene(world):
    episode = world.rollout(np.random.default_rng(4), 4, "expert")
    target = episode.meta["scene"][episode.meta["task"].target]
    assert f"{target.color} {target.shape}" in episode.instruction


def test_preference_pairs_prefer_the_object_nearer_its_region():
    world = ShapesWorld(size=56)
    rng = np.random.default_rng(5)
    for _ in range(5):
        prompt, chosen, rejected, gap = world.preference_pair(rng)
        assert prompt.startswith("a ") and gap >= 0.25
        assert chosen.shape == rejected.shape == (1, 56, 56, 3)
        assert not np.array_equal(chosen, rejected)
