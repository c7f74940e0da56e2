"""Meta-World adapter (robotics/metaworld.py) and the Meta-World pipeline configs. The env tests run only where
metaworld is installed, its own venv; the config checks run in the main venv too:

bash scripts/setup_metaworld.sh
MUJOCO_GL=egl .venv-metaworld/bin/python -m pytest -q tests/test_metaworld.py
"""

import importlib.util
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.config import load_job_config
from vlm_rewards.data.episodes import EpisodeDataset
from vlm_rewards.interface import RewardResult
from vlm_rewards.rewards.function import FunctionReward
from vlm_rewards.robotics.config import PipelineConfig, RLConfig
from vlm_rewards.robotics.experts import make_expert, pick_wrong_target, scripted_action
from vlm_rewards.robotics.frames import CameraFrames
from vlm_rewards.robotics.reward_wrapper import GymVectorReward, RewardWrapperConfig

HAS_METAWORLD = importlib.util.find_spec("metaworld") is not None
needs_metaworld = pytest.mark.skipif(not HAS_METAWORLD, reason="no metaworld here (scripts/setup_metaworld.sh)")
if HAS_METAWORLD:
    from vlm_rewards.robotics.metaworld import INSTRUCTIONS, TASKS, instruction_for
    from vlm_rewards.robotics.rl import RLRun
else:
    TASKS = ()

REPO = Path(__file__).resolve().parents[1]
PIPELINE_CONFIGS = {"reach": "metaworld/reach-v3", "button_press": "metaworld/button-press-v3"}
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


@needs_metaworld
def test_every_v3_task_is_registered_and_has_a_written_instruction():
    assert len(TASKS) == 50 and set(INSTRUCTIONS) == set(TASKS)
    assert all(f"metaworld/{task}" in gym.registry for task in TASKS)
    assert instruction_for("open-the-box-v4") == "open the box"  # a task newer than the table


@needs_metaworld
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


@needs_metaworld
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


@needs_metaworld
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


@needs_metaworld
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


@needs_metaworld
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


@needs_metaworld
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


@pytest.mark.parametrize("name", PIPELINE_CONFIGS)
def test_the_feasibility_pipeline_configs_load_and_follow_the_main_recipe(name):
    """Read and checked without metaworld: the pipeline config is pydantic only."""
    config = load_job_config(PipelineConfig, REPO / "configs/experiments/metaworld" / f"{name}.yaml")
    assert config.env.id == PIPELINE_CONFIGS[name] and config.env.camera == config.rl.reward.wrapper.camera == "corner"
    assert config.conditions == ["sparse", "dense", "learned", "oracle"] and config.test_seeds == [0, 1, 2]
    assert not config.tuning.candidates and not config.tuning_seeds  # the main recipe's shaping weight, untuned
    assert config.rl.reward.wrapper.scale == PipelineConfig().rl.reward.wrapper.scale
    assert config.progress_rm.model.backbone == "simworld" and config.preference_stage is None
    # Meta-World has no distractor, no second goal and no goal render
    assert config.collect.episodes["wrong_object"] == config.eval_episodes["wrong_object"] == 0  # defaults have some
    assert not config.collect.relabel_targets and not config.collect.goal_reference
    assert config.env.max_episode_steps + 1 <= config.progress_rm.model.reward.max_frames
    assert "FEASIBILITY" in (REPO / "configs/experiments/metaworld" / f"{name}.yaml").read_text().split("\n", 1)[0]


REDUCED_PIPELINE = [
    "env.num_envs=2", "env.max_episode_steps=12", "collect.episodes={expert: 2, noisy: 1, random: 1}",
    "eval_episodes={expert: 1, noisy: 1, random: 1}", "progress_rm.optim.steps=2", "progress_rm.optim.batch_size=4",
    "progress_rm.optim.warmup_steps=1", "progress_rm.eval_every=2", "progress_rm.save_every=2",
    "rl.total_timesteps=48", "rl.sac.learning_starts=16", "rl.sac.batch_size=16", "rl.eval.every=48",
    "rl.eval.episodes=1", "rl.checkpoint_every=48", "test_seeds=[0]",
]  # fmt: skip


@needs_metaworld
@pytest.mark.slow
@pytest.mark.parametrize("name", PIPELINE_CONFIGS)
def test_the_feasibility_pipeline_runs_on_metaworld_in_a_reduced_size(name, tmp_path):
    out = tmp_path / name
    config = f"configs/experiments/metaworld/{name}.yaml"
    result = CliRunner().invoke(app, ["pipeline", config, f"output_dir={out}", *REDUCED_PIPELINE])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["rl"]) == {"sparse", "dense", "learned", "oracle"} and len(summary["runs"]) == 4
    assert {"voc_expert", "reward_policy_random"} <= set(summary["reward_model"]["2x"])
    episodes = {part: json.loads((out / "data" / part / "meta.json").read_text()) for part in ("train", "eval_2x")}
    assert episodes["train"]["num_episodes"] == 4 and episodes["eval_2x"]["num_episodes"] == 3
    held_out = EpisodeDataset(out / "data" / "eval_2x")
    assert {len(episode.frames) for episode in held_out} == {13}  # 24 steps every 2nd frame, first and last
    learned = yaml.safe_load((out / "rl" / "learned_seed0" / "config.yaml").read_text())
    assert learned["env"]["id"] == PIPELINE_CONFIGS[name] and learned["reward"]["wrapper"]["camera"] == "corner"
    monitor = (out / "rl" / "learned_seed0" / "monitor.jsonl").read_text().splitlines()
    assert monitor and "reward/corr_progress_true" in json.loads(monitor[0])
    for path in ("report.md", "success_curves.png", "rm/model/reward_model.json", "eval_rm_1x/metrics.json"):
        assert (out / path).is_file(), path
