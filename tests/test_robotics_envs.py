import os
import subprocess
import sys
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from vlm_rewards.robotics.experts import (
    DETOUR_REACHED,
    detour_reached,
    detour_waypoint,
    make_expert,
    pick_wrong_target,
    scripted_action,
)
from vlm_rewards.robotics.frames import CameraFrames
from vlm_rewards.robotics.tasks import WORKSPACE  # the import registers vlmr/*

TASKS = ["vlmr/Reach-v0", "vlmr/Push-v0", "vlmr/Carry-v0"]


@pytest.mark.parametrize("env_id", TASKS)
def test_env_passes_gymnasium_checker(env_id):
    env = gym.make(env_id, render_mode="rgb_array", width=32, height=32)
    check_env(env.unwrapped, skip_render_check=False)
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert {"is_success", "progress", "dense_reward", "instruction", "stage"} <= set(info)
    frames = env.unwrapped.render_cameras()
    assert set(frames) == {"top", "front"} and all(
        f.shape == (32, 32, 3) and f.dtype == np.uint8 for f in frames.values()
    )
    assert env.unwrapped.render_goal().shape == (32, 32, 3)


@pytest.mark.parametrize("env_id", TASKS)
def test_gradient_table_shades_by_position_and_changes_nothing_else(env_id):
    from vlm_rewards.robotics.config import EnvConfig
    from vlm_rewards.robotics.envs import make_env

    plain = gym.make(env_id, render_mode="rgb_array", width=32, height=32)
    shaded = make_env(EnvConfig(id=env_id, width=32, height=32, table="gradient"))
    obs, info = plain.reset(seed=5)
    obs_shaded, info_shaded = shaded.reset(seed=5)
    assert np.array_equal(obs, obs_shaded) and info["instruction"] == info_shaded["instruction"]
    frame = info_shaded["frames"]["top"].astype(int)
    corners = [frame[3, 3], frame[3, -4], frame[-4, 3], frame[-4, -4]]  # table, off the markers
    assert len({tuple(c) for c in corners}) == 4  # each corner of the table looks different
    assert frame[16, -4].sum() > frame[16, 3].sum()  # lighter toward +x
    plain_frame = plain.unwrapped.render().astype(int)
    assert np.array_equal(plain_frame[3, 3], plain_frame[-4, -4])  # the plain table is uniform
    with pytest.raises(ValueError, match="table"):
        gym.make(env_id, table="checker")
    if env_id == "vlmr/Reach-v0":  # bigger drawn targets: more target-coloured pixels, same physics
        big = make_env(EnvConfig(id=env_id, width=32, height=32, marker_radius=0.08))
        obs_big, info_big = big.reset(seed=5)
        assert np.array_equal(obs, obs_big)

        def coloured(image):
            image = image.astype(int)
            return int(((image.max(-1) - image.min(-1)) > 120).sum())

        assert coloured(info_big["frames"]["top"]) > 1.5 * coloured(plain.unwrapped.render())


@pytest.mark.parametrize("env_id", TASKS)
def test_without_highlights_the_colours_are_saturated_and_nothing_else_changes(env_id):
    from vlm_rewards.robotics.config import EnvConfig
    from vlm_rewards.robotics.envs import make_env

    lit = make_env(EnvConfig(id=env_id, table="gradient"))
    matte = make_env(EnvConfig(id=env_id, table="gradient", highlights=False))
    obs, info = lit.reset(seed=5)
    obs_matte, info_matte = matte.reset(seed=5)
    assert np.array_equal(obs, obs_matte) and info["instruction"] == info_matte["instruction"]
    lit_frame, matte_frame = info["frames"]["top"].astype(int), info_matte["frames"]["top"].astype(int)
    changed = np.abs(lit_frame - matte_frame).sum(-1) > 30  # the markers, blocks and effector, not the table
    assert 0 < changed.mean() < 0.2 and np.array_equal(lit_frame[3, 3], matte_frame[3, 3])
    saturation = [np.percentile(frame.max(-1) - frame.min(-1), 99) for frame in (lit_frame, matte_frame)]
    assert saturation[1] > saturation[0] + 30  # the most coloured pixels: washed pale with highlights
    assert matte_frame[changed].sum(-1).mean() < lit_frame[changed].sum(-1).mean()  # the footprint dark, not grey
    with pytest.raises(ValueError, match=r"highlights is a setting of the vlmr/\* tasks; env.id is 'metaworld/"):
        EnvConfig(id="metaworld/reach-v3", highlights=False)


