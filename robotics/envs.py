"""Build the tasks as single envs, gymnasium vector envs or SB3 VecEnvs, each env in `CameraFrames`."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

import gymnasium as gym
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

import vlm_rewards.robotics.tasks  # noqa: F401 - registers the vlmr/* envs
from vlm_rewards.robotics.config import VLMR_SETTINGS, EnvConfig
from vlm_rewards.robotics.frames import CameraFrames

if importlib.util.find_spec("metaworld"):  # the optional extra, in its own venv (scripts/setup_metaworld.sh)
    import vlm_rewards.robotics.metaworld  # noqa: F401 - registers the metaworld/<task> envs


def make_env(
    config: EnvConfig,
    cameras: Sequence[str] | None = None,
    reward_type: str = "sparse",
    terminate_on_success: bool = True,
    goal_image: bool = False,
) -> gym.Env:
    """One task env rendering `cameras` (default: the main camera) into its infos."""
    kwargs = {"max_episode_steps": config.max_episode_steps} if config.max_episode_steps else {}
    env = gym.make(
        config.id,
        render_mode="rgb_array",
        width=config.width,
        height=config.height,
        camera=config.camera,
        reward_type=reward_type,
        terminate_on_success=terminate_on_success,
        num_distractors=config.num_distractors,
        **({name: getattr(config, name) for name in VLMR_SETTINGS} if config.id.startswith("vlmr/") else {}),
        **({"push_distance": config.push_distance} if config.push_distance else {}),
        **({"start_angle": config.push_start_angle} if config.push_start_angle is not None else {}),
        **kwargs,
    )
    if reward_type == "sparse" and config.sparse_step_cost:
        env = StepCost(env, config.sparse_step_cost)
    return CameraFrames(env, cameras=list(cameras or [config.camera]), goal_image=goal_image)


class StepCost(gym.Wrapper):
    """Subtracts `cost` from the reward of every step that does not succeed (`info["is_success"]`)."""

    def __init__(self, env: gym.Env, cost: float):
        super().__init__(env)
        self.cost = cost

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward - self.cost * (not info["is_success"]), terminated, truncated, info


def env_factories(config: EnvConfig, **kwargs) -> list[Callable[[], gym.Env]]:
    return [lambda: make_env(config, **kwargs) for _ in range(config.num_envs)]


def make_gym_vector(config: EnvConfig, **kwargs) -> gym.vector.VectorEnv:
    factories = env_factories(config, **kwargs)
    if config.vectorization == "async":
        return gym.vector.AsyncVectorEnv(factories, context="spawn")
    return gym.vector.SyncVectorEnv(factories)


def make_sb3_vec(config: EnvConfig, seed: int = 0, **kwargs) -> VecEnv:
    """An SB3 VecEnv; each env in a `Monitor` that logs the env's own return and `is_success`."""
    factories = [
        lambda make=make: Monitor(make(), info_keywords=("is_success",)) for make in env_factories(config, **kwargs)
    ]
    venv = SubprocVecEnv(factories, start_method="spawn") if config.vectorization == "async" else DummyVecEnv(factories)
    venv.seed(seed)
    return venv
