"""Reward cost in the RL loop: SB3 VecEnv steps/s without and with the reward wrapper (rule reward).

    MUJOCO_GL=egl .venv/bin/python bench/rl_reward_cost.py --steps 200 --num-envs 4

Modes: `physics` (no rendering), `render` (each env renders its camera: the floor for any pixel
reward), and the wrapper with `goal_pixel_progress` called every step (`sync`), in a worker thread
(`async`) and at rollout end (`rollout`). The ratio is (t_mode − t_render) / t_render: the reward's
cost next to env step + render. goal_pixel_progress has no cache, so its session rescores the
episode prefix (O(T) per step); a cached session (the Qwen-VL RM's) does O(1) per step.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from stable_baselines3.common.vec_env import DummyVecEnv

from robotics.config import EnvConfig
from robotics.envs import make_env
from robotics.reward_wrapper import RewardWrapperConfig, SB3VecReward
from vlm_rewards.registry import build_reward

MODES = {"sync": {}, "async": {"async_inference": True}, "rollout": {"reward_every": 0}}


def steps_per_second(venv, steps: int, flush=None) -> float:
    rng = np.random.default_rng(0)
    venv.reset()
    start = time.perf_counter()
    for _ in range(steps):
        venv.step_async(rng.uniform(-1, 1, (venv.num_envs, 2)))
        venv.step_wait()
    if flush is not None:
        flush()
    return steps * venv.num_envs / (time.perf_counter() - start)


def make_venv(config: EnvConfig, render: bool) -> DummyVecEnv:
    def make():
        env = make_env(config, goal_image=True)
        return env if render else env.env  # without CameraFrames: physics only

    return DummyVecEnv([make] * config.num_envs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="vlmr/Reach-v0")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()
    # terminate_on_success stays on, episodes last up to the task's time limit (Reach 50 steps)
    config = EnvConfig(id=args.env, num_envs=args.num_envs, width=args.size, height=args.size)
    results = {
        "physics": steps_per_second(make_venv(config, render=False), args.steps),
        "render": steps_per_second(make_venv(config, render=True), args.steps),
    }
    for mode, update in MODES.items():
        wrapper = RewardWrapperConfig(goal_image=True, **update)
        venv = SB3VecReward(make_venv(config, render=True), build_reward("goal_pixel_progress"), wrapper)
        results[mode] = steps_per_second(venv, args.steps, flush=venv.streams.flush)
        venv.close()
    report = {
        "env": args.env, "num_envs": args.num_envs, "size": args.size, "steps": args.steps,
        "env_steps_per_s": {mode: round(value, 1) for mode, value in results.items()},
        "reward_cost_ratio": {
            mode: round(results["render"] / results[mode] - 1, 3) for mode in MODES
        },  # (t_mode − t_render) / t_render
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
