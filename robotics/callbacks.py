"""SB3 callbacks: deliver deferred rewards into the rollout or replay buffer, log the reward-hacking
monitor, evaluate success on fixed seeds (with a video), and checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
from stable_baselines3.common.buffers import ReplayBuffer, RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback

from vlm_rewards.media import write_video
from vlm_rewards.robotics.reward_wrapper import RewardStreams

logger = logging.getLogger("vlm_rewards.robotics.rl")


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation, NaN when either side is constant (no signal to compare)."""
    if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


class RewardCallback(BaseCallback):
    """Per rollout: delivers deferred rewards into the algorithm's buffer before it trains on them,
    and logs learned vs true reward, success and their on-policy correlation.

    SB3 calls `_on_rollout_end` after a rollout's last transition is stored and before the update,
    for on- and off-policy algorithms alike. PPO: the rewards go into the rollout buffer, then returns
    and advantages are recomputed. SAC (and any replay-buffer algorithm): into the replay buffer rows
    this rollout's transitions were stored in, so every gradient step sees the rewards a sync run
    would have stored. A rollout is `train_freq` steps: set it to `reward_every` to keep the calls
    batched (a shorter one flushes, and so calls the reward, every `train_freq` steps).
    """

    def __init__(self, streams: RewardStreams, history_path: Path | None = None):
        super().__init__()
        self.streams, self.history_path = streams, history_path
        self._rollout_start = 0  # the wrapper's step count when the rollout began
        self._replay_start = 0  # the replay buffer's row of the rollout's first transition

    def _on_rollout_start(self) -> None:
        self._rollout_start = self.streams.step_count
        replay = getattr(self.model, "replay_buffer", None)
        if isinstance(replay, ReplayBuffer):
            self._replay_start = replay.pos

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.streams.deferred:
            self._deliver(self.streams.flush())
        self._log_monitor()

    def _deliver(self, rewards: list[tuple[int, int, float]]) -> None:
        rollout = getattr(self.model, "rollout_buffer", None)
        replay = getattr(self.model, "replay_buffer", None)
        if isinstance(rollout, RolloutBuffer):
            self._add(rewards, rollout.rewards, first_row=0)
            rollout.compute_returns_and_advantage(last_values=self.locals["values"], dones=self.locals["dones"])
        elif isinstance(replay, ReplayBuffer):
            self._add(rewards, replay.rewards, first_row=self._replay_start)
        else:
            raise ValueError(
                f"deferred rewards (reward_every != 1 or async_inference) need an SB3 rollout or replay buffer; "
                f"{type(self.model).__name__} has neither"
            )

    def _add(self, rewards: list[tuple[int, int, float]], table: np.ndarray, first_row: int) -> None:
        """Adds each (step, env, reward) at its transition's row of `table` ((rows, envs), a ring for replay)."""
        rows = len(table)
        for step, env, value in rewards:
            offset = step - self._rollout_start
            if not 0 <= offset < rows:
                raise RuntimeError(
                    f"deferred reward of step {step} outside this rollout (start {self._rollout_start}, "
                    f"{rows} buffer rows)"
                )
            table[(first_row + offset) % rows, env] += value

    def _log_monitor(self) -> None:
        records, self.streams.monitor = self.streams.monitor, []
        if not records:
            return
        potential = np.array([r.potential for r in records])
        learned = np.array([r.reward for r in records])
        true = np.array([r.true_reward for r in records])
        stats = {
            "reward/learned_progress": float(np.nanmean(potential)),
            "reward/learned_reward": float(np.nanmean(learned)),
            "reward/env_reward": float(np.mean([r.env_reward for r in records])),
            "reward/true_reward": float(np.nanmean(true)),
            "reward/step_success": float(np.mean([r.success for r in records])),
            "reward/corr_progress_true": correlation(potential, true),  # the reward-hacking monitor
            "reward/calls_per_step": self.streams.calls / max(self.streams.step_count, 1),
        }
        for key, value in stats.items():
            self.logger.record(key, value)
        if self.history_path is not None:
            with open(self.history_path, "a") as handle:
                handle.write(json.dumps({"timesteps": self.num_timesteps, **stats}) + "\n")


def evaluate_success(model, make_env, seeds: list[int], video_path: Path | None = None) -> float:
    """Success rate of the deterministic policy on `seeds` (one env, one episode per seed)."""
    env = make_env()
    successes, frames = [], []
    try:
        for episode, seed in enumerate(seeds):
            obs, info = env.reset(seed=seed)
            done, success = False, False
            while not done:
                if episode == 0 and video_path is not None:
                    frames.append(info["frames"][next(iter(info["frames"]))])
                action, _ = model.predict(obs, deterministic=True)
                obs, _, terminated, truncated, info = env.step(action)
                success = success or bool(info.get("is_success", False))
                done = terminated or truncated
            successes.append(success)
    finally:
        env.close()
    if video_path is not None and frames:
        video_path.parent.mkdir(parents=True, exist_ok=True)
        write_video(video_path, np.stack(frames), fps=20)
    return float(np.mean(successes))


class EvalCheckpointCallback(BaseCallback):
    """Every `eval_every` steps: success rate on fixed seeds (+ video); every `checkpoint_every`: save.

    Saves happen at the start of a rollout: after the update on the rollout before (a run resumed from
    the checkpoint loses no update), and after `RewardCallback` delivered that rollout's deferred rewards
    (a replay buffer saved mid-rollout would keep placeholder zeros).
    """

    def __init__(self, run, eval_every: int, checkpoint_every: int):
        super().__init__()
        self.run, self.eval_every, self.checkpoint_every = run, eval_every, checkpoint_every
        self._next_eval = self._next_checkpoint = 0

    def _on_training_start(self) -> None:
        self._next_eval = (self.num_timesteps // self.eval_every + 1) * self.eval_every
        self._next_checkpoint = (self.num_timesteps // self.checkpoint_every + 1) * self.checkpoint_every

    def _on_step(self) -> bool:
        if self.num_timesteps >= self._next_eval:
            self._next_eval += self.eval_every
            self.evaluate()
        return True

    def _on_rollout_start(self) -> None:
        if self.num_timesteps >= self._next_checkpoint:
            self._next_checkpoint = (self.num_timesteps // self.checkpoint_every + 1) * self.checkpoint_every
            self.run.save_checkpoint(self.model)

    def evaluate(self) -> float:
        rate = self.run.evaluate(self.model)
        self.logger.record("eval/success_rate", rate)
        return rate