@pytest.mark.parametrize("env_id", TASKS)
def test_a_palette_limits_the_scene_colours_and_is_checked(env_id):
    from vlm_rewards.robotics.config import EnvConfig
    from vlm_rewards.robotics.envs import make_env

    palette = ["red", "green", "blue", "cyan"]
    env = make_env(EnvConfig(id=env_id, palette=palette))
    seen = set()
    for seed in range(12):
        env.reset(seed=seed)
        layout = env.unwrapped.layout
        seen.update(layout.colours + layout.zone_colours)
    assert seen == set(palette)
    with pytest.raises(ValueError, match=r"palette \['red', 'green'\] has 2 colours; this scene colours [34] objects"):
        make_env(EnvConfig(id=env_id, palette=["red", "green"]))
    with pytest.raises(ValueError, match=r"palette \['red', 'pink', 'blue'\]; expected distinct colours from"):
        make_env(EnvConfig(id=env_id, palette=["red", "pink", "blue"]))
    with pytest.raises(ValueError, match=r"palette is a setting of the vlmr/\* tasks; env.id is 'metaworld/"):
        EnvConfig(id="metaworld/reach-v3", palette=palette)


@pytest.mark.parametrize("env_id", TASKS)
def test_rendering_the_goal_leaves_the_episode_as_it_was(env_id):
    env = gym.make(env_id, render_mode="rgb_array", width=32, height=32)
    obs, info = env.reset(seed=2)
    frame = env.unwrapped.render()
    goal = env.unwrapped.render_goal()
    assert not np.array_equal(goal, frame)
    assert np.array_equal(env.unwrapped._observation(), obs) and np.array_equal(env.unwrapped.render(), frame)
    assert env.unwrapped._info()["progress"] == info["progress"] and not env.unwrapped._info()["is_success"]


@pytest.mark.parametrize("env_id", TASKS)
def test_seeded_resets_repeat_and_differ(env_id):
    env = gym.make(env_id)
    first, info = env.reset(seed=7)
    again, info_again = env.reset(seed=7)
    other, _ = env.reset(seed=8)
    assert np.array_equal(first, again) and info["instruction"] == info_again["instruction"]
    assert not np.array_equal(first, other)


@dataclass
class Episode:
    infos: list[dict]  # reset's, then every step's
    rewards: list[float]
    frames: list[np.ndarray]  # env.render() after reset and every step; none without rgb_array rendering
    terminated: bool


def scripted_episode(env, policy: str, seed: int, rng: np.random.Generator, noise: float = 0.0) -> Episode:
    """One episode of a scripted policy (vlm_rewards.robotics.experts) from `reset(seed=seed)`."""
    expert = make_expert(env)
    obs, info = env.reset(seed=seed)
    render = env.render_mode == "rgb_array"
    episode = Episode([info], [], [env.render()] if render else [], False)
    wrong, truncated = pick_wrong_target(expert, obs, rng), False
    while not (episode.terminated or truncated):
        action = scripted_action(expert, policy, obs, rng, noise, wrong)
        obs, reward, episode.terminated, truncated, info = env.step(action)
        episode.infos.append(info)
        episode.rewards.append(reward)
        if render:
            episode.frames.append(env.render())
    return episode


def success_rate(env_id: str, policy: str, episodes: int, noise: float = 0.0) -> float:
    env, rng = gym.make(env_id), np.random.default_rng(0)
    return float(np.mean([scripted_episode(env, policy, seed, rng, noise).infos[-1]["is_success"]
                          for seed in range(episodes)]))  # fmt: skip


