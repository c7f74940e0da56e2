"""Meta-World adapter (robotics/metaworld.py). Runs only where metaworld is installed, its own venv:

bash scripts/setup_metaworld.sh
MUJOCO_GL=egl .venv-metaworld/bin/python -m pytest -q tests/test_metaworld.py
"""

import numpy as np
import pytest

pytest.importorskip("metaworld")

import gymnasium as gym  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from vlm_rewards.cli import app  # noqa: E402
from vlm_rewards.data.episodes import EpisodeDataset  # noqa: E402
from vlm_rewards.interface import RewardResult  # noqa: E402
from vlm_rewards.rewards.function import FunctionReward  # noqa: E402
from vlm_rewards.robotics.config import RLConfig  # noqa: E402
from vlm_rewards.robotics.experts import make_expert, pick_wrong_target, scripted_action  # noqa: E402
from vlm_rewards.robotics.frames import CameraFrames  # noqa: E402
from vlm_rewards.robotics.metaworld import INSTRUCTIONS, TASKS, instruction_for  # noqa: E402
from vlm_rewards.robotics.reward_wrapper import GymVectorReward, RewardWrapperConfig  # noqa: E402
from vlm_rewards.robotics.rl import RLRun  # noqa: E402

SOLVED_BY_THE_EXPERT = ("reach-v3", "push-v3", "pick-place-v3", "button-press-v3", "drawer-open-v3", "door-open-v3")


def make(task: str, **kwargs) -> gym.Env:
    return gym.make(f"metaworld/{task}", render_mode="rgb_array", width=32, height=24, **kwargs)


def run_expert(env: gym.Env, seed: int, steps: int, policy: str = "expert") -> dict:
    expert, rng = make_expert(env), np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    for _ in range(steps):
        obs, _, terminated, truncated, info = env.step(scripted_action(expert, policy, obs, rng))
        if terminated or truncated:
            break
    return info


def test_every_v3_task_is_registered_and_has_a_written_instruction():
    assert len(TASKS) == 50 and set(INSTRUCTIONS) == set(TASKS)
    assert all(f"metaworld/{task}" in gym.registry for task in TASKS)
    assert instruction_for("open-the-box-v4") == "open the box"  # a task newer than the table


@pytest.mark.parametrize("task", TASKS)
def test_every_v3_task_resets_with_a_seed_renders_and_runs_its_expert(task):
    env = make(task, camera="corner2")
    try:
        obs, info = env.reset(seed=3)
        np.testing.assert_array_equal(obs, env.reset(seed=3)[0])
        assert not np.array_equal(obs, env.reset(seed=4)[0])
        assert obs.shape == (39,) and env.action_space.shape == (4,)
        frame = env.render()
        assert frame.shape == (24, 32, 3) and frame.dtype == np.uint8 and frame.std() > 0
        assert info["instruction"] and info["instruction"] == env.unwrapped.instruction
        assert {"is_success", "progress", "dense_reward", "stage"} <= info.keys()
        info = run_expert(env, seed=0, steps=40)
        assert 0.0 <= info["progress"] <= 1.0 and info["dense_reward"] == info["progress"] - 1.0
    finally:
        env.close()


@pytest.mark.parametrize("task", SOLVED_BY_THE_EXPERT)
def test_the_expert_solves_a_sample_of_tasks(task):
    env = make(task)
    try:
        for seed in range(3):
            info = run_expert(env, seed=seed, steps=300)
            assert info["is_success"] and info["progress"] == 1.0, (task, seed)
        assert not run_expert(env, seed=0, steps=50, policy="random")["is_success"]
    finally:
        env.close()


def test_bad_input_fails_loudly():
    with pytest.raises(ValueError, match="v3 tasks"):
        gym.make("metaworld/reach-v3", task="reach-v9")
    with pytest.raises(ValueError, match="cameras"):
        make("reach-v3", camera="top")
    env = make("reach-v3")
    expert = make_expert(env)
    obs, _ = env.reset(seed=0)
    assert pick_wrong_target(expert, obs, np.random.default_rng(0)) is None
    with pytest.raises(ValueError, match="no distractor"):
        scripted_action(expert, "wrong_object", obs, np.random.default_rng(0))
    with pytest.raises(ValueError, match="render_goal"):
        CameraFrames(env, cameras=["corner"], goal_image=True)
    env.close()


def brightness(request) -> RewardResult:
    """A causal, dense toy reward: the mean brightness of each frame."""
    progress = request.frames.mean(axis=(1, 2, 3)) / 255
    return RewardResult(float(progress[-1]), progress)


def test_the_gym_vector_reward_wrapper_scores_metaworld_frames():
    reward = FunctionReward(brightness, value_range=(0.0, 1.0), dense=True, causal=True)
    factories = [lambda: CameraFrames(make("button-press-v3", camera="corner"), cameras=["corner"])] * 2
    envs = GymVectorReward(gym.vector.SyncVectorEnv(factories), reward, RewardWrapperConfig(camera="corner"))
    try:
        envs.reset(seed=0)
        for _ in range(3):
            _, rewards, _, _, infos = envs.step(envs.action_space.sample())
            assert rewards.shape == (2,) and np.all(np.isfinite(rewards))
        assert envs.streams.calls == 3 and infos["instruction"][0] == "press the button"
    finally:
        envs.close()


def test_collect_cli_writes_a_metaworld_episode_dataset(tmp_path):
    out = tmp_path / "reach"
    overrides = [f"output={out}", "env.num_envs=2", "env.width=32", "env.height=32", "env.max_episode_steps=80",
                 "episodes={expert: 2, noisy: 1, random: 1}"]  # fmt: skip
    result = CliRunner().invoke(app, ["collect", "configs/robotics/collect_metaworld_reach.yaml", *overrides])
    assert result.exit_code == 0, result.output
    dataset = EpisodeDataset(out)
    assert len(dataset) == 4 and dataset.meta["clips"] == ["frames", "view.corner2"]
    episodes = {e.policy: e for e in dataset}
    expert = episodes["expert"]
    assert expert.instruction == "reach the goal position" and expert.success
    assert expert.progress[0] == 0 and expert.progress[-1] == 1 and np.all(np.diff(expert.progress) >= 0)
    assert expert.frames.shape == (41, 32, 32, 3) and expert.views["corner2"].shape == expert.frames.shape
    assert not episodes["random"].success and np.all(episodes["random"].progress == 0)


def test_a_tiny_ppo_run_on_a_metaworld_task(tmp_path):
    env = {"id": "metaworld/reach-v3", "num_envs": 2, "width": 32, "height": 32, "camera": "corner",
           "max_episode_steps": 16}  # fmt: skip
    config = RLConfig(
        run_dir=str(tmp_path / "run"), total_timesteps=64, env=env, reward={"source": "dense"},
        ppo={"n_steps": 32, "batch_size": 32, "n_epochs": 1}, eval={"every": 64, "episodes": 1}, checkpoint_every=64,
    )  # fmt: skip
    run = RLRun(config)
    assert run.train()["timesteps"] == 64
    run.close()
    assert (tmp_path / "run/eval.jsonl").is_file() and list((tmp_path / "run/videos").glob("eval_*.mp4"))
