"""`vlmr rl`: SB3 PPO or SAC on a task, with reward = sparse | dense | learned | goal_image | oracle.

The run folder holds: `config.yaml`, `tensorboard/` and `progress.csv` (SB3 logger, the reward
monitor under `reward/`), `eval.jsonl` (success rate on fixed seeds per evaluation), `monitor.jsonl`,
`videos/eval_<steps>.mp4`, `learning_curve.png`, `summary.json` and `checkpoints/` (the SB3 model,
the reward normaliser's state, SAC's replay buffer, timesteps). A run restarted with the same
run_dir continues from its checkpoint (`resume: true`), its logs cut back to the checkpoint's step
(`vlm_rewards.robotics.run_logs`).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import yaml
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.callbacks import CallbackList

from vlm_rewards.interface import REFERENCE, RewardModel
from vlm_rewards.models.device import resolve_device
from vlm_rewards.registry import build_reward
from vlm_rewards.robotics.callbacks import EvalCheckpointCallback, RewardCallback, evaluate_success
from vlm_rewards.robotics.config import RLConfig
from vlm_rewards.robotics.envs import make_env, make_sb3_vec
from vlm_rewards.robotics.report import read_jsonl
from vlm_rewards.robotics.reward_wrapper import SB3VecReward
from vlm_rewards.robotics.run_logs import continue_logs

logger = logging.getLogger("vlm_rewards.robotics.rl")
ALGORITHMS = {"ppo": PPO, "sac": SAC}


def build_rl_reward(config: RLConfig) -> RewardModel | None:
    """The reward model the wrapper calls, or None: the env's own reward (sparse, dense), or the env's true
    progress as the wrapper's potential (oracle)."""
    if config.reward.source == "learned":
        return build_reward(config.reward.config)
    if config.reward.source == "goal_image":
        return build_reward("goal_pixel_progress")
    return None


