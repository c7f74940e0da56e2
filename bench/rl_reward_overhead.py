"""RL reward overhead: SB3 VecEnv env steps/s with the reward in the loop vs without, per mode and env count.

A `DummyVecEnv` of `--num-envs` envs (each in `CameraFrames`, rendering its camera at `--size` px)
steps with random actions. Without the reward it pays env step + render, the floor of any pixel
reward; with it, `SB3VecReward` adds the reward calls, in the wrapper's modes:

- sync: one batched `session.append` per vector step, the rewards returned by that step;
- async: the same calls in the wrapper's worker thread, overlapping env stepping (`async_inference`);
- every_k: one call every `--every` steps carrying k frames per env (`reward_every: k`);
- relabel: calls only at episode ends and at the rollout end (`reward_every: 0`).

Rewards: a progress RM with random weights (the `trained_rm` kind's `TrainedRewardModel`, built in
memory by `bench/_common.py`'s `build_model`: `--preset tiny` or `qwen2_5_vl_3b`; nothing is
downloaded, the figures are speeds, not quality), streamed through its KV-cache session (O(1) model
work per step); and `goal_pixel_progress`, a cheap rule reward whose session reads each new frame once
(`DistanceSession`).

Every measurement resets with the same seeds and replays the same actions for `--steps` vector
steps (the reset is not timed, the final `flush()` is). Rounds interleave the measurements so that
load from other jobs hits all alike; each figure is the median over `--repeats` rounds, after one
short warm-up round. overhead = t_with_reward / t_env − 1, the reward's time next to env step +
render, in wall-clock time (what training sees; async can hide reward time behind env stepping
only where a core is free) and in this process's CPU time (all threads; steadier on a shared
machine, but it counts async's work as sync's). Every mode's rewards are checked against sync's
(exit code 1 if they differ).

    MUJOCO_GL=egl .venv/bin/python bench/rl_reward_overhead.py --threads 1
    MUJOCO_GL=egl python bench/rl_reward_overhead.py --preset qwen2_5_vl_3b --device cuda --dtype bfloat16
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, get_args

import gymnasium as gym
import numpy as np
import torch
import transformers
import typer
from rich.console import Console
from rich.table import Table
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from vlm_rewards.interface import RewardModel
from vlm_rewards.models.device import resolve_device, resolve_dtype
from vlm_rewards.models.fast_vision import fast_vision
from vlm_rewards.models.trained_reward import TrainedRewardModel
from vlm_rewards.registry import build_reward
from vlm_rewards.robotics.config import EnvConfig
from vlm_rewards.robotics.envs import make_env
from vlm_rewards.robotics.reward_wrapper import RewardWrapperConfig, SB3VecReward

if __package__:  # imported as bench.rl_reward_overhead (the tests)
    from bench._common import Preset, build_model, finish, machine
else:  # run as a script: bench/ is on sys.path
    from _common import Preset, build_model, finish, machine

MODES = ("sync", "async", "every_k", "relabel")
TARGET = 0.25  # the bound on the tiny RM's overhead on CPU
# Largest |mode − sync| reward accepted as the same: batching frames differently rounds differently.
TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
WARMUP_STEPS = 3


@dataclass
class BenchConfig:
    env: str = "vlmr/Reach-v0"
    num_envs: tuple[int, ...] = (1, 4, 8)
    steps: int = 50  # vector steps per measurement (Reach: one 50-step episode per env)
    repeats: int = 3
    size: int = 64  # rendered frame side, pixels
    max_episode_steps: int | None = None  # None: the task's time limit (Reach 50)
    every: int = 8  # k of the every_k mode
    modes: tuple[str, ...] = MODES
    preset: str = "tiny"
    device: str = "cpu"
    dtype: str = "auto"
    threads: int | None = None
    seed: int = 0


def wrapper_config(mode: str, every: int) -> RewardWrapperConfig:
    schedule = {"sync": {}, "async": {"async_inference": True}, "every_k": {"reward_every": every},
                "relabel": {"reward_every": 0}}[mode]  # fmt: skip
    return RewardWrapperConfig(goal_image=True, **schedule)


def build_rewards(config: BenchConfig, workdir: Path, max_frames: int) -> dict[str, RewardModel]:
    """The progress RM (random weights, streaming session) and the rule reward, by display name."""
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    network = build_model(config.preset, workdir, device, resolve_dtype(config.dtype, device), max_frames)
    rm_name = f"{config.preset}_rm"
    return {
        rm_name: TrainedRewardModel(network, version=f"random-{config.preset}", name=rm_name),
        "goal_pixel_progress": build_reward("goal_pixel_progress"),
    }


def make_venv(env_config: EnvConfig) -> DummyVecEnv:
    return DummyVecEnv([lambda: make_env(env_config, goal_image=True) for _ in range(env_config.num_envs)])


@dataclass
class Run:
    wall_s: float  # wall-clock seconds of the steps (and the final flush)
    cpu_s: float  # CPU seconds of this process, every thread (the reward worker, the renderer) included
    rewards: np.ndarray  # (steps, envs), deferred ones placed at their steps
    graph_replays: int = 0  # KV-cache session steps replayed as CUDA graphs
    graph_error: str | None = None  # why the session switched its CUDA graphs off, if it did


def run_steps(venv: VecEnv, steps: int, seed: int) -> Run:
    """`steps` vector steps with seeded resets and random actions, then (with a reward) `flush()`."""
    streams = getattr(venv, "streams", None)
    venv.seed(seed)
    venv.reset()
    actions = np.random.default_rng(seed).uniform(-1, 1, (steps, venv.num_envs, 2))
    rewards = np.zeros((steps, venv.num_envs))
    wall, cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        venv.step_async(actions[step])
        rewards[step] = venv.step_wait()[1]
    delivered = streams.flush() if streams is not None else []
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for step, env, value in delivered:
        rewards[step, env] += value
    return Run(wall, cpu, rewards)


def run_with_reward(base: VecEnv, reward: RewardModel, config: RewardWrapperConfig, steps: int, seed: int) -> Run:
    venv = SB3VecReward(base, reward, config)
    try:
        run = run_steps(venv, steps, seed)
        step = getattr(venv.streams.session, "_language_step", None)  # a KVCacheSession's graphed step
        if step is not None:
            run.graph_replays, run.graph_error = step.replays, step.error
        return run
    finally:
        venv.streams.close()  # not venv.close(): the base envs are reused


def measure_envs(config: BenchConfig, rewards: dict[str, RewardModel], num_envs: int) -> list[dict[str, Any]]:
    """Rows for one env count: env step + render alone, then every reward x mode (interleaved rounds)."""
    env_config = EnvConfig(id=config.env, num_envs=num_envs, width=config.size, height=config.size,
                           max_episode_steps=config.max_episode_steps)  # fmt: skip
    base = make_venv(env_config)
    configs = {(name, mode): wrapper_config(mode, config.every) for name in rewards for mode in config.modes}
    for (name, _), wrapper in configs.items():  # warm-up: first calls, lazy initialisation
        run_with_reward(base, rewards[name], wrapper, WARMUP_STEPS, config.seed)
    runs: dict[Any, list[Run]] = {key: [] for key in [None, *configs]}  # None: env step + render alone
    for _ in range(config.repeats):
        runs[None].append(run_steps(base, config.steps, config.seed))
        for (name, mode), wrapper in configs.items():
            runs[name, mode].append(run_with_reward(base, rewards[name], wrapper, config.steps, config.seed))
    base.close()
    env_wall = float(np.median([run.wall_s for run in runs[None]]))
    env_cpu = float(np.median([run.cpu_s for run in runs[None]]))
    frames = config.steps * num_envs
    rows = []
    for key, measured in runs.items():
        wall = float(np.median([run.wall_s for run in measured]))
        cpu = float(np.median([run.cpu_s for run in measured]))
        name, mode = key or (None, "env step + render")
        sync = runs.get((name, "sync"))
        rows.append(
            {
                "num_envs": num_envs,
                "reward": name,
                "mode": mode,
                "wall_s": wall,
                "cpu_s": cpu,
                "env_steps_per_s": frames / wall,
                "overhead_wall": wall / env_wall - 1,
                "overhead_cpu": cpu / env_cpu - 1,
                "graph_replays": measured[-1].graph_replays,
                "graph_error": measured[-1].graph_error,
                "max_abs_diff_vs_sync": float(np.abs(measured[-1].rewards - sync[-1].rewards).max())
                if key and sync
                else None,
            }
        )
    return rows


def run_benchmark(config: BenchConfig, workdir: Path) -> dict[str, Any]:
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    machine_info = machine(device)  # before this run adds to the load average
    episode_steps = config.max_episode_steps or gym.spec(config.env).max_episode_steps
    rewards = build_rewards(config, workdir, max_frames=episode_steps + 1)  # the reset frame, then one per step
    rows = [row for num_envs in config.num_envs for row in measure_envs(config, rewards, num_envs)]
    diffs = [row["max_abs_diff_vs_sync"] for row in rows if row.get("max_abs_diff_vs_sync") is not None]
    return {
        "config": asdict(config),
        "machine": machine_info,
        "rows": rows,
        "session_fast_paths": fast_paths(rewards[f"{config.preset}_rm"].model),
        "max_abs_diff_vs_sync": max(diffs, default=0.0),
        "modes_match_sync": all(diff <= TOLERANCES[resolve_dtype(config.dtype, device)] for diff in diffs),
    }


def fast_paths(network) -> dict[str, Any]:
    """Which of the KV-cache session's checked fast paths ran: numpy pixels per frame size (bit-equal to the
    image processor), the batched Qwen2.5-VL vision tower (and its largest gap to the tower's forward)."""
    vision = fast_vision(network.backbone)
    return {
        "pixels_exact": {f"{h}x{w}": exact for (h, w), exact in network.builder.pieces._exact.items()},
        "pixel_fallback_calls": network.builder.pieces.fallbacks,
        "vision": None if vision is None else vision.summary(),  # on/off, the check's errors and bound
    }


def print_result(result: dict[str, Any], console: Console) -> None:
    config = result["config"]
    table = Table(
        title=f"reward overhead on {config['env']} at {config['size']} px, {config['steps']} steps, "
        f"median of {config['repeats']} ({config['preset']} RM on {config['device']})"
    )
    for column in ("envs", "reward", "mode", "env steps/s", "overhead (wall)", "overhead (CPU)", "max |Δ| vs sync"):
        table.add_column(column, justify="right")
    for row in result["rows"]:
        diff = row["max_abs_diff_vs_sync"]
        overheads = ("", "") if row["reward"] is None else (f"{row['overhead_wall']:.1%}", f"{row['overhead_cpu']:.1%}")
        table.add_row(str(row["num_envs"]), row["reward"] or "-", row["mode"], f"{row['env_steps_per_s']:.1f}",
                      *overheads, "" if diff is None else f"{diff:.1e}")  # fmt: skip
    console.print(table)
    console.print(f"session fast paths: {result['session_fast_paths']}")
    rm_rows = [row for row in result["rows"] if row["reward"] == f"{config['preset']}_rm"]
    for kind in ("wall", "cpu"):
        met = [f"{row['num_envs']}x {row['mode']}" for row in rm_rows if row[f"overhead_{kind}"] <= TARGET]
        console.print(f"{config['preset']} RM overhead ({kind}) <= {TARGET:.0%}: {', '.join(met) or 'none'}")


def main(
    env: str = "vlmr/Reach-v0",
    num_envs: Annotated[str, typer.Option(help="env counts, comma-separated")] = "1,4,8",
    steps: Annotated[int, typer.Option(min=1, help="vector steps per measurement")] = 50,
    repeats: Annotated[int, typer.Option(min=1, help="interleaved rounds; figures are medians")] = 3,
    size: Annotated[int, typer.Option(min=16, help="rendered frame side in pixels")] = 64,
    every: Annotated[int, typer.Option(min=2, help="k of the every_k mode")] = 8,
    modes: Annotated[str, typer.Option(help="comma-separated; sync is the values' reference")] = ",".join(MODES),
    preset: Annotated[str, typer.Option(help="tiny | qwen2_5_vl_3b (random weights either way)")] = "tiny",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")] = "auto",
    threads: Annotated[int | None, typer.Option(help="CPU threads; 1 is steadier on a shared machine")] = None,
    seed: int = 0,
    output: Annotated[Path, typer.Option(help="where to write the JSON result")] = Path(
        "outputs/bench/rl_reward_overhead.json"
    ),
) -> None:
    """Time SB3 VecEnv steps with a reward in the loop (sync, async, every k, relabel) against without."""
    if preset not in get_args(Preset):
        raise typer.BadParameter(f"expected one of {', '.join(get_args(Preset))}", param_hint="--preset")
    chosen = tuple(modes.split(","))
    unknown = set(chosen) - set(MODES)
    if unknown:
        raise typer.BadParameter(f"unknown modes {sorted(unknown)}", param_hint="--modes")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = BenchConfig(
        env=env, num_envs=tuple(int(n) for n in num_envs.split(",")), steps=steps, repeats=repeats, size=size,
        every=every, modes=chosen, preset=preset, device=device, dtype=dtype, threads=threads, seed=seed,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as workdir:
        result = run_benchmark(config, Path(workdir))
    finish(result, output, print_result, passed=result["modes_match_sync"])


if __name__ == "__main__":
    typer.run(main)