@pytest.mark.parametrize("env_id", TASKS)
def test_experts_succeed_and_random_or_wrong_object_rarely(env_id):
    assert success_rate(env_id, "expert", 20) >= 0.85
    assert success_rate(env_id, "expert", 10, noise=0.3) >= 0.6
    assert success_rate(env_id, "random", 10) <= 0.2
    assert success_rate(env_id, "wrong_object", 10) <= 0.2


def test_carry_picks_the_block_up_on_contact_and_carries_it():
    env = gym.make("vlmr/Carry-v0", render_mode="rgb_array", width=32, height=32)
    obs, info = env.reset(seed=4)
    carry = env.unwrapped
    start = carry.block_position
    assert not carry.held and info["stage"] == 0 and info["instruction"].startswith("carry the block to the ")
    away = -np.sign(start - carry.ee_position)  # moving away from the block does not pick it up
    for _ in range(3):
        obs, *_, info = env.step(away)
    assert not carry.held and np.array_equal(carry.block_position, start) and info["progress"] == 0.0
    expert = make_expert(env)
    while not carry.held:
        obs, *_, info = env.step(expert.act(obs))
    assert info["stage"] == 1 and 0.45 < info["progress"] < 0.6  # the pick half done; the block jumps to the effector
    assert np.linalg.norm(carry.block_position - start) < carry.grasp_distance  # picked up where it lay
    obs, *_, info = env.step(np.array([0.0, 1.0]))
    assert np.array_equal(carry.block_position, carry.ee_position) and obs[6 + 3 * carry.num_zones] == 1.0
    # every zone's progress is reported for relabelling; the named zone's is the env's progress
    progress, texts = info["target_progress"], info["target_instructions"].split("|")
    assert len(progress) == len(texts) == carry.num_zones and texts[carry.layout.zone] == info["instruction"]
    assert progress[carry.layout.zone] == pytest.approx(info["progress"])
    frame, goal = carry.render().astype(int), carry.render_goal().astype(int)
    assert (frame.min(-1) > 240).sum() >= 4 and (goal.min(-1) > 240).sum() >= 4  # the white block is drawn
    assert not np.array_equal(frame, goal)


def test_short_push_starts_near_the_zone_with_the_effector_behind_the_block():
    from vlm_rewards.robotics.config import EnvConfig
    from vlm_rewards.robotics.envs import make_env

    config = EnvConfig(id="vlmr/Push-v0", push_distance=(0.08, 0.15), push_start_angle=30, max_episode_steps=50)
    env, rng = make_env(config), np.random.default_rng(0)
    for seed in range(200):  # enough layouts to meet zones in corners, where a short push must be drawn again
        env.reset(seed=seed)
        push = env.unwrapped
        block, zone, effector = push.block_positions[push.layout.target], push.goal_position, push.ee_position
        assert 0.08 <= np.linalg.norm(block - zone) <= 0.15
        away, to_effector = block - zone, effector - block
        assert away @ to_effector / np.linalg.norm(away) / np.linalg.norm(to_effector) >= np.cos(np.pi / 6) - 1e-9
    assert np.mean([scripted_episode(env, "expert", seed, rng).infos[-1]["is_success"] for seed in range(10)]) >= 0.9
    with pytest.raises(ValueError, match=r"push_distance \(0.2, 0.1\); expected 0 < low <= high < 0.3"):
        gym.make("vlmr/Push-v0", push_distance=(0.2, 0.1))
    with pytest.raises(ValueError, match=r"start_angle 200; expected degrees in \(0, 180\]"):
        gym.make("vlmr/Push-v0", start_angle=200)
    with pytest.raises(ValueError, match="push_start_angle is a vlmr/Push-v0 setting; env.id is 'vlmr/Reach-v0'"):
        EnvConfig(push_start_angle=30)