class RLRun:
    """One training run in `config.run_dir`: envs, reward, model, evaluation and checkpoints."""

    def __init__(self, config: RLConfig, reward: RewardModel | None = None):
        self.config = config
        self.device = resolve_device(config.device)  # a device this machine lacks fails before anything starts
        self.dir = Path(config.run_dir)
        self.checkpoints = self.dir / "checkpoints"
        self.reward = reward if reward is not None else build_rl_reward(config)
        self.venv, self.streams = self._make_training_env()
        self.model = self._make_or_load_model()
        self.model.set_logger(continue_logs(self.dir, int(self.model.num_timesteps)))
        self.eval_history = read_jsonl(self.dir / "eval.jsonl")

    # ------------------------------------------------------------------ setup

    def _wrapper_cameras(self) -> list[str]:
        wrapper = self.config.reward.wrapper
        return [wrapper.camera, *[view for view in wrapper.views if view != wrapper.camera]]

    def _make_training_env(self):
        config = self.config
        wrapper = config.reward.wrapper
        env_reward = "dense" if config.reward.source == "dense" else "sparse"
        # the oracle goes through the wrapper with no model: the env's true progress is its potential
        uses_reward = self.reward is not None or config.reward.source == "oracle"
        cameras = self._wrapper_cameras() if uses_reward else [config.env.camera]
        # A reward that needs a reference image (the goal-image baseline, a goal-conditioned RM) gets the goal render.
        goal_image = self.reward is not None and (wrapper.goal_image or REFERENCE in self.reward.spec.requires)
        venv = make_sb3_vec(
            config.env, seed=config.seed, cameras=cameras, reward_type=env_reward, goal_image=goal_image
        )
        if not uses_reward:
            return venv, None
        wrapper_config = wrapper.model_copy(update={"goal_image": goal_image})
        venv = SB3VecReward(venv, self.reward, wrapper_config)
        return venv, venv.streams

    def _make_or_load_model(self):
        config = self.config
        algorithm = ALGORITHMS[config.algo]
        model_path = self.checkpoints / "model.zip"
        if config.resume and model_path.is_file():
            logger.info("resuming from %s", model_path)
            model = algorithm.load(model_path, env=self.venv, device=self.device)
            self._load_reward_state(model)
        else:
            params = (config.ppo if config.algo == "ppo" else config.sac).model_dump()
            net_arch = params.pop("net_arch")
            model = algorithm("MlpPolicy", self.venv, policy_kwargs={"net_arch": net_arch}, seed=config.seed,
                              device=self.device, verbose=0, **params)  # fmt: skip
        return model

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, model=None) -> None:
        model = model or self.model
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        model.save(self.checkpoints / "model.zip")
        if self.config.keep_policy_snapshots:
            shutil.copyfile(self.checkpoints / "model.zip", self.checkpoints / f"model_{model.num_timesteps:08d}.zip")
        if self.config.algo == "sac":
            model.save_replay_buffer(self.checkpoints / "replay_buffer.pkl")
        state = {"num_timesteps": int(model.num_timesteps)}
        if self.streams is not None:
            state["normalizer"] = self.streams.normalizer.state_dict()
        (self.checkpoints / "state.json").write_text(json.dumps(state, indent=2))

    def _load_reward_state(self, model) -> None:
        state = json.loads((self.checkpoints / "state.json").read_text())
        if self.streams is not None and "normalizer" in state:
            self.streams.normalizer.load_state_dict(state["normalizer"])
        replay = self.checkpoints / "replay_buffer.pkl"
        if self.config.algo == "sac" and replay.is_file():
            model.load_replay_buffer(replay)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, model=None) -> float:
        """Success rate on the fixed evaluation seeds; appends to eval.jsonl, writes a video."""
        model = model or self.model
        config = self.config
        seeds = list(range(config.eval.seed_start, config.eval.seed_start + config.eval.episodes))
        steps = int(model.num_timesteps)
        video = self.dir / "videos" / f"eval_{steps:08d}.mp4" if config.eval.video else None
        rate = evaluate_success(model, lambda: make_env(config.env), seeds, video)
        entry = {"timesteps": steps, "success_rate": rate}
        self.eval_history.append(entry)
        with open(self.dir / "eval.jsonl", "a") as handle:
            handle.write(json.dumps(entry) + "\n")
        logger.info("step %d: success rate %.2f on %d seeds", steps, rate, len(seeds))
        return rate

    # ------------------------------------------------------------------ training

    def train(self) -> dict:
        config = self.config
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        remaining = config.total_timesteps - int(self.model.num_timesteps)
        callbacks = [EvalCheckpointCallback(self, config.eval.every, config.checkpoint_every)]
        if self.streams is not None:
            callbacks.insert(0, RewardCallback(self.streams, self.dir / "monitor.jsonl"))
        if remaining > 0:
            self.model.learn(remaining, callback=CallbackList(callbacks), reset_num_timesteps=False)
        if not self.eval_history or self.eval_history[-1]["timesteps"] != self.model.num_timesteps:
            self.evaluate()
        self.save_checkpoint()
        plot_learning_curves(self.dir)
        summary = {
            "timesteps": int(self.model.num_timesteps),
            "final_success_rate": self.eval_history[-1]["success_rate"],
            "reward": config.reward.source,
            "algo": config.algo,
        }
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def close(self) -> None:
        self.venv.close()


def plot_learning_curves(run_dir: Path) -> Path:
    """learning_curve.png: eval success rate, and (learned reward runs) learned vs true reward and
    their correlation, against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = read_jsonl(run_dir / "eval.jsonl")
    monitor = read_jsonl(run_dir / "monitor.jsonl")
    panels = 2 if monitor else 1
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.5), squeeze=False)
    axes[0, 0].plot([e["timesteps"] for e in evals], [e["success_rate"] for e in evals], marker="o")
    axes[0, 0].set(xlabel="env steps", ylabel="success rate (eval seeds)", ylim=(-0.05, 1.05))
    if monitor:
        steps = [m["timesteps"] for m in monitor]
        for key in ("reward/learned_progress", "reward/true_reward", "reward/corr_progress_true"):
            axes[0, 1].plot(steps, [np.nan if m[key] is None else m[key] for m in monitor], label=key.split("/")[1])
        axes[0, 1].set(xlabel="env steps", title="reward-hacking monitor")
        axes[0, 1].legend(fontsize=7)
    figure.tight_layout()
    path = run_dir / "learning_curve.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def run_rl(config: RLConfig) -> dict:
    run = RLRun(config)
    try:
        return run.train()
    finally:
        run.close()