@pytest.mark.parametrize("env_id", TASKS)
def test_success_distance_sets_how_close_to_the_goal_counts(env_id):
    from vlm_rewards.robotics.config import EnvConfig
    from vlm_rewards.robotics.envs import make_env

    rng = np.random.default_rng(0)
    default, tight = (make_env(EnvConfig(id=env_id, success_distance=d)) for d in (None, 0.02))
    for seed in range(5):
        loose_episode, tight_episode = (scripted_episode(env, "expert", seed, rng) for env in (default, tight))
        assert loose_episode.terminated and tight_episode.terminated  # the expert aims at the goal's centre
        assert len(tight_episode.rewards) > len(loose_episode.rewards)
        tight_distance = tight.unwrapped._distances()[-1]
        assert tight_distance < 0.02 <= default.unwrapped.success_distance
    with pytest.raises(ValueError, match=r"success_distance 0.5; expected 0 < distance < 0.3"):
        gym.make(env_id, success_distance=0.5)
    with pytest.raises(ValueError, match=r"success_distance is a setting of the vlmr/\* tasks; env.id is 'metaworld/"):
        EnvConfig(id="metaworld/reach-v3", success_distance=0.02)


def test_sparse_and_dense_rewards_and_termination():
    episode = scripted_episode(gym.make("vlmr/Reach-v0", reward_type="dense"), "expert", 0, np.random.default_rng(0))
    rewards = episode.rewards
    assert episode.terminated and episode.infos[-1]["is_success"] and rewards[-1] == 0.0  # dense = progress − 1
    assert all(r <= 0 for r in rewards) and rewards[0] < rewards[-2]


def test_sparse_step_cost_charges_every_step_before_success():
    from vlm_rewards.robotics.config import EnvConfig
    from vlm_rewards.robotics.envs import make_env

    config = EnvConfig(sparse_step_cost=1.0, max_episode_steps=30)
    rng = np.random.default_rng(0)
    sparse = scripted_episode(make_env(config), "expert", 0, rng)
    dense = scripted_episode(make_env(config, reward_type="dense"), "expert", 0, rng)  # the same trajectory
    assert sparse.terminated and sparse.infos[-1]["is_success"] and len(dense.rewards) == len(sparse.rewards)
    assert sparse.rewards == [-1.0] * (len(sparse.rewards) - 1) + [1.0]
    assert dense.rewards[-1] == 0.0 and all(-1 <= d < 0 for d in dense.rewards[:-1])  # dense: progress − 1, no cost


def test_camera_frames_errors_are_clear():
    with pytest.raises(ValueError, match="render_mode=None"):
        CameraFrames(gym.make("vlmr/Reach-v0"))
    with pytest.raises(ValueError, match=r"camera\(s\) \['wrist'\] do not exist"):
        CameraFrames(gym.make("vlmr/Reach-v0", render_mode="rgb_array"), cameras=["wrist"])


class PlainRGBEnv(gym.Env):
    """Any env with render_mode="rgb_array" and no cameras of its own."""

    observation_space = gym.spaces.Box(-1, 1, (1,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.render_mode = "rgb_array"

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def render(self):
        return np.full((8, 8, 3), 100, np.uint8)


def test_camera_frames_works_with_any_rgb_env():
    env = CameraFrames(PlainRGBEnv(), cameras=["default"], instruction="balance")
    _, info = env.reset(seed=0)
    assert info["instruction"] == "balance" and info["frames"]["default"].ndim == 3
    *_, info = env.step(0)
    assert info["frames"]["default"].dtype == np.uint8


@pytest.mark.parametrize("table", ["plain", "gradient"])
@pytest.mark.parametrize(
    "env_id, highlights, config, expert_floor",
    [
        ("vlmr/Reach-v0", True, "reach_marker_progress", 0.7),
        ("vlmr/Reach-v0", False, "reach_marker_progress_matte", 0.7),
        ("vlmr/Push-v0", True, "push_marker_progress", 0.5),
        ("vlmr/Carry-v0", False, "carry_marker_progress_matte", 0.7),
    ],
)
def test_the_scripted_marker_reward_reads_the_task_frames(table, env_id, highlights, config, expert_floor):
    """The scripted rewards (the frame-reading upper bound of the RL experiments) follow the env's geometric
    progress from the top camera; the wrong object earns far less. On Reach it earns what it earns in the env;
    Push's and Carry's success pay less than 1 (a block on its zone hides part of it, and success ends the
    episode with the block up to 5 cm from the centre), hence their lower expert floors."""
    from vlm_rewards.interface import RewardRequest
    from vlm_rewards.registry import build_reward

    reward = build_reward(config)
    env = gym.make(env_id, render_mode="rgb_array", table=table, highlights=highlights, max_episode_steps=60)
    rng = np.random.default_rng(0)
    finals = {"expert": [], "wrong_object": []}
    for seed in range(6):
        for policy in finals:
            episode = scripted_episode(env, policy, seed, rng)
            truth = [info["progress"] for info in episode.infos]
            (result,) = reward.score([RewardRequest(np.stack(episode.frames), episode.infos[-1]["instruction"])])
            finals[policy].append(result.reward)
            if np.std(truth) > 0.05:
                assert np.corrcoef(result.progress, truth)[0, 1] > 0.9
            if policy == "wrong_object" and env_id == "vlmr/Reach-v0":  # the env's progress is 1 on success
                assert result.reward == pytest.approx(truth[-1], abs=0.1)
    assert min(finals["expert"]) > expert_floor
    assert np.mean(finals["wrong_object"]) < np.mean(finals["expert"]) - 0.3


def test_detour_goes_through_its_waypoint_then_acts_as_the_expert():
    env, rng = gym.make("vlmr/Carry-v0", max_episode_steps=100), np.random.default_rng(0)
    expert = make_expert(env)
    obs, _ = env.reset(seed=3)
    waypoint = start = detour_waypoint(expert, rng)
    assert np.all(np.abs(start) <= WORKSPACE)
    closest, steps_to_it = np.inf, None
    for step in range(100):
        action = scripted_action(expert, "detour", obs, rng, waypoint=waypoint)
        if waypoint is None:
            np.testing.assert_array_equal(action, scripted_action(expert, "expert", obs, rng))
        obs, _, terminated, _, info = env.step(action)
        closest = min(closest, float(np.linalg.norm(obs[0:2] - start)))
        waypoint = detour_reached(obs, waypoint)
        steps_to_it = step if waypoint is None and steps_to_it is None else steps_to_it
        if terminated:
            break
    assert closest < DETOUR_REACHED and steps_to_it is not None and info["is_success"]
    with pytest.raises(ValueError, match="detour: needs a vlmr task's expert"):
        detour_waypoint(object(), rng)


RENDER_ONE_FRAME = """
import gymnasium as gym
import vlm_rewards.robotics.tasks
env = gym.make("vlmr/Reach-v0", render_mode="rgb_array", width=16, height=16)
env.reset(seed=0)
env.render()
"""


def render_headless(**environ: str) -> subprocess.CompletedProcess:
    """A fresh interpreter (MuJoCo picks its GL backend at import) without a display or MUJOCO_GL."""
    unset = ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")
    env = {key: value for key, value in os.environ.items() if key not in unset} | environ
    return subprocess.run(
        [sys.executable, "-c", RENDER_ONE_FRAME], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(sys.platform != "linux", reason="EGL is MuJoCo's headless backend on Linux")
def test_rendering_without_mujoco_gl_defaults_to_egl():
    result = render_headless()
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.skipif(sys.platform != "linux", reason="a headless Linux machine has no display for GLFW")
def test_a_gl_backend_that_cannot_render_is_a_clear_error():
    result = render_headless(MUJOCO_GL="glfw")
    assert result.returncode != 0
    assert "RuntimeError: MuJoCo cannot render with MUJOCO_GL='glfw'" in result.stderr
    assert "egl (headless" in result.stderr
